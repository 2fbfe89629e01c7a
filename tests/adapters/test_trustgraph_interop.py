"""trustgraph sync against TrustGraph's own services: trustgraph-flow 2.11's config service
processor (its Cassandra table store replaced by an in-memory one; nothing else) and its ReAct
agent processor, which loads its tools from that config service as in a deployment, run on the
embedded broker next to ``tghost run --watch-plugins`` and ``tghost trustgraph sync``.

trustgraph-flow is heavy, so these tests run in ``tox -e trustgraph`` and skip elsewhere.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import HostProcess, LoopThread, PluginDir, live_tools, tghost_cli
from tests.operate.test_plugin_watch import FIRST, SECOND, eventually
from tghost.adapters.trustgraph.config_service import ConfigServiceClient, ConfigServiceError
from tghost.adapters.trustgraph.sync import MARKER
from tghost.broker import EmbeddedBroker
from tghost.protocol.trust import write_key_pair
from tghost.pulsar.clients import PulsarSettings
from tghost.system.net import free_port

SKIP_REASON = "trustgraph-flow 2.11 is not installed here: run 'tox -e trustgraph'"
config_service = pytest.importorskip("trustgraph.config.service.service", reason=SKIP_REASON)
config_module = pytest.importorskip("trustgraph.config.service.config", reason=SKIP_REASON)
react = pytest.importorskip("trustgraph.agent.react.service", reason=SKIP_REASON)

from trustgraph.agent.tool_filter import filter_tools_by_group_and_state, get_next_state  # noqa: E402
from trustgraph.base.request_response_client import RequestResponseClient  # noqa: E402
from trustgraph.schema import ToolServiceRequest, ToolServiceResponse  # noqa: E402

WORKSPACE = "default"

#: Config the deployment had before tghost came: a tool service and its tool, and an agent item.
FOREIGN = {
    ("tool-service", "legacy"): json.dumps({"id": "legacy", "request-queue": "non-persistent://tg/request/legacy",
                                            "response-queue": "non-persistent://tg/response/legacy"}),
    ("tool", "legacy-search"): json.dumps({"type": "tool-service", "name": "legacy-search", "service": "legacy",
                                           "description": "The deployment's own search.", "arguments": []}),
    ("agent", "additional-context"): json.dumps("Be brief."),
}


#: A plugin whose tool has seed 001 group, state and available_in_states.
GROUPED = """
import tghost

@tghost.tool
async def take_notes(text: str) -> str:
    '''Note the text down.'''
    return f"noted: {text}"

@tghost.hookimpl
def tghost_register_services(register):
    register(take_notes)

@tghost.hookimpl
def tghost_register_tools(register):
    register(take_notes.tool("research-notes", group=["research"], state="analysing",
                             available_in_states=["undefined", "research"]))
"""


class MemoryTableStore:
    """An in-memory stand-in for trustgraph-flow's Cassandra ``ConfigTableStore`` (tables/config.py):
    the same methods, the same results, rows keyed (workspace, class, key)."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str, str], str] = {}
        self.version = 0

    async def inc_version(self) -> None:
        self.version += 1

    async def get_version(self) -> int:
        return self.version

    async def put_config(self, workspace: str, cls: str, key: str, value: str) -> None:
        self.rows[(workspace, cls, key)] = value

    async def get_value(self, workspace: str, cls: str, key: str) -> str | None:
        return self.rows.get((workspace, cls, key))

    async def get_values(self, workspace: str, cls: str) -> list[list[str]]:
        return [[k, v] for (w, c, k), v in sorted(self.rows.items()) if (w, c) == (workspace, cls)]

    async def get_values_all_ws(self, cls: str) -> list[tuple[str, str, str]]:
        return [(w, k, v) for (w, c, k), v in sorted(self.rows.items()) if c == cls]

    async def get_keys_all_ws(self, cls: str) -> list[tuple[str, str]]:
        return [(w, k) for (w, c, k) in sorted(self.rows) if c == cls]

    async def get_all(self) -> list[tuple[str, str, str, str]]:
        return [(w, c, k, v) for (w, c, k), v in sorted(self.rows.items())]

    async def get_all_for_workspace(self, workspace: str) -> list[tuple[str, str, str]]:
        return [(c, k, v) for (w, c, k), v in sorted(self.rows.items()) if w == workspace]

    async def get_keys(self, workspace: str, cls: str) -> list[str]:
        return [k for (w, c, k) in sorted(self.rows) if (w, c) == (workspace, cls)]

    async def delete_key(self, workspace: str, cls: str, key: str) -> None:
        self.rows.pop((workspace, cls, key), None)

    def items(self, *types: str) -> dict[tuple[str, str], str]:
        """The workspace's items of ``types``: (type, key) -> value."""
        return {(c, k): v for (w, c, k), v in self.rows.items() if w == WORKSPACE and c in types}


class TrustGraph(LoopThread):
    """TrustGraph's config service and ReAct agent processors on the broker at ``url``, in a
    thread with their own event loop (the test blocks on subprocess logs meanwhile)."""

    def __init__(self, url: str, store: MemoryTableStore, monkeypatch: pytest.MonkeyPatch) -> None:
        super().__init__("trustgraph")
        self.url = url
        self.store = store
        # The one replaced part: Configuration builds its table store from this name.
        monkeypatch.setattr(config_module, "ConfigTableStore", lambda *args, **kwargs: self.store)
        self.config_service: Any = None
        self.agent: Any = None

    def start_config_service(self) -> None:
        async def start() -> Any:
            processor = config_service.Processor(id="config-svc", pulsar_host=self.url)
            await processor.start()
            return processor
        self.config_service = self.run(start())

    def stop_config_service(self) -> None:
        self.run(self.config_service.stop())
        self.config_service = None

    def start_agent(self) -> None:
        async def start() -> Any:
            processor = react.Processor(id="agent-manager", pulsar_host=self.url)
            await processor.start()  # loads its tools from the config service, then follows pushes
            return processor
        self.agent = self.run(start())

    def agent_tools(self) -> dict[str, Any]:
        """The tools the agent loaded for the workspace (trustgraph ``Tool`` objects by name)."""
        async def tools() -> dict[str, Any]:
            manager = self.agent.agents.get(WORKSPACE)
            return dict(manager.tools) if manager is not None else {}
        return self.run(tools())

    def invoke(self, name: str, **arguments: Any) -> str:
        """Call a loaded tool as the agent's ``ToolServiceImpl`` means to: a ``ToolServiceRequest``
        with the tool's config values and ``arguments`` on the queues the agent loaded, sent by
        trustgraph-base's own ``RequestResponseClient`` on the agent's Pulsar backend."""
        async def invoke() -> str:
            loaded = self.agent.agents[WORKSPACE].tools[name].implementation.keywords
            client = await RequestResponseClient.create(
                backend=self.agent.pubsub, request_topic=loaded["request_queue"],
                response_topic=loaded["response_queue"], request_schema=ToolServiceRequest,
                response_schema=ToolServiceResponse)
            try:
                response = await client.request(ToolServiceRequest(
                    config=json.dumps(loaded["config_values"]), arguments=json.dumps(arguments)), timeout=30)
            finally:
                await client.close()
            assert response.error is None, response.error
            return str(response.response)
        return self.run(invoke())

    def invoke_as_the_agent(self, name: str, **arguments: Any) -> str:
        """Call a loaded tool through the agent's own ``ToolServiceImpl``, as its ReAct loop does."""
        async def invoke() -> str:
            implementation = self.agent.agents[WORKSPACE].tools[name].implementation(None)
            return str(await implementation.invoke(**arguments))
        return self.run(invoke())

    def close(self) -> None:
        for processor in (self.agent, self.config_service):
            if processor is not None:
                self.run(processor.stop())
        super().close()


@pytest.fixture
def store() -> MemoryTableStore:
    """The deployment's config: the FOREIGN items, in workspace ``default``, registered as 2.11's
    IAM service registers a workspace."""
    store = MemoryTableStore()
    store.rows = {(WORKSPACE, t, k): v for (t, k), v in FOREIGN.items()}
    store.rows[("__workspaces__", "workspace", WORKSPACE)] = '{"enabled": true}'
    return store


@pytest.fixture
def trustgraph(pulsar_broker: EmbeddedBroker, store: MemoryTableStore,
               monkeypatch: pytest.MonkeyPatch) -> Iterator[TrustGraph]:
    side = TrustGraph(pulsar_broker.url, store, monkeypatch)
    side.start_config_service()
    try:
        yield side
    finally:
        side.close()


def sync_process(host_process: Callable[..., HostProcess], env: dict[str, str], *args: str) -> HostProcess:
    """A running ``tghost trustgraph sync ARGS``; its stdout is a pipe (read it once it ended)."""
    sync = host_process(*args, env=env, command=("trustgraph", "sync"), stdout=subprocess.PIPE)
    sync.wait_for("keeping workspace default")
    return sync


def ours(store: MemoryTableStore) -> dict[tuple[str, str], dict[str, Any]]:
    """The items the sync wrote, parsed."""
    parsed = {key: json.loads(value) for key, value in store.items("tool-service", "tool").items()}
    return {key: value for key, value in parsed.items() if isinstance(value, dict) and MARKER in value}


async def test_the_client_lists_gets_puts_and_deletes_in_batches_and_reports_errors(
    trustgraph: TrustGraph, store: MemoryTableStore, pulsar_broker: EmbeddedBroker,
) -> None:
    client = await PulsarSettings(pulsar_broker.url).connect()
    config = await ConfigServiceClient(client, push_queue=None, batch=2).start()
    try:
        items = {("tool", f"t{n}"): json.dumps({"n": n}) for n in range(5)}
        await config.put(WORKSPACE, items)  # three requests
        assert {key: store.rows[(WORKSPACE, *key)] for key in items} == items
        assert sorted(await config.list(WORKSPACE, "tool")) == ["legacy-search", "t0", "t1", "t2", "t3", "t4"]
        got = await config.get(WORKSPACE, [*items, ("tool", "missing")])
        assert got == {**items, ("tool", "missing"): None}
        await config.delete(WORKSPACE, list(items))
        assert await config.list(WORKSPACE, "tool") == ["legacy-search"]
        with pytest.raises(ConfigServiceError, match="bad-request: Workspace is required"):
            await config.list("", "tool")
    finally:
        await config.close()
        await client.close()


def test_sync_puts_installed_plugins_tools_where_trustgraphs_agent_loads_them_and_removes_uninstalled(
    trustgraph: TrustGraph, store: MemoryTableStore, pulsar_broker: EmbeddedBroker, plugin_dir: PluginDir,
    tmp_path: Path, host_process: Callable[..., HostProcess],
) -> None:
    trustgraph.start_agent()
    assert set(trustgraph.agent_tools()) == {"legacy-search"}
    plugin_dir.add("first", FIRST)
    plugin_dir.add("grouped", GROUPED)
    env = plugin_dir.user_env(pulsar_broker.url, tmp_path / "config", "tgsync")
    host = host_process("--watch-plugins", "--watch-interval", "0.5", env=env)
    host.wait_for("watching for plugins")
    sync = sync_process(host_process, env, "--json")
    sync.wait_for(r"put tool/first-echo \(added\) in workspace default")
    tools = eventually(lambda: (t := trustgraph.agent_tools()) and "research-notes" in t and t,
                       "the tools loaded by TrustGraph's agent")
    # Seed 001 as TrustGraph's agent applies it (its own tool_filter) agrees with tghost's directory.
    for groups, state in ((["research"], "undefined"), (["default"], None), (["research"], "analysing"),
                          (["*"], "research")):
        theirs = set(filter_tools_by_group_and_state(tools, groups, state)) - {"legacy-search"}
        args = [arg for group in groups for arg in ("--group", group)] + (["--state", state] if state else [])
        assert theirs == set(live_tools(env, *args)), (groups, state)
    assert get_next_state(tools["research-notes"], "undefined") == "analysing"
    assert trustgraph.invoke("research-notes", text="seed 001") == "noted: seed 001"

    plugin_dir.add("second", SECOND)
    sync.wait_for(r"put tool/second-shout \(added\)")
    tools = eventually(lambda: (t := trustgraph.agent_tools()) and "second-shout" in t and t,
                       "second-shout loaded by TrustGraph's agent")
    assert set(tools) == {"legacy-search", "first-echo", "take-notes", "research-notes", "second-shout"}
    shout = tools["second-shout"]
    assert shout.implementation.keywords["request_queue"] == "non-persistent://tg/request/second-shout"
    assert [a.name for a in shout.arguments] == ["text"]
    assert trustgraph.invoke("second-shout", text="from trustgraph") == "FROM TRUSTGRAPH"
    assert trustgraph.invoke("first-echo", text="round trip") == "round trip"
    # The item values are tghost export's, plus the owner mark: one code path for the shapes.
    exported = json.loads(tghost_cli("export", "--format", "trustgraph", env=env).stdout)
    assert ours(store) == {(type, key): {**value, MARKER: "tghost"}
                           for type, items in exported.items() for key, value in items.items()}

    shutil.rmtree(plugin_dir.root / "tghost_test_second-1.0.dist-info")
    sync.wait_for(r"delete tool/second-shout \(withdrawn\)")
    eventually(lambda: "second-shout" not in trustgraph.agent_tools(), "second-shout unloaded by the agent")
    assert set(ours(store)) == {("tool-service", "first-echo"), ("tool", "first-echo"), ("tool-service", "take-notes"),
                                ("tool", "take-notes"), ("tool", "research-notes")}
    assert all(store.rows[(WORKSPACE, *key)] == value for key, value in FOREIGN.items())  # untouched
    assert "legacy-search" in trustgraph.agent_tools()

    sync.process.send_signal(signal.SIGINT)
    assert sync.finish() == 0, sync.log
    assert sync.process.stdout is not None
    printed = [json.loads(line) for line in sync.process.stdout]  # --json: one object per change
    assert {"workspace": "default", "action": "put", "type": "tool", "key": "second-shout", "reason": "added"} \
        in printed
    assert printed[-2:] == [
        {"workspace": "default", "action": "delete", "type": "tool", "key": "second-shout", "reason": "withdrawn"},
        {"workspace": "default", "action": "delete", "type": "tool-service", "key": "second-shout",
         "reason": "unused"}]
    version = store.version
    again = tghost_cli("trustgraph", "sync", "--once", "--json", env=env)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["changes"] == [] and store.version == version  # a restart: no churn

    host.process.send_signal(signal.SIGINT)
    assert host.finish() == 0
    cron = tghost_cli("trustgraph", "sync", "--once", "--json", env=env)
    assert {(c["action"], c["type"], c["key"], c["reason"]) for c in json.loads(cron.stdout)["changes"]} == {
        ("delete", "tool", "first-echo", "no longer live"), ("delete", "tool-service", "first-echo", "unused"),
        ("delete", "tool", "take-notes", "no longer live"), ("delete", "tool", "research-notes", "no longer live"),
        ("delete", "tool-service", "take-notes", "unused")}
    assert ours(store) == {} and all(store.rows[(WORKSPACE, *key)] == value for key, value in FOREIGN.items())


def test_sync_once_writes_only_the_tools_of_the_groups_and_trusted_hosts_asked_for(
    trustgraph: TrustGraph, store: MemoryTableStore, pulsar_broker: EmbeddedBroker, plugin_dir: PluginDir,
    tmp_path: Path, host_process: Callable[..., HostProcess],
) -> None:
    plugin_dir.add("first", FIRST)
    plugin_dir.add("grouped", GROUPED)
    env = plugin_dir.user_env(pulsar_broker.url, tmp_path / "config", "tgfilter")
    pair = write_key_pair(tmp_path / "host")
    signed = host_process("--load-plugins", "grouped", "--signing-key", str(pair.private), env=env)
    unsigned = host_process("--load-plugins", "first", env=env)
    for host in (signed, unsigned):
        host.wait_for("announced")
    result = tghost_cli("trustgraph", "sync", "--once", "--json", "--group", "research", "--state", "undefined",
                    "--trusted-key", str(pair.public), env=env)
    assert result.returncode == 0, result.stderr
    assert {(c["action"], c["type"], c["key"]) for c in json.loads(result.stdout)["changes"]} == {
        ("put", "tool-service", "take-notes"), ("put", "tool", "research-notes")}
    assert set(ours(store)) == {("tool-service", "take-notes"), ("tool", "research-notes")}
    assert "is not registered" not in result.stderr
    elsewhere = tghost_cli("trustgraph", "sync", "--once", "--workspace", "sandbox", env=env)
    assert elsewhere.returncode == 0, elsewhere.stderr
    assert "workspace sandbox is not registered in TrustGraph" in elsewhere.stderr
    assert {(c, k) for (w, c, k) in store.rows if w == "sandbox"} == {
        ("tool-service", "first-echo"), ("tool", "first-echo"), ("tool-service", "take-notes"),
        ("tool", "take-notes"), ("tool", "research-notes")}  # written all the same
    everything = tghost_cli("trustgraph", "sync", "--once", env=env)
    assert everything.returncode == 0, everything.stderr
    assert everything.stdout.splitlines() == [  # the rest: the unsigned host's tool and the default group's
        "put tool-service/first-echo (added)", "put tool/first-echo (added)", "put tool/take-notes (added)",
        "workspace default: 3 put, 0 deleted, 0 skipped"]
    for host in (signed, unsigned):
        host.process.send_signal(signal.SIGINT)
        assert host.finish() == 0, host.log


def test_sync_survives_restarts_of_the_config_service_and_of_the_broker(
    tmp_path: Path, plugin_dir: PluginDir, host_process: Callable[..., HostProcess],
    store: MemoryTableStore, monkeypatch: pytest.MonkeyPatch,
) -> None:
    broker = EmbeddedBroker(tmp_path / "broker", free_port()).start()
    trustgraph = TrustGraph(broker.url, store, monkeypatch)
    try:
        trustgraph.start_config_service()
        plugin_dir.add("first", FIRST)
        env = plugin_dir.user_env(broker.url, tmp_path / "config", "tgfaults")
        host = host_process("--watch-plugins", "--watch-interval", "0.5", "--lease", "6", env=env)
        host.wait_for("watching for plugins")
        sync = sync_process(host_process, env, "--timeout", "2")
        sync.wait_for(r"put tool/first-echo \(added\)")

        trustgraph.stop_config_service()
        plugin_dir.add("second", SECOND)
        sync.wait_for(r"sync failed: TrustGraph's config service did not answer")
        trustgraph.start_config_service()
        sync.wait_for(r"put tool/second-shout \(added\)")
        sync.wait_for("TrustGraph's config service answers again")

        # Its table lost (a new, empty one): the config service's start-up push brings the items back.
        trustgraph.stop_config_service()
        trustgraph.store = MemoryTableStore()
        trustgraph.start_config_service()
        eventually(lambda: set(ours(trustgraph.store)) == {
            ("tool-service", "first-echo"), ("tool", "first-echo"),
            ("tool-service", "second-shout"), ("tool", "second-shout")}, "the items put back", timeout=30)

        broker.stop()
        broker.start()
        shutil.rmtree(plugin_dir.root / "tghost_test_second-1.0.dist-info")
        sync.wait_for(r"delete tool/second-shout \(withdrawn\)", timeout=60)
        eventually(lambda: set(ours(trustgraph.store)) == {("tool-service", "first-echo"), ("tool", "first-echo")},
                   "second-shout's items deleted after the broker restart", timeout=30)
        for process in (sync, host):
            process.process.send_signal(signal.SIGINT)
            assert process.finish() == 0, process.log
    finally:
        trustgraph.close()
        broker.stop()


@pytest.mark.xfail(raises=TypeError, strict=False, reason=(
    "trustgraph-flow 2.11.1: the agents' ToolServiceImpl builds trustgraph-base's ToolServiceClient with "
    "keyword arguments, but in trustgraph-base 2.11 that class is a mixin without a constructor, so every "
    "tool-service call from a TrustGraph agent fails with 'ToolServiceClient() takes no arguments'"))
def test_trustgraphs_agent_calls_a_synced_tool_itself(
    trustgraph: TrustGraph, pulsar_broker: EmbeddedBroker, plugin_dir: PluginDir, tmp_path: Path,
    host_process: Callable[..., HostProcess],
) -> None:
    plugin_dir.add("first", FIRST)
    env = plugin_dir.user_env(pulsar_broker.url, tmp_path / "config", "tgagent")
    host = host_process(env=env)
    host.wait_for("announced")
    assert tghost_cli("trustgraph", "sync", "--once", env=env).returncode == 0
    trustgraph.start_agent()
    assert "first-echo" in trustgraph.agent_tools()
    try:
        assert trustgraph.invoke_as_the_agent("first-echo", text="agent") == "agent"
    finally:
        host.process.send_signal(signal.SIGINT)
        assert host.finish() == 0
