"""session: ``tool-tghost``, loaded by amplifier-core's own ``ModuleLoader`` into a coordinator from
amplifier-core, mounts every live tghost tool the session may use, calls them over a real embedded
broker, and follows the cluster: announced tools are mounted, withdrawn and expired ones unmounted."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from amplifier_core import ModuleLoader, ToolResult
from amplifier_core.testing import MockCoordinator, MockTool
from tghost_amplifier.session import SessionSettings

import tghost
from tghost.testing import EmbeddedBroker, LocalHost


@tghost.tool(service="kb", config=["collection"])
def lookup(question: str, collection: str) -> str:
    """Look a question up in a collection."""
    return f"{collection} says: {question}"


@tghost.tool
def failing(reason: str) -> str:
    """Always fails."""
    raise RuntimeError(reason)


@tghost.tool(group=["hr"])
def payroll(month: str) -> str:
    """Payroll of a month (HR only)."""
    return f"payroll {month}"


@tghost.tool(name="echo")
def echo_tool(text: str) -> str:
    """Echo a text."""
    return text


def kb_tools() -> list[Any]:
    return [lookup.tool("ask-staff", "Ask the staff handbook", collection="staff")]


async def mount(coordinator: MockCoordinator, **config: Any) -> Callable[[], Awaitable[None]]:
    """Load and mount tool-tghost as an Amplifier session does: amplifier-core's ModuleLoader finds
    the ``amplifier.modules`` entry point and binds the config."""
    mount_with_config = await ModuleLoader(coordinator=coordinator).load("tool-tghost", config)
    cleanup = await mount_with_config(coordinator)
    assert callable(cleanup)
    return cleanup  # type: ignore[no-any-return]


def tools(coordinator: MockCoordinator) -> dict[str, Any]:
    return dict(coordinator.get("tools") or {})


async def eventually(check: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.05)


async def test_live_tools_are_mounted_and_execute_calls_them_with_their_config(
    pulsar_broker: EmbeddedBroker, topic: str, coordinator: MockCoordinator,
) -> None:
    async with LocalHost(pulsar_broker.url, [lookup], tools=kb_tools(),
                         announce_as="kb-host", topic=topic):
        cleanup = await mount(coordinator, pulsar_url=pulsar_broker.url, topic=topic)
        try:
            ask = tools(coordinator)["ask-staff"]
            assert (ask.name, ask.description) == ("ask-staff", "Ask the staff handbook")
            assert ask.input_schema["properties"]["question"]["type"] == "string"
            assert ask.input_schema["required"] == ["question"] and ask.get_schema() == ask.input_schema
            result = await ask.execute({"question": "Where is the coffee?"})
            assert isinstance(result, ToolResult)
            assert (result.success, result.output, result.error) == (True, "staff says: Where is the coffee?", None)
        finally:
            await cleanup()
        assert "ask-staff" not in tools(coordinator)
        assert {"mount_point": "tools", "name": "ask-staff"} in coordinator.unmount_history


async def test_error_replies_and_refusals_become_failed_tool_results(
    pulsar_broker: EmbeddedBroker, topic: str, coordinator: MockCoordinator,
) -> None:
    cleanup = await mount(coordinator, pulsar_url=pulsar_broker.url, topic=topic)
    try:
        async with LocalHost(pulsar_broker.url, [failing, echo_tool], announce_as="flaky", topic=topic):
            await eventually(lambda: {"failing", "echo"} <= set(tools(coordinator)), "tools mounted")
            mounted = tools(coordinator)
            result = await mounted["failing"].execute({"reason": "out of coffee"})
            assert (result.success, result.error) == (
                False, {"type": "tool-service-error", "message": "RuntimeError: out of coffee"})
            invalid = await mounted["echo"].execute({"txt": "typo"})
            assert not invalid.success and invalid.error is not None
            assert invalid.error["type"] == "invalid-arguments" and "text" in invalid.error["message"]
        await eventually(lambda: "echo" not in tools(coordinator), "echo unmounted")
        gone = await mounted["echo"].execute({"text": "anyone?"})  # a Tool object kept after its withdrawal
        assert (gone.success, gone.error and gone.error["type"]) == (False, "no-provider")
    finally:
        await cleanup()


def test_a_calls_timeout_is_its_services_unless_the_config_gives_one() -> None:
    """``None`` goes to ``ToolDirectory.invoke``, which waits as long as the tool's service announces,
    else 30 s (tests/agent/test_calls.py checks that on the wire); it used to be a fixed 60 s."""
    assert SessionSettings.of({}).timeout is None and SessionSettings.of({"timeout": 2}).timeout == 2


async def test_tools_announced_later_are_mounted_and_withdrawn_or_expired_ones_unmounted(
    pulsar_broker: EmbeddedBroker, topic: str, coordinator: MockCoordinator,
) -> None:
    cleanup = await mount(coordinator, pulsar_url=pulsar_broker.url, topic=topic)
    try:
        assert tools(coordinator) == {}
        async with LocalHost(pulsar_broker.url, [echo_tool], announce_as="later", topic=topic):
            await eventually(lambda: "echo" in tools(coordinator), "echo mounted")
            assert (await tools(coordinator)["echo"].execute({"text": "hi"})).output == "hi"
        await eventually(lambda: "echo" not in tools(coordinator), "echo unmounted on withdraw")
        dying = LocalHost(pulsar_broker.url, [echo_tool], announce_as="dying", lease=0.6, topic=topic)
        await dying.__aenter__()
        try:
            await eventually(lambda: "echo" in tools(coordinator), "echo mounted again")
            assert dying.announcer is not None and dying.announcer._heartbeat is not None
            dying.announcer._heartbeat.cancel()  # the host "dies": no heartbeat, no withdraw
            await eventually(lambda: "echo" not in tools(coordinator), "echo unmounted on expiry")
        finally:
            dying.announcer = None
            await dying.__aexit__(None, None, None)
    finally:
        await cleanup()
    names = [entry["name"] for entry in coordinator.mount_history if entry["mount_point"] == "tools"]
    assert names == ["echo", "echo"]


async def test_groups_and_state_choose_the_tools_a_session_gets(
    pulsar_broker: EmbeddedBroker, topic: str,
) -> None:
    async with LocalHost(pulsar_broker.url, [echo_tool, payroll], announce_as="hr-host", topic=topic):
        default, hr, every = MockCoordinator(), MockCoordinator(), MockCoordinator()
        cleanups = [await mount(default, pulsar_url=pulsar_broker.url, topic=topic),
                    await mount(hr, pulsar_url=pulsar_broker.url, topic=topic, groups=["hr"]),
                    await mount(every, pulsar_url=pulsar_broker.url, topic=topic, groups=["*"])]
        try:
            assert (set(tools(default)), set(tools(hr)), set(tools(every))) == (
                {"echo"}, {"payroll"}, {"echo", "payroll"})
            assert (await tools(hr)["payroll"].execute({"month": "May"})).output == "payroll May"
        finally:
            for cleanup in cleanups:
                await cleanup()


async def test_a_tool_another_module_mounted_is_kept_not_replaced(
    pulsar_broker: EmbeddedBroker, topic: str, coordinator: MockCoordinator,
) -> None:
    local = MockTool("echo", "the local echo")
    await coordinator.mount("tools", local, name="echo")
    async with LocalHost(pulsar_broker.url, [echo_tool], announce_as="remote", topic=topic):
        cleanup = await mount(coordinator, pulsar_url=pulsar_broker.url, topic=topic)
        await cleanup()
    assert tools(coordinator) == {"echo": local}


async def test_after_cleanup_nothing_more_is_mounted(
    pulsar_broker: EmbeddedBroker, topic: str, coordinator: MockCoordinator,
) -> None:
    cleanup = await mount(coordinator, pulsar_url=pulsar_broker.url, topic=topic)
    await cleanup()
    async with LocalHost(pulsar_broker.url, [echo_tool], announce_as="too-late", topic=topic):
        await asyncio.sleep(1.0)  # time enough for a live session to have mounted it
    assert coordinator.mount_history == []


async def test_with_trusted_keys_only_tools_of_signing_hosts_are_mounted(
    pulsar_broker: EmbeddedBroker, topic: str, coordinator: MockCoordinator, tmp_path: Path,
) -> None:
    keys = tmp_path / "host"  # as a user makes them: host.key and host.pub
    subprocess.run([sys.executable, "-m", "tghost", "keygen", "--out", str(keys)], check=True, capture_output=True)
    async with (LocalHost(pulsar_broker.url, [echo_tool], announce_as="signed", topic=topic,
                          signer=tghost.Signer.from_file(keys.with_suffix(".key"))),
                LocalHost(pulsar_broker.url, [payroll], announce_as="unsigned", topic=topic)):
        cleanup = await mount(coordinator, pulsar_url=pulsar_broker.url, topic=topic, groups=["*"],
                              trusted_keys=[str(keys.with_suffix(".pub"))])
        try:
            assert set(tools(coordinator)) == {"echo"}
        finally:
            await cleanup()


async def test_a_bad_config_or_no_broker_fails_mount_with_an_error_that_says_what_to_do(
    coordinator: MockCoordinator,
) -> None:
    with pytest.raises(ValueError, match=r"tool-tghost config: pulsar_ur: Extra inputs are not permitted"):
        await mount(coordinator, pulsar_ur="pulsar://127.0.0.1:1")
    url = "pulsar://127.0.0.1:1"  # nothing listens on port 1
    with pytest.raises(ConnectionError, match=rf"no Pulsar broker answers at {url}: set 'pulsar_url'"):
        await mount(coordinator, pulsar_url=url)
    assert coordinator.mount_history == []


def test_settings_default_to_the_tghost_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TGHOST_PULSAR_URL", "pulsar://broker.example:6650")
    monkeypatch.setenv("TGHOST_DESCRIPTORS_TOPIC", "persistent://tg/config/other")
    monkeypatch.setenv("TGHOST_PULSAR_TOKEN", "jwt")
    settings = SessionSettings.of(None)
    assert (settings.pulsar_url, settings.topic, settings.pulsar.token) == (
        "pulsar://broker.example:6650", "persistent://tg/config/other", "jwt")
    assert "jwt" not in repr(settings)
    assert SessionSettings.of({"pulsar_url": "pulsar://given:6650"}).pulsar_url == "pulsar://given:6650"
