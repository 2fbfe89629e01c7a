"""endpoint: every reply goes through the embedded broker and is checked against the wire contract."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
from collections.abc import AsyncIterator
from typing import Any

import pulsar
import pytest

import tghost
from tests.conftest import PluginDir
from tghost.agent.client import ToolCallError
from tghost.broker import EmbeddedBroker
from tghost.discovery.discover import catalog_of, discover
from tghost.protocol import wire
from tghost.pulsar.clients import PulsarSettings
from tghost.serving.deadlines import Deadlines
from tghost.serving.request import CallRecord
from tghost.serving.server import Server
from tghost.serving.settings import ServeSettings
from tghost.testing import LocalHost, RawWire


class Recorder(tghost.ToolService):
    """Echoes its inputs; counts calls so tests can prove the plugin was (not) called."""

    id = "recorder"
    config_params = (tghost.ConfigParam(name="needed", required=True), "optional")
    allow_unknown_arguments = True  # it echoes whatever it is given

    def __init__(self) -> None:
        self.calls = 0

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> Any:
        self.calls += 1
        if arguments.get("fail"):
            raise ValueError(f"asked to fail: {arguments['fail']}")
        if arguments.get("tool_error"):
            raise tghost.ToolError("no such row", "not-found")
        return {"user": user, "config": config, "arguments": arguments}


@tghost.tool(timeout=0.3)
async def sleepy(seconds: float) -> str:
    """Sleep, then answer."""
    await asyncio.sleep(seconds)
    return "awake"


@tghost.tool
async def counting(n: int, fail_at: int = -1) -> AsyncIterator[str]:
    """Stream n chunks; raise at chunk fail_at."""
    for i in range(n):
        if i == fail_at:
            raise RuntimeError(f"broke at {i}")
        yield f"chunk-{i};"


@tghost.tool
def sync_counting(n: int) -> Any:
    """A plain generator streams too."""
    yield from (f"s{i}" for i in range(n))


def catalog_parts(services: list[tghost.ToolService]) -> tuple[Any, Any]:
    catalog = catalog_of(services)
    return catalog.services, catalog.descriptors


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


async def test_reply_echoes_the_id_and_has_exactly_the_contract_fields(
    pulsar_broker: EmbeddedBroker, recorder: Recorder
) -> None:
    async with LocalHost(pulsar_broker.url, [recorder]), RawWire(pulsar_broker.url, recorder.descriptor) as raw:
        request = wire.encode_request("alice", {"needed": 1}, {"q": "x"})
        await raw.send(request, {"id": "req-42"})
        [(properties, body)] = await raw.replies("req-42")
    assert properties["id"] == "req-42"
    assert set(body) == {"error", "response", "end_of_stream"}
    assert body["error"] is None and body["end_of_stream"] is True
    # A non-string result is sent as json.dumps(result).
    assert json.loads(body["response"]) == {"user": "alice", "config": {"needed": 1}, "arguments": {"q": "x"}}


async def test_exception_in_invoke_is_a_tool_service_error(pulsar_broker: EmbeddedBroker, recorder: Recorder) -> None:
    async with LocalHost(pulsar_broker.url, [recorder]) as host:
        with pytest.raises(ToolCallError) as info:
            await host.call("recorder", {"fail": "please"}, {"needed": 1})
    assert info.value.error_type == "tool-service-error"
    assert "asked to fail: please" in info.value.message


async def test_tool_error_keeps_the_plugins_error_type(pulsar_broker: EmbeddedBroker, recorder: Recorder) -> None:
    async with LocalHost(pulsar_broker.url, [recorder]) as host:
        with pytest.raises(ToolCallError) as info:
            await host.call("recorder", {"tool_error": True}, {"needed": 1})
    assert (info.value.error_type, info.value.message) == ("not-found", "no such row")


async def test_missing_required_config_is_answered_without_calling_the_plugin(
    pulsar_broker: EmbeddedBroker, recorder: Recorder
) -> None:
    async with LocalHost(pulsar_broker.url, [recorder]) as host:
        with pytest.raises(ToolCallError) as info:
            await host.call("recorder", {"q": 1}, {"optional": "x"})
    assert info.value.error_type == "missing-config" and "needed" in info.value.message
    assert recorder.calls == 0


@pytest.mark.parametrize(
    "payload",
    [b"not json", b"[]", b'{"arguments": "[1, 2]"}', b'{"config": {"needed": 1}}', b'{"user": ["x"]}'],
)
async def test_malformed_request_with_an_id_gets_bad_request(
    pulsar_broker: EmbeddedBroker, recorder: Recorder, payload: bytes
) -> None:
    async with LocalHost(pulsar_broker.url, [recorder]), RawWire(pulsar_broker.url, recorder.descriptor) as raw:
        await raw.send(payload, {"id": "bad-1"})
        [(properties, body)] = await raw.replies("bad-1")
    assert properties["id"] == "bad-1"
    assert body["error"]["type"] == "bad-request" and body["end_of_stream"] is True
    assert recorder.calls == 0


async def test_request_without_id_is_counted_acknowledged_and_not_answered(
    pulsar_broker: EmbeddedBroker, recorder: Recorder
) -> None:
    async with LocalHost(pulsar_broker.url, [recorder]) as host, RawWire(pulsar_broker.url, recorder.descriptor) as raw:
        await raw.send(b"garbage without id", {})
        await raw.send(wire.encode_request("u", {"needed": 1}, {}), {})
        await raw.send(wire.encode_request("u", {"needed": 1}, {"after": True}), {"id": "next"})
        [(_, body)] = await raw.replies("next")  # the only reply is the one with an id
        [endpoint] = host.server.endpoints
    assert json.loads(body["response"])["arguments"] == {"after": True}
    assert endpoint.counters["unanswerable"] == 2
    assert recorder.calls == 1


async def test_a_flood_of_requests_without_id_is_summarised_in_the_log_not_logged_one_by_one(
    pulsar_broker: EmbeddedBroker, recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="tghost"):
        async with LocalHost(pulsar_broker.url, [recorder]) as host, \
                RawWire(pulsar_broker.url, recorder.descriptor) as raw:
            for _ in range(200):
                await raw.send(b"garbage without id", {})
            await raw.send(wire.encode_request("u", {"needed": 1}, {}), {"id": "next"})
            assert len(await raw.replies("next")) == 1  # the host still answers
            [endpoint] = host.server.endpoints
    assert endpoint.counters["unanswerable"] == 200
    summaries = [r.getMessage() for r in caplog.records if "cannot be answered" in r.getMessage()]
    assert len(summaries) == 2, summaries  # the first at once, the rest when the host stops
    assert sum(int(re.search(r"dropped (\d+) request", line)[1]) for line in summaries) == 200  # type: ignore[index]
    assert "no 'id' property" in summaries[0] and "docs/protocol.md §2.3" in summaries[0]


async def test_a_slow_call_is_cancelled_and_answered_timeout_per_service_override(
    pulsar_broker: EmbeddedBroker,
) -> None:
    # The host default is 30 s; the service descriptor's 0.3 s wins.
    async with LocalHost(pulsar_broker.url, [sleepy], ServeSettings(timeout=30)) as host:
        assert await host.call("sleepy", {"seconds": 0}) == "awake"
        with pytest.raises(ToolCallError) as info:
            await host.call("sleepy", {"seconds": 5})
    assert info.value.error_type == "timeout" and "0.3s" in info.value.message


async def test_host_default_timeout_applies_when_the_service_sets_none(pulsar_broker: EmbeddedBroker) -> None:
    @tghost.tool
    async def slow_default() -> str:
        await asyncio.sleep(5)
        return "late"

    async with LocalHost(pulsar_broker.url, [slow_default], ServeSettings(timeout=0.2)) as host:
        with pytest.raises(ToolCallError) as info:
            await host.call("slow-default")
    assert info.value.error_type == "timeout" and "0.2s" in info.value.message


async def test_async_generator_streams_chunks_then_an_end_of_stream(pulsar_broker: EmbeddedBroker) -> None:
    async with LocalHost(pulsar_broker.url, [counting]), RawWire(pulsar_broker.url, counting.descriptor) as raw:
        await raw.send(wire.encode_request("u", {}, {"n": 3}), {"id": "s1"})
        replies = await raw.replies("s1")
    assert [body["response"] for _, body in replies] == ["chunk-0;", "chunk-1;", "chunk-2;", ""]
    assert [body["end_of_stream"] for _, body in replies] == [False, False, False, True]
    assert {props["id"] for props, _ in replies} == {"s1"}


async def test_an_error_mid_stream_ends_the_stream_with_an_error(pulsar_broker: EmbeddedBroker) -> None:
    async with LocalHost(pulsar_broker.url, [counting]), RawWire(pulsar_broker.url, counting.descriptor) as raw:
        await raw.send(wire.encode_request("u", {}, {"n": 5, "fail_at": 2}), {"id": "s2"})
        replies = await raw.replies("s2")
    assert [body["response"] for _, body in replies[:2]] == ["chunk-0;", "chunk-1;"]
    assert replies[-1][1]["error"] == {"type": "tool-service-error", "message": "RuntimeError: broke at 2",
                                       "request-id": "s2"}
    assert len(replies) == 3


async def test_a_plain_generator_streams_from_a_worker_thread(pulsar_broker: EmbeddedBroker) -> None:
    async with LocalHost(pulsar_broker.url, [sync_counting]) as host:
        chunks = [chunk async for chunk in host.stream("sync-counting", {"n": 4})]
    assert chunks == ["s0", "s1", "s2", "s3"]


async def test_invalid_arguments_are_answered_naming_the_field(pulsar_broker: EmbeddedBroker) -> None:
    async with LocalHost(pulsar_broker.url, [counting]) as host:
        with pytest.raises(ToolCallError) as info:
            await host.call("counting", {"n": "many"})
    assert info.value.error_type == "invalid-arguments" and "argument 'n'" in info.value.message


async def test_sync_plugins_run_in_a_thread_and_never_block_other_services(pulsar_broker: EmbeddedBroker) -> None:
    release = threading.Event()

    @tghost.tool
    def blocking() -> str:
        """Blocks its thread until released."""
        return "released" if release.wait(20) else "never released"

    @tghost.tool
    async def quick() -> str:
        return "quick"

    async with LocalHost(pulsar_broker.url, [blocking, quick]) as host:
        blocked = asyncio.create_task(host.call("blocking", timeout=30))
        assert await host.call("quick") == "quick"  # answered while 'blocking' still holds its thread
        assert not blocked.done()
        release.set()
        assert await blocked == "released"


async def test_concurrency_bound_limits_calls_in_flight(pulsar_broker: EmbeddedBroker) -> None:
    gate = asyncio.Event()
    running = {"now": 0, "max": 0}

    @tghost.tool(max_concurrency=2)
    async def gated() -> str:
        running["now"] += 1
        running["max"] = max(running["max"], running["now"])
        await gate.wait()
        running["now"] -= 1
        return "done"

    async with LocalHost(pulsar_broker.url, [gated]) as host:
        calls = [asyncio.create_task(host.call("gated")) for _ in range(6)]
        while sum(w.in_flight for w in host.server.endpoints) < 6:
            await asyncio.sleep(0.01)
        assert running["now"] == 2
        gate.set()
        assert await asyncio.gather(*calls) == ["done"] * 6
    assert running["max"] == 2


async def test_two_hosts_share_one_service_through_the_shared_subscription(pulsar_broker: EmbeddedBroker) -> None:
    @tghost.tool(service="shared-echo")
    async def echo(text: str) -> str:
        return text

    async with LocalHost(pulsar_broker.url, [echo]) as first, LocalHost(pulsar_broker.url, [echo]) as second:
        [w1], [w2] = first.server.endpoints, second.server.endpoints
        assert w1.subscription == w2.subscription == "shared-echo-request"
        answers = await asyncio.gather(*(first.call("shared-echo", {"text": str(i)}) for i in range(40)))
        assert answers == [str(i) for i in range(40)]
        assert w1.counters["received"] > 0 and w2.counters["received"] > 0
        assert w1.counters["received"] + w2.counters["received"] == 40


async def test_graceful_stop_finishes_in_flight_calls(pulsar_broker: EmbeddedBroker) -> None:
    @tghost.tool
    async def unhurried() -> str:
        await asyncio.sleep(0.5)
        return "finished"

    async with LocalHost(pulsar_broker.url, [unhurried]) as host:
        call = asyncio.create_task(host.call("unhurried"))
        while host.server.endpoints[0].in_flight == 0:
            await asyncio.sleep(0.01)
        cancelled = await host.server.stop(grace=5)
        assert await call == "finished"
    assert cancelled == 0


async def test_listeners_get_one_record_per_request_with_its_status_and_user(
    pulsar_broker: EmbeddedBroker, recorder: Recorder
) -> None:
    records: list[CallRecord] = []
    server = Server(*catalog_parts([recorder]), listeners=[records.append, lambda r: 1 / 0])  # a bad one too
    client = await PulsarSettings(pulsar_broker.url).connect()
    await server.start(client)
    try:
        async with RawWire(pulsar_broker.url, recorder.descriptor) as raw:
            await raw.request({"q": 1}, config={"needed": 1}, user="alice")
            await raw.request({}, config={})  # lacks the required config param
            await raw.send(b"no id", {})
            await raw.request({"fail": "x"}, config={"needed": 1})
    finally:
        await server.stop()
        await client.close()
    told = {r.status: r for r in records}  # each told by the thread that answered it: in any order
    assert sorted((r.status, r.user or "") for r in records) == [
        ("missing-config", "test"), ("ok", "alice"), ("tool-service-error", "test"), ("unanswerable", "")]
    assert told["unanswerable"].user is None and all(r.service == "recorder" and r.duration > 0 for r in records)
    assert told["ok"].request_id is not None and told["unanswerable"].request_id is None


async def test_a_timed_out_call_is_counted_stuck_before_its_caller_hears(
    pulsar_broker: EmbeddedBroker, inline_calls: bool,
) -> None:
    """So a caller that hears ``timeout`` and calls again at once meets the service as it is:
    with all its threads (twice its max concurrency) stuck, it is refused ``overloaded``."""
    release = threading.Event()
    stuck_when_told: list[int] = []

    @tghost.tool(timeout=0.2, max_concurrency=1)
    def held() -> str:
        release.wait(30)
        return "released"

    async with LocalHost(pulsar_broker.url, [held], listeners=[
            lambda _: stuck_when_told.append(executor.stats().stuck)]) as host:  # told right after the reply
        [executor] = [endpoint.executor for endpoint in host.server.endpoints]
        errors = []
        try:
            for _ in range(3):
                with pytest.raises(ToolCallError) as info:
                    await host.call("held", timeout=10)
                errors.append(info.value.error_type)
        finally:
            release.set()
    assert errors == [wire.TIMEOUT, wire.TIMEOUT, wire.OVERLOADED]
    assert stuck_when_told[:2] == [1, 2]  # (the third is told after its reply: the threads may be released by then)


async def test_a_stuck_sync_service_uses_up_only_its_own_threads(pulsar_broker: EmbeddedBroker) -> None:
    release = threading.Event()
    threads: dict[str, list[str]] = {"stuck": [], "steady": []}

    @tghost.tool(max_concurrency=2, timeout=0.2)
    def stuck() -> str:
        """Never returns until the test ends."""
        threads["stuck"].append(threading.current_thread().name)
        return "released" if release.wait(30) else "never released"

    @tghost.tool(max_concurrency=2)
    def steady(n: int) -> int:
        threads["steady"].append(threading.current_thread().name)
        return n * 2

    async with LocalHost(pulsar_broker.url, [stuck, steady]) as host:
        try:
            errors = []
            for _ in range(6):  # more calls than it may leave stuck: each is answered at once
                with pytest.raises(ToolCallError) as info:
                    await host.call("stuck")
                errors.append(info.value.error_type)
            # Four ran and timed out, each freeing its slot; the next two found all the service's
            # threads (twice its max concurrency) stuck and never started.
            assert errors == ["timeout"] * 4 + ["overloaded"] * 2
            answers = await asyncio.gather(*(host.call("steady", {"n": i}) for i in range(10)))
            assert answers == [str(2 * i) for i in range(10)]
        finally:
            release.set()
    # The four stuck threads were stuck's own; the later calls never got one, and steady never waited.
    assert len(threads["stuck"]) == 4 and all(t.startswith("tghost-stuck") for t in threads["stuck"])
    assert all(t.startswith("tghost-steady") for t in threads["steady"])


async def test_a_request_over_the_payload_limit_is_a_bad_request_and_not_decoded(
    pulsar_broker: EmbeddedBroker, recorder: Recorder
) -> None:
    async with (
        LocalHost(pulsar_broker.url, [recorder], ServeSettings(max_payload=1000)),
        RawWire(pulsar_broker.url, recorder.descriptor) as raw,
    ):
        big = wire.encode_request("u", {"needed": 1}, {"text": "x" * 1000})
        await raw.send(big, {"id": "big"})
        [(_, body)] = await raw.replies("big")
        assert recorder.calls == 0
        [(_, small)] = await raw.request({"text": "x" * 10}, config={"needed": 1})
    assert body["error"]["type"] == "bad-request"
    assert f"{len(big)} bytes" in body["error"]["message"] and "1000 bytes" in body["error"]["message"]
    assert "--max-payload" in body["error"]["message"]
    assert small["error"] is None and recorder.calls == 1


class Geo(tghost.ToolService):
    """A class-based service with a JSON Schema for its arguments."""

    id = "geo"
    input_schema = {  # noqa: RUF012 - the plugin API takes a plain dict
        "type": "object",
        "properties": {"city": {"type": "string"},
                       "where": {"type": "object", "properties": {"lat": {"type": "number"}}}},
        "required": ["city"],
    }

    def __init__(self) -> None:
        self.calls = 0

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> Any:
        self.calls += 1
        return arguments["city"]


@pytest.mark.parametrize(
    ("arguments", "named"),
    [({"city": 5}, "argument 'city'"), ({"city": "Oslo", "where": {"lat": "north"}}, "argument 'where.lat'"),
     ({}, "argument 'city': required, but not given"), ({"city": "Oslo", "country": "NO"}, "argument 'country'")],
)
async def test_a_class_service_with_an_input_schema_gets_its_arguments_checked_naming_the_field(
    pulsar_broker: EmbeddedBroker, arguments: dict[str, Any], named: str
) -> None:
    geo = Geo()
    async with LocalHost(pulsar_broker.url, [geo]) as host:
        with pytest.raises(ToolCallError) as info:
            await host.call("geo", arguments)
        assert geo.calls == 0
        assert await host.call("geo", {"city": "Oslo", "where": {"lat": 59.9}}) == "Oslo"
    assert info.value.error_type == "invalid-arguments" and named in info.value.message


def test_an_invalid_input_schema_fails_at_registration_not_at_the_first_call() -> None:
    class Broken(Geo):
        id = "broken"
        input_schema = {"type": "no-such-type"}  # noqa: RUF012

    with pytest.raises(tghost.DescriptorError, match=r"^service 'broken': field 'input_schema': not a valid JSON"):
        catalog_of([Broken()])


async def test_a_denied_call_is_not_allowed_with_the_reason_and_never_invoked(
    pulsar_broker: EmbeddedBroker, recorder: Recorder
) -> None:
    records: list[CallRecord] = []

    def only_alice(user: str, service: str) -> str | None:  # accepts fewer arguments than the hook offers
        return None if user == "alice" else f"{user} may not call {service}"

    catalog = catalog_of([recorder], authorize=only_alice)
    server = Server(catalog.services, catalog.descriptors, listeners=[records.append], authorize=catalog.authorize)
    client = await PulsarSettings(pulsar_broker.url).connect()
    await server.start(client)
    try:
        async with RawWire(pulsar_broker.url, recorder.descriptor) as raw:
            [(denied_properties, denied)] = await raw.request({"q": "secret"}, config={"needed": 1}, user="bob")
            [(_, allowed)] = await raw.request({"q": 1}, config={"needed": 1}, user="alice")
    finally:
        await server.stop()
        await client.close()
    assert denied["error"] == {"type": "not-allowed", "message": "bob may not call recorder",
                               "request-id": denied_properties["id"]}
    assert allowed["error"] is None and recorder.calls == 1
    assert sorted(((r.status, r.user, r.arguments) for r in records), key=lambda told: told[0]) == [
        ("not-allowed", "bob", {"q": "secret"}), ("ok", "alice", {"q": 1})]  # each told by its thread: any order


async def test_an_authorize_check_that_raises_denies_and_is_logged_with_its_plugin(
    pulsar_broker: EmbeddedBroker, recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(user: str) -> bool:
        raise KeyError(user)

    catalog = catalog_of([recorder], name="guard", authorize=broken)
    async with LocalHost(pulsar_broker.url, catalog) as host:
        with pytest.raises(ToolCallError) as info:
            await host.call("recorder", {}, {"needed": 1})
    assert info.value.error_type == "not-allowed" and "guard" in info.value.message
    assert recorder.calls == 0
    assert any("plugin 'guard'" in r.getMessage() and r.exc_info for r in caplog.records)


def test_plugins_authorize_hooks_combine_and_any_deny_wins(plugin_dir: PluginDir) -> None:
    plugin_dir.add("echo", """
        import tghost

        @tghost.tool
        def echo(text: str) -> str:
            return text

        @tghost.hookimpl
        def tghost_register_services(register):
            register(echo)
    """)
    plugin_dir.add("allow-all", """
        import tghost

        @tghost.hookimpl
        def tghost_authorize(service):
            return True
    """)
    plugin_dir.add("no-mallory", """
        import tghost

        @tghost.hookimpl
        def tghost_authorize(user, service, config, arguments):
            return False if user == "mallory" else None
    """)
    catalog = discover(plugin_dir.entry_points())
    assert catalog.authorize is not None
    assert catalog.authorize("alice", "echo", {}, {"text": "hi"}) is None
    assert catalog.authorize("mallory", "echo", {}, {"text": "hi"}) == "denied by plugin 'no-mallory'"
    without = [ep for ep in plugin_dir.entry_points() if ep.name == "echo"]
    assert discover(without).authorize is None  # no plugin implements the hook: nothing to call per request


async def test_a_persistent_request_redelivered_past_the_limit_is_answered_and_not_invoked(
    pulsar_broker: EmbeddedBroker,
) -> None:
    calls: list[str] = []

    @tghost.tool(persistent=True)
    def fragile(text: str) -> str:
        calls.append(text)
        return text

    descriptor = fragile.descriptor
    assert descriptor.request_queue == "persistent://tg/request/fragile"
    assert descriptor.response_queue == "non-persistent://tg/response/fragile"
    subscription = "fragile-request"
    async with RawWire(pulsar_broker.url, descriptor) as raw:
        # Two "hosts" take the request on the service's subscription and go away without acknowledging.
        dying = await raw.client.subscribe(descriptor.request_queue, subscription,
                                           consumer_type=pulsar.ConsumerType.Shared)
        await raw.send(wire.encode_request("u", {}, {"text": "poison"}), {"id": "poison"})
        for attempt in (1, 2):
            taken = await asyncio.wait_for(dying.receive(), 10)
            assert taken.properties()["id"] == "poison" and taken.redelivery_count() == attempt - 1
            await dying.close()
            if attempt == 1:
                dying = await raw.client.subscribe(descriptor.request_queue, subscription,
                                                   consumer_type=pulsar.ConsumerType.Shared)
        async with LocalHost(pulsar_broker.url, [fragile], ServeSettings(max_redeliveries=1)) as host:
            [(_, body)] = await raw.replies("poison")
            assert body["error"]["type"] == "redelivery-limit" and "3 times" in body["error"]["message"]
            assert await host.call("fragile", {"text": "fine"}) == "fine"  # the host serves on
    assert calls == ["fine"]


async def test_a_persistent_request_delivered_beyond_even_the_answer_goes_to_the_dead_letter_topic(
    pulsar_broker: EmbeddedBroker,
) -> None:
    calls: list[str] = []

    @tghost.tool(persistent=True)
    def doomed(text: str) -> str:
        calls.append(text)
        return text

    descriptor = doomed.descriptor
    async with RawWire(pulsar_broker.url, descriptor) as raw:
        dead_letters = await raw.client.subscribe(f"{descriptor.request_queue}-doomed-request-DLQ", "inspect",
                                                  initial_position=pulsar.InitialPosition.Earliest)
        dying = await raw.client.subscribe(descriptor.request_queue, "doomed-request",
                                           consumer_type=pulsar.ConsumerType.Shared)
        await raw.send(wire.encode_request("u", {}, {"text": "poison"}), {"id": "doomed"})
        for attempt in (1, 2, 3):  # three hosts die holding it: delivered 3 times, so redelivered twice
            await asyncio.wait_for(dying.receive(), 10)
            await dying.close()
            if attempt < 3:
                dying = await raw.client.subscribe(descriptor.request_queue, "doomed-request",
                                                   consumer_type=pulsar.ConsumerType.Shared)
        async with LocalHost(pulsar_broker.url, [doomed], ServeSettings(max_redeliveries=0)) as host:
            dead = await asyncio.wait_for(dead_letters.receive(), 10)
            assert await host.call("doomed", {"text": "fine"}) == "fine"
    assert dead.properties()["id"] == "doomed" and json.loads(dead.data())["arguments"] == '{"text": "poison"}'
    assert calls == ["fine"]


async def test_deadlines_cancel_each_late_call_once_and_tell_its_timeout_from_a_shutdown() -> None:
    outcomes: dict[str, str] = {}

    async def call(clock: Deadlines, name: str, seconds: float) -> None:
        task: asyncio.Task[None] = asyncio.current_task()  # type: ignore[assignment]
        clock.start(task)
        try:
            try:
                await asyncio.sleep(seconds)
            finally:
                clock.stop(task)
            outcomes[name] = "finished"
        except asyncio.CancelledError:
            outcomes[name] = "timeout" if clock.expired(task) else "cut off"

    clock = Deadlines(1.0)  # far past the quick ones, even on a loaded machine
    await asyncio.gather(call(clock, "quick", 0.01), call(clock, "slow", 5), call(clock, "later-quick", 0.05),
                         call(clock, "slower", 5))
    assert outcomes == {"quick": "finished", "slow": "timeout", "later-quick": "finished", "slower": "timeout"}

    # a shutdown's cancellation on top of the timeout's is not a timeout
    due_now = Deadlines(0.0)
    both = asyncio.create_task(call(due_now, "both", 5))
    await asyncio.sleep(0)  # it started its clock and waits
    due_now._sweep(asyncio.get_running_loop())  # its deadline: cancelled once...
    both.cancel()  # ...and by the shutdown, before it runs again
    await both
    assert outcomes["both"] == "cut off"


@tghost.tool(service="huge")
def huge_plain(stream: bool = False) -> Any:
    """A result (or a chunk) over Pulsar's message limit, from a plain def."""
    big = "x" * (wire.MAX_MESSAGE + 1)
    return (chunk for chunk in ("fits", big)) if stream else big


@tghost.tool(service="huge")
async def huge_async(stream: bool = False) -> Any:
    """The same from an async def."""
    big = "x" * (wire.MAX_MESSAGE + 1)
    if not stream:
        return big

    async def chunks() -> AsyncIterator[str]:
        yield "fits"
        yield big

    return chunks()


@pytest.mark.parametrize("service", [huge_plain, huge_async], ids=["def", "async def"])
@pytest.mark.parametrize("stream", [False, True], ids=["result", "chunk"])
async def test_a_reply_over_the_message_limit_is_answered_tool_service_error_at_once(
        pulsar_broker: EmbeddedBroker, service: tghost.ToolService, stream: bool) -> None:
    async with LocalHost(pulsar_broker.url, [service]), RawWire(pulsar_broker.url, service.descriptor) as raw:
        await raw.send(wire.encode_request("u", {}, {"stream": stream}), {"id": "big"})
        replies = await raw.replies("big", timeout=10)
    bodies = [body for _, body in replies]
    assert [body["response"] for body in bodies[:-1]] == (["fits"] if stream else [])
    assert bodies[-1]["error"]["type"] == "tool-service-error"
    assert f"over Pulsar's message limit of {wire.MAX_MESSAGE} bytes" in bodies[-1]["error"]["message"]
