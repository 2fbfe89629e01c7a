"""reload: ``tghost run --reload`` (and ``TGHOST_RELOAD=1``) on the embedded broker. An edited plugin
is served anew while calls keep running, none refused, failed or lost (a request on its way to the
old worker at the very moment it unsubscribes is sent again by its caller: docs/protocol.md
§2.15); a directory sees no clash while the old worker hands over; an edit that breaks the plugin
keeps the previous worker serving until the next save."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

import tghost
from tests.conftest import READY, HostProcess, PluginDir
from tghost.broker import EmbeddedBroker

SOURCE = """
import tghost

@tghost.tool
def loud(text: str) -> str:
    '''Say it louder.'''
    return text.upper() + "{mark}"

@tghost.hookimpl
def tghost_register_services(register):
    register(loud)
"""

#: Callers that keep calling through the reload.
CALLERS = 4
#: Seconds after which a call counts as lost (unanswered); a lost request is sent again within about 2 s.
LOST = 10.0


async def keep_calling(directory: tghost.ToolDirectory, answers: Counter[str], stop: asyncio.Event) -> None:
    """Call ``loud`` until ``stop``; every answer (or error, as ``error: ...``) is counted."""
    while not stop.is_set():
        try:
            answers[str(await directory.invoke("loud", {"text": "hi"}, timeout=LOST))] += 1
        except tghost.ToolCallError as exc:
            answers[f"error: {exc}"] += 1
            await asyncio.sleep(0.01)  # a refusal comes at once: let the loop run


async def answered(answers: Counter[str], answer: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not answers[answer]:
        assert time.monotonic() < deadline, f"no {answer!r} within {timeout}s: {answers}"
        await asyncio.sleep(0.02)


def start(plugin_dir: PluginDir, broker: EmbeddedBroker, tmp_path: Path, host_process: Callable[..., HostProcess],
          *args: str, **env: str) -> tuple[HostProcess, dict[str, str]]:
    plugin_dir.add("loud", SOURCE.format(mark="!"))
    env = {**plugin_dir.user_env(broker.url, tmp_path / "config", "reload"), **env}
    host = host_process(*args, "--log-level", "info", env=env)
    host.wait_for(READY)
    host.wait_for("reload: watching")
    return host, env


async def test_an_edit_is_served_anew_and_no_call_running_through_the_reload_is_refused(
    pulsar_broker: EmbeddedBroker, plugin_dir: PluginDir, tmp_path: Path,
    host_process: Callable[..., HostProcess], caplog: pytest.LogCaptureFixture,
) -> None:
    host, env = await asyncio.to_thread(start, plugin_dir, pulsar_broker, tmp_path, host_process, "--reload")
    answers: Counter[str] = Counter()
    stop = asyncio.Event()
    async with tghost.ToolDirectory(tghost.PulsarSettings(pulsar_broker.url), env["TGHOST_DESCRIPTORS_TOPIC"]) as d:
        await d.wait_for("loud", 30)
        with caplog.at_level(logging.INFO, logger="tghost"):
            callers = [asyncio.create_task(keep_calling(d, answers, stop)) for _ in range(CALLERS)]
            await answered(answers, "HI!")
            (plugin_dir.root / "tghost_test_loud.py").write_text(SOURCE.format(mark="!!"))  # the save
            await answered(answers, "HI!!")
            await asyncio.to_thread(host.wait_for, r"handing over and stopping")
            await asyncio.to_thread(host.wait_for, r"stopped after \d+ request\(s\)")  # the old worker is gone
            settled = sum(answers.values())
            while sum(answers.values()) < settled + 20:  # the new worker alone serves on
                await asyncio.sleep(0.05)
            stop.set()
            await asyncio.gather(*callers)
    assert set(answers) == {"HI!", "HI!!"}, answers  # none refused, none lost (no timeout)
    assert "tghost_test_loud.py changed" in host.log
    assert not [r for r in caplog.records if "live processes" in r.getMessage()]  # the hand-over is no clash
    host.process.send_signal(signal.SIGINT)
    assert host.finish() == 0
    assert "stopped after" in host.log.rsplit("reload: serving", 1)[1]  # the new worker drained too


async def test_an_edit_that_breaks_the_plugin_keeps_the_previous_code_serving_until_the_next_save(
    pulsar_broker: EmbeddedBroker, plugin_dir: PluginDir, tmp_path: Path,
    host_process: Callable[..., HostProcess],
) -> None:
    host, env = await asyncio.to_thread(start, plugin_dir, pulsar_broker, tmp_path, host_process, TGHOST_RELOAD="1")
    source = plugin_dir.root / "tghost_test_loud.py"
    async with tghost.ToolDirectory(tghost.PulsarSettings(pulsar_broker.url), env["TGHOST_DESCRIPTORS_TOPIC"]) as d:
        await d.wait_for("loud", 30)
        source.write_text(SOURCE.format(mark="!") + "\ndef broken(:\n")
        line = await asyncio.to_thread(host.wait_for, r"plugin loud no longer loads after the change")
        assert "SyntaxError" in line and "still serving the code from before it" in line
        await asyncio.to_thread(host.wait_for, r"reload: the new worker did not start \(a plugin no longer loads\)")
        assert await d.invoke("loud", {"text": "hi"}) == "HI!"
        source.write_text(SOURCE.format(mark="?"))
        await asyncio.to_thread(host.wait_for, r"reload: serving loud 1.0")
        assert await d.invoke("loud", {"text": "hi"}) == "HI?"
    host.process.send_signal(signal.SIGTERM)
    assert host.finish() == 0
