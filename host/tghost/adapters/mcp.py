"""mcp: the live tool directory as a Model Context Protocol server (``tghost mcp``), over
stdio or streamable HTTP, with the official ``mcp`` SDK's low-level server. Agent side: never
writes anything but MCP messages to stdout. Over HTTP, the Host and Origin headers are checked
on every bind (DNS-rebinding protection, :mod:`tghost.adapters.web`), not only on loopback as
the SDK does by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from mcp import types
from mcp.server import InitializationOptions, NotificationOptions, Server, ServerRequestContext
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.session import ServerSession
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from pydantic import AnyHttpUrl

from tghost._version import __version__
from tghost.adapters.export import mcp_tool
from tghost.adapters.web import serve_app, transport_security, warn_if_unreachable_by_name
from tghost.agent.calls import UNKNOWN_TOOL, UnknownTool
from tghost.agent.client import ToolCallError
from tghost.agent.directory import DirectoryTool, ToolDirectory
from tghost.agent.search import MAX_LIMIT, SearchError
from tghost.protocol import wire
from tghost.protocol.wire import Progress

__all__ = ["CALL_TOOL", "META_TOOLS", "SEARCH_TOOLS", "BearerToken", "Bridge", "serve"]

log = logging.getLogger(__name__)

class _Server(Server[Any]):
    """The low-level server, advertising ``tools.listChanged`` on every transport (the HTTP
    session manager asks for the initialization options without arguments)."""

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True), experimental_capabilities, extensions)


class Bridge:
    """One MCP server over ``directory``: ``tools/list`` gives the tools a seed 001 request with
    ``groups`` (``None``: ``["default"]``) and ``state`` may use, ``tools/call`` invokes one over
    Pulsar, and :meth:`follow` sends ``notifications/tools/list_changed`` when that list changes:
    to every initialized handshake-era session, and to every 2026-07-28 ``subscriptions/listen``
    stream that asked for tool changes.

    With ``tool_search``, ``tools/list`` gives :data:`META_TOOLS` instead: ``search_tools``, which
    ranks the same tools for a request (:meth:`tghost.agent.directory.ToolDirectory.search`), and
    ``call_tool``, which calls one of them by name, so a client with a limit on tools reaches
    any number of them.
    """

    def __init__(self, directory: ToolDirectory, groups: Sequence[str] | None, state: str | None,
                 tool_search: bool = False) -> None:
        self.directory = directory
        self.groups = None if groups is None else list(groups)
        self.state = state
        self.tool_search = tool_search

        self.sessions: set[ServerSession] = set()
        """One per initialized handshake-era connection, until it closes."""
        self.bus = InMemorySubscriptionBus()
        self.server = _Server(
            "tghost", version=__version__, title="tghost tool directory",
            on_list_tools=self.list_tools, on_call_tool=self.call_tool,
            on_subscriptions_listen=ListenHandler(self.bus))
        self.server.add_notification_handler("notifications/initialized", types.NotificationParams, self._initialized)

    async def _initialized(self, ctx: ServerRequestContext[Any], params: types.NotificationParams) -> None:
        """Remember a connection that finished the handshake, until it closes. Its session
        sends on the connection's standalone channel; mcp 2.x has no public accessor for the
        connection, whose ``exit_stack`` is the documented per-connection teardown hook."""
        session = ctx.session
        self.sessions.add(session)
        session._connection.exit_stack.callback(self.sessions.discard, session)

    def tools(self) -> list[types.Tool]:
        """The MCP ``Tool`` objects of the tools this bridge's clients may use, sorted by name
        (with ``tool_search``: :data:`META_TOOLS`)."""
        if self.tool_search:
            return [types.Tool.model_validate(tool) for tool in META_TOOLS]
        return [types.Tool.model_validate(mcp_tool(d)) for d in self.directory.available(self.groups, self.state)]

    async def list_tools(self, ctx: ServerRequestContext[Any], params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self.tools())

    async def call_tool(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams,
                        ) -> types.CallToolResult:
        """Invoke the tool through the directory; an error reply or a refusal (``unknown-tool``
        with the closest names, ``no-provider``, ``not-allowed``, ``timeout``, ...) is a result
        with ``isError`` and ``type: message`` text; so is any other failure (e.g. the broker is
        unreachable), typed by its class name and logged. With a progress token in the request's
        ``_meta``, the tool's progress updates go to the client as ``notifications/progress``."""
        name, arguments = params.name, dict(params.arguments or {})
        if self.tool_search and name == SEARCH_TOOLS:
            return self._search(arguments)
        if self.tool_search and name == CALL_TOOL:
            called, arguments = arguments.get("name"), arguments.get("arguments") or {}
            if not isinstance(called, str) or not isinstance(arguments, dict):
                return _error(f"{wire.INVALID_ARGUMENTS}: {CALL_TOOL} needs 'name' (a string, from "
                              f"{SEARCH_TOOLS}) and 'arguments' (an object)")
            name = called
        token = (ctx.meta or {}).get("progress_token")
        progress = None if token is None else functools.partial(_forward_progress, ctx, token)
        try:
            observation = await self.directory.invoke(name, arguments, groups=self.groups, state=self.state,
                                                      progress=progress)
        except UnknownTool as exc:  # the directory's hint names a CLI an MCP client cannot run
            return _error(f"{UNKNOWN_TOOL}: {exc.explain(f'find one with {self._listing}')}")
        except ToolCallError as exc:  # no-provider included: it says that no live host serves the tool
            return _error(str(exc))
        except Exception as exc:
            log.exception("calling %r failed", name)
            return _error(f"{type(exc).__name__}: {exc}")
        text = observation if isinstance(observation, str) else json.dumps(observation)
        return types.CallToolResult(content=[types.TextContent(text=text)])

    @property
    def _listing(self) -> str:
        """Where this bridge's clients find the tools they may call."""
        return SEARCH_TOOLS if self.tool_search else "tools/list"

    async def follow(self) -> None:
        """Send ``notifications/tools/list_changed`` each time the listed tools change (a change
        that leaves the list as it was, such as one provider more, is not sent). Runs until
        cancelled."""
        shown = self.tools()
        async for change in self.directory.changes():
            now = self.tools()
            if now == shown:
                continue
            shown = now
            log.info("tool list changed (%s %s): telling %d session(s)", change.kind, change.name, len(self.sessions))
            await self.bus.publish(ToolsListChanged())
            for session in list(self.sessions):
                await session.send_tool_list_changed()  # never raises: a closed channel drops it


    def _search(self, arguments: dict[str, Any]) -> types.CallToolResult:
        """``search_tools``: the best matches as JSON, ``[{"name", "description", "inputSchema",
        "score"}, ...]``; a contested tool (the one the directory would call) also has ``conflict``."""
        query, limit = arguments.get("query"), arguments.get("limit", 10)
        if not isinstance(query, str):
            return _error(f"{wire.INVALID_ARGUMENTS}: {SEARCH_TOOLS} needs 'query', a string: what the tool should do")
        try:
            found = self.directory.search(query, limit, self.groups, self.state)
        except SearchError as exc:
            return _error(f"{wire.INVALID_ARGUMENTS}: {exc}")
        matches = [{**mcp_tool(f.tool.descriptor), "score": round(f.score, 3),
                    **({"conflict": _contested(f.tool)} if f.tool.contested else {})} for f in found]
        return types.CallToolResult(content=[types.TextContent(text=json.dumps(matches))])


SEARCH_TOOLS = "search_tools"
CALL_TOOL = "call_tool"
#: The two tools of ``tghost mcp --tool-search`` (MCP ``Tool`` JSON).
META_TOOLS: list[dict[str, Any]] = [
    {"name": SEARCH_TOOLS,
     "description": "Find the tools that can do something: describe the task in plain words. Returns the best "
                    "matching tools, best first, each with its name, description and input schema; then call one "
                    f"with {CALL_TOOL}.",
     "inputSchema": {"type": "object", "required": ["query"], "properties": {
         "query": {"type": "string", "description": "What the tool should do, e.g. 'weather forecast for a city'"},
         "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": 10,
                   "description": "How many tools to return"}}},
     "annotations": {"title": "Search tools", "readOnlyHint": True}},
    {"name": CALL_TOOL,
     "description": f"Call a tool that {SEARCH_TOOLS} found, by its name, with arguments that match its input schema.",
     "inputSchema": {"type": "object", "required": ["name", "arguments"], "properties": {
         "name": {"type": "string", "description": f"The tool's name, as {SEARCH_TOOLS} gave it"},
         "arguments": {"type": "object", "description": "The tool's arguments"}}},
     "annotations": {"title": "Call a tool"}},
]


async def _forward_progress(ctx: ServerRequestContext[Any], token: str | int, update: Progress) -> None:
    """A tool's progress update (docs/protocol.md §2.12), as the MCP client's
    ``notifications/progress`` for the progress token its ``tools/call`` sent."""
    await ctx.session.send_progress_notification(token, update.done, update.total, update.message)


def _contested(tool: DirectoryTool) -> str:
    sides = [side.describe() for side in tool.sides()]
    return f"other hosts announce this name differently ({'; '.join(sides[1:])}); this is the one called"


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


async def serve(directory: ToolDirectory, groups: Sequence[str] | None, state: str | None,
                transport: str, host: str, port: int, allowed_hosts: Sequence[str] = (),
                token: str | None = None, tool_search: bool = False,
                on_ready: Callable[[str], None] | None = None) -> None:
    """Follow ``directory`` and serve it until the stdio client leaves or the task is cancelled.

    ``transport`` is ``stdio`` (MCP on stdin/stdout) or ``http`` (streamable HTTP at
    ``http://host:port/mcp``, accepting the ``Host`` headers of :func:`transport_security`
    with ``allowed_hosts``; with a ``token``, every request must carry ``Authorization: Bearer
    <token>``, else it is answered 401, through the SDK's bearer auth). ``tool_search``: list
    the two tools of :data:`META_TOOLS` instead of every tool (:class:`Bridge`). Over HTTP,
    ``on_ready`` gets the endpoint's URL once it listens.

    Raises:
        tghost.pulsar.clients.BrokerError: no broker answered within the directory's ``connect_timeout``.
        OSError: over HTTP, the port could not be bound (:func:`tghost.adapters.web.bind`).
    """
    async with directory:
        bridge = Bridge(directory, groups, state, tool_search)
        follower = asyncio.create_task(bridge.follow(), name="mcp list_changed")
        try:
            if transport == "stdio":
                await _serve_stdio(bridge.server)
            else:
                await _serve_http(bridge.server, host, port, allowed_hosts, token, on_ready)
        finally:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower


async def _serve_stdio(server: Server[Any]) -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


class BearerToken:
    """The SDK's :class:`~mcp.server.auth.provider.TokenVerifier` for one shared secret: a
    request's bearer token is accepted when it equals ``token`` (compared in constant time)."""

    def __init__(self, token: str) -> None:
        self._token = token

    async def verify_token(self, token: str) -> AccessToken | None:
        if hmac.compare_digest(token.encode(), self._token.encode()):
            return AccessToken(token=token, client_id="tghost-mcp", scopes=[])
        return None


async def _serve_http(server: Server[Any], host: str, port: int, allowed_hosts: Sequence[str],
                      token: str | None, on_ready: Callable[[str], None] | None) -> None:
    warn_if_unreachable_by_name("MCP", host, port, allowed_hosts)
    auth: dict[str, Any] = {} if token is None else {
        "auth": AuthSettings(issuer_url=AnyHttpUrl(f"http://{host}:{port}"), resource_server_url=None),
        "token_verifier": BearerToken(token)}
    app = server.streamable_http_app(transport_security=transport_security(allowed_hosts), **auth)
    await serve_app(app, "the MCP bridge", host, port, lifespan="on", path="/mcp", on_ready=on_ready)
