"""inspector: ``tghost inspect``'s HTTP side over a live host on the embedded broker: the
directory as JSON, a call streamed as NDJSON, the token, and the Host/Origin checks. The page
itself is tested in a real browser (tests/browser)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2

import tghost
from tests.conftest import tghost_cli
from tghost.adapters.inspector import serve
from tghost.adapters.inspector.app import COOKIE
from tghost.agent.directory import ToolDirectory
from tghost.broker import EmbeddedBroker
from tghost.pulsar.clients import PulsarSettings
from tghost.system.net import free_port
from tghost.testing import LocalHost

TOKEN = "s3cret-" + uuid.uuid4().hex


SHOUTED: list[str] = []


@tghost.tool
def shout(text: str) -> str:
    """Shout the text back."""
    SHOUTED.append(text)
    return text.upper()


@tghost.tool(name="count")
def count(up_to: int) -> Any:
    """Count from 1, one line per number."""
    for number in range(1, up_to + 1):
        yield f"{number}\n"


class Stock(tghost.ToolService):
    """A tool service whose tool declares a title, hints and an output schema. It answers a JSON
    object, or, for an item ``raw:TEXT``, the TEXT as it is."""

    id = "stock"
    description = "How many of an item are in stock."
    arguments = (tghost.Argument(name="item", type="string", description="The item to look up"),)

    def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        item: str = arguments["item"]
        return item.removeprefix("raw:") if item.startswith("raw:") else json.dumps({"item": item, "count": 3})


STOCK = Stock()
STOCK_SCHEMA = {"type": "object", "properties": {"item": {"type": "string"}, "count": {"type": "integer"}}}
CHECK_STOCK = STOCK.tool("check-stock", title="Check stock", annotations={"read-only": True, "open-world": False},
                         **{"output-schema": STOCK_SCHEMA})


@asynccontextmanager
async def inspector(url: str, token: str | None = None) -> AsyncIterator[str]:
    """A host announcing shout, count and check-stock on a fresh topic, and the inspector over
    it; gives its base URL."""
    topic = f"persistent://tg/config/inspect-{uuid.uuid4().hex[:8]}"
    port, ready = free_port(), asyncio.Event()
    async with LocalHost(url, [shout, count, STOCK], tools=[CHECK_STOCK], announce_as="inspected", topic=topic):
        directory = ToolDirectory(PulsarSettings(url), topic)
        server = asyncio.create_task(serve(directory, "127.0.0.1", port, token=token,
                                           on_ready=lambda _: ready.set()))
        await asyncio.wait_for(ready.wait(), 30)
        await directory.wait_for("count")
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.cancel()
            await asyncio.gather(server, return_exceptions=True)


async def test_the_directory_json_has_each_tool_with_its_schema_and_each_host_with_its_lease(
    pulsar_broker: EmbeddedBroker
) -> None:
    async with inspector(pulsar_broker.url) as base, httpx2.AsyncClient() as http:
        snap = (await http.get(f"{base}/api/directory")).json()
    tools = {tool["name"]: tool for tool in snap["tools"]}
    assert sorted(tools) == ["check-stock", "count", "shout"]
    assert tools["shout"]["input-schema"]["required"] == ["text"] and tools["shout"]["providers"] == ["inspected"]
    [host] = snap["hosts"]
    assert host["host"]["id"] == "inspected" and host["state"] == "active" and host["signed_by"] is None
    assert host["lease_end"] > snap["now"] and host["seconds"] == 30.0
    assert {"kind": "tool-service", "name": "shout", "available": True} in host["entries"]
    assert snap["rejections"] == {} and snap["conflicts"] == {} and snap["identity"] is None


async def test_a_call_streams_its_chunks_as_ndjson_then_done_and_an_error_with_its_type_and_where(
    pulsar_broker: EmbeddedBroker
) -> None:
    async with inspector(pulsar_broker.url) as base, httpx2.AsyncClient() as http:
        counted = await http.post(f"{base}/api/call", json={"tool": "count", "arguments": {"up_to": 3}})
        wrong = await http.post(f"{base}/api/call", json={"tool": "shout", "arguments": {}})
        unknown = await http.post(f"{base}/api/call", json={"tool": "shot", "arguments": {}})
        not_a_call = await http.post(f"{base}/api/call", json=["shout"])
    lines = [json.loads(line) for line in counted.text.splitlines()]
    assert [line["chunk"] for line in lines[:-1]] == ["1\n", "2\n", "3\n"]
    assert lines[-1]["done"]["total_ms"] >= lines[-1]["done"]["first_chunk_ms"] >= 0
    [error] = [json.loads(line) for line in wrong.text.splitlines()]
    assert error["error"]["type"] == "invalid-arguments" and "text" in error["error"]["message"]
    assert error["error"]["host"] == "inspected" and len(error["error"]["request_id"]) == 32  # for the host's log
    assert json.loads(unknown.text)["error"].keys() == {"type", "message"}  # refused: no host, no request
    assert json.loads(unknown.text)["error"]["type"] == "unknown-tool"
    assert not_a_call.status_code == 400 and not_a_call.json()["error"]["type"] == "bad-request"


async def test_a_tools_title_hints_and_output_schema_are_shown_and_its_call_ends_with_the_object(
    pulsar_broker: EmbeddedBroker
) -> None:
    async with inspector(pulsar_broker.url) as base, httpx2.AsyncClient() as http:
        snap = (await http.get(f"{base}/api/directory")).json()
        items = ("bolts", "raw:[1, 2]", "raw:not json", 'raw:{"count": NaN}')
        called, *untyped = [await http.post(f"{base}/api/call", json={"tool": "check-stock", "arguments": {"item": i}})
                            for i in items]
    tools = {tool["name"]: tool for tool in snap["tools"]}
    stock = tools["check-stock"]
    assert (stock["title"], stock["annotations"]) == ("Check stock", {"read-only": True, "open-world": False})
    assert stock["output-schema"] == STOCK_SCHEMA
    assert not {"title", "annotations", "output-schema"} & set(tools["shout"])  # none set, none given
    *chunks, structured, done = [json.loads(line) for line in called.text.splitlines()]
    assert json.loads("".join(line["chunk"] for line in chunks)) == {"item": "bolts", "count": 3}  # the text, as ever
    assert structured == {"structured": {"item": "bolts", "count": 3}} and "total_ms" in done["done"]
    # no JSON object, or one the page's JSON cannot read (NaN): the text and the call's end, no tree
    for answer in untyped:
        lines = [json.loads(line) for line in answer.text.splitlines()]
        assert "chunk" in lines[0] and not any("structured" in line for line in lines), lines
        assert "done" in lines[-1] or "error" in lines[-1], lines


async def test_with_a_token_every_request_needs_it_and_the_page_link_sets_a_cookie(
    pulsar_broker: EmbeddedBroker
) -> None:
    async with inspector(pulsar_broker.url, TOKEN) as base, httpx2.AsyncClient() as http:
        assert (await http.get(f"{base}/")).status_code == 401
        assert (await http.get(f"{base}/?token=wrong")).status_code == 401
        assert (await http.get(f"{base}/api/directory")).status_code == 401
        assert (await http.get(f"{base}/api/directory", headers={"Authorization": "Bearer wrong"})).status_code == 401
        for path in ("/static/inspector.js", "/nowhere", "/api/call"):  # every path asks, not only the API
            assert (await http.get(f"{base}{path}")).status_code == 401, path
        rebound = await http.get(f"{base}/?token={TOKEN}", headers={"Host": "evil.example.com"})
        assert rebound.status_code == 421 and COOKIE not in rebound.cookies  # no cookie for a rebound name
        assert (await http.get(f"{base}/static/inspector.css", headers={"Host": "evil.example.com"})).status_code == 421
        entered = await http.get(f"{base}/?token={TOKEN}")
        assert entered.status_code == 303 and entered.headers["location"] == "/"
        assert entered.cookies[COOKIE] == TOKEN and "httponly" in entered.headers["set-cookie"].lower()
        with_bearer = await http.get(f"{base}/api/directory", headers={"Authorization": f"Bearer {TOKEN}"})
        async with httpx2.AsyncClient(cookies={COOKIE: TOKEN}) as browser:
            with_cookie = await browser.get(f"{base}/api/directory")
    assert with_cookie.status_code == with_bearer.status_code == 200


async def test_a_foreign_host_or_origin_or_a_form_post_is_refused(pulsar_broker: EmbeddedBroker) -> None:
    async with inspector(pulsar_broker.url) as base, httpx2.AsyncClient() as http:
        rebound = await http.get(f"{base}/api/directory", headers={"Host": "evil.example.com"})
        cross_site = await http.post(f"{base}/api/call", json={"tool": "shout", "arguments": {"text": "x"}},
                                     headers={"Origin": "http://evil.example.com"})
        form = await http.post(f"{base}/api/call", content="tool=shout", headers={
            "Content-Type": "application/x-www-form-urlencoded"})
        same_site = await http.post(f"{base}/api/call", json={"tool": "shout", "arguments": {"text": "x"}},
                                    headers={"Origin": base.replace("127.0.0.1", "localhost")})
    assert (rebound.status_code, cross_site.status_code, form.status_code) == (421, 403, 400)
    assert json.loads(same_site.text.splitlines()[0])["chunk"] == "X"


async def test_a_page_on_another_loopback_port_calls_no_tool(pulsar_broker: EmbeddedBroker) -> None:
    """Only the inspector's own page calls through it: its origin as 127.0.0.1, localhost or
    [::1] at its port. Any other local page (another port, a sandboxed ``null``) gets 403."""
    async with inspector(pulsar_broker.url) as base, httpx2.AsyncClient() as http:
        port = int(base.rsplit(":", 1)[1])
        SHOUTED.clear()
        foreign = [f"http://127.0.0.1:{port + 1}", f"http://localhost:{port - 1}", f"http://[::1]:{port + 2}",
                   f"http://127.0.0.1:{port}.evil.example.com", f"http://127.0.0.1:{port}/x", "null"]
        refused = [await http.post(f"{base}/api/call", json={"tool": "shout", "arguments": {"text": origin}},
                                   headers={"Origin": origin}) for origin in foreign]
        read = await http.get(f"{base}/api/directory", headers={"Origin": foreign[0]})
        own = [await http.post(f"{base}/api/call", json={"tool": "shout", "arguments": {"text": name}},
                               headers={"Origin": f"http://{name}:{port}"}) for name in ("127.0.0.1", "localhost")]
    assert [r.status_code for r in refused] == [403] * len(foreign) and read.status_code == 403
    assert refused[0].text == (f"tghost inspect answers its own page only, and this request comes from another: "
                               f"Origin '{foreign[0]}'; open the inspector at http://127.0.0.1:{port}/ and call "
                               "from there")
    assert [json.loads(r.text.splitlines()[0])["chunk"] for r in own] == ["127.0.0.1", "LOCALHOST"]
    assert SHOUTED == ["127.0.0.1", "localhost"]  # no foreign origin's call ran


def test_tghost_inspect_off_loopback_asks_for_a_token_file(pulsar_broker: EmbeddedBroker) -> None:
    result = tghost_cli("inspect", "--host", "0.0.0.0", "--pulsar-url", pulsar_broker.url)
    assert result.returncode == 2
    assert "--token-file FILE (env TGHOST_INSPECT_TOKEN_FILE)" in result.stderr and "Traceback" not in result.stderr


async def test_a_stopped_inspector_leaves_its_socket_in_no_event_loop(pulsar_broker: EmbeddedBroker) -> None:
    """The inspector (and the MCP bridge over HTTP) may run in a program's own event loop: once
    stopped, the loop must not keep watching its closed listening socket. A socket opened later
    may get the closed one's descriptor, and the loop then never wakes for it (or fails to watch
    it, FileNotFoundError from epoll: a later test on the suite's one loop failed so now and
    then). Connections are opened until every descriptor the inspector's run freed is taken
    again, and each must hear the server's greeting."""
    async with inspector(pulsar_broker.url):
        pass

    async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hello\n")
        await writer.drain()

    server = await asyncio.start_server(greet, "127.0.0.1", 0)
    writers = []
    try:
        for _ in range(64):
            reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
            writers.append(writer)
            assert await asyncio.wait_for(reader.readline(), 10) == b"hello\n"
    finally:
        for writer in writers:
            writer.close()
        server.close()
