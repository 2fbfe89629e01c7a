"""toolsets: a plugin's :class:`tghost.ToolSet` changes what a running host serves, on the embedded
broker. A change is served and announced at once (a directory sees it long before a heartbeat),
an emptied toolset is withdrawn (calls to its tools are refused, calls in flight finish or are
answered ``unavailable`` by the drain rule), a bad or taken item is reported and skipped alone,
and the toolset's problem is in ``/health``; ``tghost run --watch-plugins`` follows a toolset that
a plugin changes from its own thread, and ``tghost plugins`` lists it."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import pulsar
import pytest

import tghost
from tests.conftest import READY, HostProcess, PluginDir, live_tools, tghost_cli
from tests.operate.test_plugin_watch import FIRST, call, eventually
from tghost.broker import EmbeddedBroker
from tghost.discovery.discover import catalog_of
from tghost.operate.plugin_watch import PluginWatcher, WatchSettings
from tghost.protocol.access import AccessPolicy
from tghost.testing import LocalHost


@tghost.tool
async def first(text: str) -> str:
    """Say the text, first."""
    return f"first: {text}"


@tghost.tool
async def second(text: str) -> str:
    """Say the text, second."""
    return f"second: {text}"


@tghost.tool
def blocking(text: str) -> str:
    """A plain function: it runs in a worker thread."""
    return text


#: What the slow tool waits for, by the key a call gives.
RELEASE: dict[str, asyncio.Event] = {}


@tghost.tool
async def slow(key: str) -> str:
    """Answer once the test releases the key."""
    await RELEASE[key].wait()
    return f"released {key}"


def directory(url: str, topic: str) -> tghost.ToolDirectory:
    return tghost.ToolDirectory(tghost.PulsarSettings(url), topic)


async def test_a_change_is_served_and_announced_at_once_and_an_emptied_toolset_is_withdrawn(
    pulsar_broker: EmbeddedBroker,
) -> None:
    topic = f"persistent://tg/config/toolset-{uuid.uuid4().hex[:8]}"
    toolset = tghost.ToolSet("live")
    toolset.replace([first])  # before the host starts: what it starts with
    async with LocalHost(pulsar_broker.url, [toolset], announce_as="toolset-host", topic=topic, lease=600) as host, \
            directory(pulsar_broker.url, topic) as tools:
        await tools.wait_for("first")
        toolset.replace([first, second])
        await toolset.wait_applied()
        await tools.wait_for("second")  # a heartbeat comes every 200 s: this was announced at once
        assert await tools.invoke("second", {"text": "hi"}) == "second: hi"
        assert host.catalog.plugins[0].toolsets[0].to_json() == {
            "name": "live", "services": ["first", "second"], "tools": ["first", "second"], "problem": None,
            "errors": []}

        toolset.replace([])
        await toolset.wait_applied()
        await tools.wait_for("first", present=False)
        await tools.wait_for("second", present=False)
        with pytest.raises(tghost.ToolCallError) as refused:
            await tools.invoke("first", {"text": "hi"})
        assert refused.value.error_type in ("no-provider", "unknown-tool")
        assert host.server.endpoints == [] and host.catalog.tools == {}


async def test_a_call_in_flight_on_a_removed_service_finishes_within_the_grace_or_is_answered_unavailable(
    pulsar_broker: EmbeddedBroker,
) -> None:
    RELEASE.update(finish=asyncio.Event(), never=asyncio.Event())
    toolset = tghost.ToolSet("slow")
    toolset.replace([slow])
    async with LocalHost(pulsar_broker.url, [toolset], tghost.ServeSettings(grace=1.0)) as host:
        for key in ("finish", "never"):
            if key == "never":
                toolset.replace([slow])
                await toolset.wait_applied()
            (endpoint,) = host.server.endpoints
            calling = asyncio.create_task(host.call("slow", {"key": key}))
            while not endpoint.in_flight:
                await asyncio.sleep(0.05)
            toolset.replace([])
            await toolset.wait_applied()
            assert host.server.endpoints == []
            if key == "finish":
                RELEASE["finish"].set()
                assert await calling == "released finish"
            else:
                with pytest.raises(tghost.ToolCallError) as cut:
                    await calling
                assert cut.value.error_type == "unavailable"


async def test_a_bad_or_taken_item_is_reported_and_skipped_alone_and_the_problem_is_in_health(
    pulsar_broker: EmbeddedBroker,
) -> None:
    toolset = tghost.ToolSet("mixed")
    config = tghost.HostConfig(pulsar=tghost.PulsarSettings(pulsar_broker.url), announce=False, metrics_port=0)
    async with tghost.Host(config, [first, toolset]) as host:
        toolset.replace([second, "not a service"], [  # type: ignore[list-item]
            {"name": "first", "description": "Takes another plugin's tool name", "service": "second"},
            {"name": "no-description", "service": "second"},
            second.tool("second-again", "Say it again")])
        await toolset.wait_applied()
        assert set(host.catalog.tools) == {"first", "second", "second-again"}
        assert host.catalog.tool_origin["second-again"].name == "local"
        (report,) = host.catalog.plugins
        assert report.services == ["first", "second"] and report.status == "loaded"
        errors = report.toolsets[0].errors
        assert len(errors) == 3
        assert errors[0].startswith("register() takes a ToolService, @tghost.tool function or ToolSet, got "
                                    "'not a service'; service skipped")
        assert errors[1] == "tool name 'first' is already served by plugin 'local'; tool skipped"
        assert "tool 'no-description': field 'description'" in errors[2] and errors[2].endswith("; tool skipped")

        toolset.problem = "backend down, restarting in 4 s"
        assert host.monitor is not None
        health = host.monitor.health.snapshot()
        assert health["status"] == "degraded"
        assert health["problems"] == [f"toolset 'mixed' of plugin 'local': {line}"
                                      for line in ["backend down, restarting in 4 s", *errors]]

        toolset.problem = None
        toolset.replace([second])
        await toolset.wait_applied()
        assert host.monitor.health.snapshot()["problems"] == []


async def test_two_toolsets_never_take_each_others_names_and_a_change_may_come_from_any_thread(
    pulsar_broker: EmbeddedBroker,
) -> None:
    one, other = tghost.ToolSet("one"), tghost.ToolSet("other")
    async with LocalHost(pulsar_broker.url, [one, other]) as host:
        await asyncio.to_thread(one.replace, [first])
        await one.wait_applied()
        thread = threading.Thread(target=other.replace, args=([first, second],))
        thread.start()
        await asyncio.to_thread(thread.join)
        await other.wait_applied()
        assert [entry.services for entry in host.catalog.plugins[0].toolsets] == [["first"], ["second"]]
        assert host.catalog.plugins[0].toolsets[1].errors == [  # and its default tool with it
            "service id 'first' is already served by toolset 'one' of plugin 'local'; service skipped"]
        assert await host.call("first", {"text": "a"}) == "first: a"
        assert await host.call("second", {"text": "b"}) == "second: b"


#: A plugin whose toolset will offer a service of another plugin's id (tests.operate.test_plugin_watch.FIRST's).
TAKER = """
import tghost

@tghost.tool(name="first-echo")
async def taker(text: str) -> str:
    '''Would take another plugin's service.'''
    return "taken"

@tghost.tool
async def own(text: str) -> str:
    '''Its own tool.'''
    return "own " + text

toolset = tghost.ToolSet("taker")

@tghost.hookimpl
def tghost_register_services(register):
    register(toolset)
"""


async def test_a_name_another_plugin_serves_is_refused_and_the_rest_is_served(
    pulsar_broker: EmbeddedBroker, plugin_dir: PluginDir,
) -> None:
    plugin_dir.add("first", FIRST)
    plugin_dir.add("taker", TAKER)
    catalog = tghost.discover(plugin_dir.entry_points(), strict=False, selection=tghost.PluginSelection())
    taker = sys.modules["tghost_test_taker"]
    try:
        async with LocalHost(pulsar_broker.url, catalog) as host:
            taker.toolset.replace([taker.taker, taker.own])
            await taker.toolset.wait_applied()
            reports = {report.name: report for report in catalog.plugins}
            assert reports["taker"].toolsets[0].errors == [
                "service id 'first-echo' is already served by plugin 'first'; service skipped"]
            assert reports["taker"].services == ["own"] and reports["first"].services == ["first-echo"]
            assert await host.call("first-echo", {"text": "still first's"}) == "still first's"
            assert await host.call("own", {"text": "served"}) == "own served"
    finally:
        catalog.shutdown()


class Greeting(tghost.ToolService):
    """Answers with the greeting it was made with."""

    id = "greeting"
    description = "Greet."

    def __init__(self, word: str) -> None:
        self.word = word

    async def invoke(self, user: str, config: dict[str, object], arguments: dict[str, object]) -> str:
        return self.word


async def test_a_service_given_again_keeps_its_endpoint_and_a_new_object_of_the_same_id_takes_over(
    pulsar_broker: EmbeddedBroker,
) -> None:
    hello = Greeting("hello")
    toolset = tghost.ToolSet("greetings")
    toolset.replace([hello], [hello.tool("greet")])
    async with LocalHost(pulsar_broker.url, [toolset]) as host:
        (endpoint,) = host.server.endpoints
        toolset.replace([hello], [hello.tool("greet")])
        await toolset.wait_applied()
        assert host.server.endpoints == [endpoint]
        howdy = Greeting("howdy")
        toolset.replace([howdy], [howdy.tool("greet")])
        await toolset.wait_applied()
        assert host.server.endpoints[0] is not endpoint and host.server.endpoints[0].service is howdy
        assert await host.call("greet") == "howdy"


async def test_a_toolsets_services_run_in_the_host_process_whatever_the_hosts_isolation(
    pulsar_broker: EmbeddedBroker,
) -> None:
    toolset = tghost.ToolSet("threads")
    toolset.replace([blocking])
    isolated = tghost.tool(name="isolated", isolation="process")(lambda text: text)
    async with LocalHost(pulsar_broker.url, [toolset], tghost.ServeSettings(isolation="process")) as host:
        assert [e.executor.stats().isolation for e in host.server.endpoints] == ["thread"]
        assert await host.call("blocking", {"text": "in process"}) == "in process"
        toolset.replace([blocking, isolated])
        await toolset.wait_applied()
        assert [e.descriptor.id for e in host.server.endpoints] == ["blocking"]
        assert host.catalog.plugins[0].toolsets[0].errors == [
            "service 'isolated' asks for worker processes (isolation 'process'), but a toolset's services run in "
            "the host process: a worker process imports the plugin anew and cannot follow a live toolset; "
            "service skipped"]



class Held(Greeting):
    """Answers once the test sets its ``hold``."""

    def __init__(self, word: str) -> None:
        super().__init__(word)
        self.hold = asyncio.Event()

    async def invoke(self, user: str, config: dict[str, object], arguments: dict[str, object]) -> str:
        await self.hold.wait()
        return self.word


async def test_a_new_object_of_the_same_id_keeps_the_replay_record_its_hosts_share(
    pulsar_broker: EmbeddedBroker, tmp_path: Path,
) -> None:
    hello = Held("hello")
    toolset = tghost.ToolSet("greetings")
    toolset.replace([hello], [hello.tool("greet")])
    catalog = catalog_of([toolset])
    catalog.access = AccessPolicy.from_table({"anonymous": ["greet"]}, tmp_path)
    async with LocalHost(pulsar_broker.url, catalog) as host:
        gate, topic = host.server.gate, host.descriptors["greeting"].request_queue
        assert gate is not None
        (old,) = host.server.endpoints
        calling = asyncio.create_task(host.call("greet"))
        while not old.in_flight:
            await asyncio.sleep(0.05)
        howdy = Greeting("howdy")
        toolset.replace([howdy], [howdy.tool("greet")])
        await toolset.wait_applied()
        (new,) = host.server.endpoints
        assert new.service is howdy and gate._shared[topic] is new._replays
        hello.hold.set()
        assert await calling == "hello"  # the old endpoint drains, then closes
        assert host._toolsets is not None
        await host._toolsets.retired()
        assert gate._shared.get(topic) is new._replays


async def test_a_change_taken_before_an_uninstall_is_not_applied_after_it(pulsar_broker: EmbeddedBroker) -> None:
    toolset = tghost.ToolSet("late")
    toolset.replace([first])
    async with LocalHost(pulsar_broker.url, [toolset]) as host:
        toolsets = host._toolsets
        assert toolsets is not None
        (report,) = host.catalog.plugins
        watcher = PluginWatcher(host.catalog, host.server, None, WatchSettings(), toolsets)
        await toolset.wait_applied()
        assert toolsets._task is not None
        await toolsets._task  # the change the host started with is over
        async with toolsets.changing:  # the change waits for the uninstall that holds the lock
            uninstalling = asyncio.create_task(watcher._withdraw(report))
            await asyncio.sleep(0.1)
            toolset.replace([first, second])
            await asyncio.sleep(0.1)
        await uninstalling
        assert toolsets._task is not None
        await toolsets._task
        assert host.server.endpoints == [] and host.catalog.tools == {}


async def test_an_announcement_that_fails_leaves_the_toolset_able_to_change(
    pulsar_broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch,
) -> None:
    toolset = tghost.ToolSet("flaky")
    async with LocalHost(pulsar_broker.url, [toolset], announce_as="flaky-host", lease=600) as host:
        assert host.announcer is not None
        publish = host.announcer.publish
        failures = [pulsar.Timeout("send timed out")]

        async def once_failing(part: tghost.Catalog, status: str) -> None:
            if failures:
                raise failures.pop()
            await publish(part, status)

        monkeypatch.setattr(host.announcer, "publish", once_failing)
        toolset.replace([first])
        await asyncio.wait_for(toolset.wait_applied(), 10)
        (entry,) = host.catalog.plugins[0].toolsets
        assert entry.services == ["first"] and entry.errors[0].startswith("could not announce its latest change")
        toolset.replace([first, second])
        await asyncio.wait_for(toolset.wait_applied(), 10)
        assert entry.services == ["first", "second"] and entry.errors == []


async def test_a_tool_over_a_service_a_toolset_removes_is_withdrawn_with_it(pulsar_broker: EmbeddedBroker) -> None:
    serving, over = tghost.ToolSet("serving"), tghost.ToolSet("over")
    serving.replace([first])
    async with LocalHost(pulsar_broker.url, [serving, over]) as host:
        over.replace([], [{"name": "first-again", "description": "Say it again", "service": "first"}])
        await over.wait_applied()
        assert await host.call("first-again", {"text": "a"}) == "first: a"
        serving.replace([])
        await serving.wait_applied()
        assert "first-again" not in host.catalog.tools
        entry = host.catalog.plugins[0].toolsets[1]
        assert entry.tools == [] and entry.errors == [
            "tool 'first-again' withdrawn: its service 'first' is no longer served; the toolset's next "
            "replace() serves it again once it is back"]
        serving.replace([first])
        await serving.wait_applied()
        over.replace([], [{"name": "first-again", "description": "Say it again", "service": "first"}])
        await over.wait_applied()
        assert await host.call("first-again", {"text": "b"}) == "first: b"


async def test_calls_during_a_same_id_swap_are_never_refused_unavailable(pulsar_broker: EmbeddedBroker) -> None:
    toolset = tghost.ToolSet("swap")
    toolset.replace([Greeting("g0")], [Greeting("g0").tool("greet")])
    async with LocalHost(pulsar_broker.url, [toolset]) as host:
        errors: list[str] = []
        done = asyncio.Event()

        async def calling() -> None:
            while not done.is_set():
                try:
                    await host.call("greet")
                except tghost.ToolCallError as exc:
                    errors.append(exc.error_type)

        callers = [asyncio.create_task(calling()) for _ in range(4)]
        for i in range(1, 6):
            swapped = Greeting(f"g{i}")
            toolset.replace([swapped], [swapped.tool("greet")])
            await toolset.wait_applied()
            await asyncio.sleep(0.2)
        done.set()
        await asyncio.gather(*callers)
        # a request the broker gives the old consumer as it closes is lost (a non-persistent
        # Shared subscription's hand-off, tghost.serving.handoff): its caller times out
        assert "unavailable" not in errors

#: A plugin whose toolset serves the services named in the file $TOOLSET_FILE, changed by its
#: own thread, with a problem while the file names none.
GREEK = """
import os
import pathlib
import threading

import tghost

@tghost.tool
def alpha(text: str) -> str:
    '''Say alpha.'''
    return "alpha " + text

@tghost.tool
def beta(text: str) -> str:
    '''Say beta.'''
    return "beta " + text

toolset = tghost.ToolSet("greek")
stop = threading.Event()

def serve(names):
    toolset.replace([service for service in (alpha, beta) if service.descriptor.id in names])
    toolset.problem = None if names else "nothing to serve"

def follow(path, seen):
    while not stop.wait(0.2):
        names = path.read_text().split()
        if names != seen:
            serve(names)
            seen = names

@tghost.hookimpl
def tghost_register_services(register):
    path = pathlib.Path(os.environ["TOOLSET_FILE"])
    names = path.read_text().split()
    serve(names)
    register(toolset)
    threading.Thread(target=follow, args=(path, names), daemon=True).start()

@tghost.hookimpl
def tghost_shutdown():
    stop.set()
"""


def test_tghost_run_follows_a_toolset_changed_by_its_plugins_thread_and_tghost_plugins_lists_it(
    pulsar_broker: EmbeddedBroker, plugin_dir: PluginDir, tmp_path: Path,
    host_process: Callable[..., HostProcess],
) -> None:
    names = tmp_path / "names"
    names.write_text("alpha")
    env = {**plugin_dir.user_env(pulsar_broker.url, tmp_path / "config", "toolset"), "TOOLSET_FILE": str(names)}
    host = host_process("--watch-plugins", "--watch-interval", "0.5", "--lease", "600", env=env)
    host.wait_for(READY)
    plugin_dir.add("greek", GREEK)  # installed while the host runs
    host.wait_for(r"plugin greek \(tghost-test-greek 1.0\) installed: serving alpha")
    eventually(lambda: "alpha" in live_tools(env), "alpha announced")

    names.write_text("alpha beta")
    host.wait_for(r"plugin greek: toolset greek: serving alpha, beta; tools: alpha, beta")
    assert set(live_tools(env)) == {"alpha", "beta"}  # a 600 s lease: announced at once, not by a heartbeat
    assert call("beta", "b", env) == "beta b"

    listed = tghost_cli("plugins", env=env)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert "  toolset:     greek: alpha, beta\n" in listed.stdout
    listed = tghost_cli("plugins", "--json", env=env)
    (report,) = [r for r in json.loads(listed.stdout) if r["name"] == "greek"]
    assert report["toolsets"] == [{"name": "greek", "services": ["alpha", "beta"], "tools": ["alpha", "beta"],
                                   "problem": None, "errors": []}]

    names.write_text("")
    host.wait_for(r"plugin greek: toolset greek: serving -; tools: -")
    eventually(lambda: not live_tools(env), "the toolset's tools withdrawn")
    listed = tghost_cli("plugins", env=env)
    assert "  toolset:     greek: no tools\n  problem:     greek: nothing to serve\n" in listed.stdout

    shutil.rmtree(plugin_dir.root / "tghost_test_greek-1.0.dist-info")
    host.wait_for(r"plugin greek uninstalled")
    names.write_text("alpha")  # its thread has stopped, and the host follows the toolset no more
    host.process.send_signal(signal.SIGINT)
    assert host.finish() == 0
    assert "toolset greek: serving alpha" not in host.log.split("plugin greek uninstalled")[1]
