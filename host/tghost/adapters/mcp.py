"""mcp: the live tool directory as a Model Context Protocol server (``tghost mcp``), over
stdio or streamable HTTP, with the official ``mcp`` SDK's low-level server (the ``mcp`` extra:
the only tghost module that imports the SDK). Agent side: never writes anything but MCP messages
to stdout. Over HTTP, the Host and Origin headers are checked on every bind (DNS-rebinding
protection, :func:`transport_security`), not only on loopback as the SDK does by itself.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import hmac
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from mcp import types
from mcp.server import InitializationOptions, NotificationOptions, Server, ServerRequestContext
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.session import ServerSession
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from pydantic import AnyHttpUrl

from tghost._version import __version__
from tghost.adapters.export import mcp_tool
from tghost.adapters.web import allowed_host_patterns, serve_app, warn_if_unreachable_by_name
from tghost.agent.calls import UNKNOWN_TOOL, UnknownTool
from tghost.agent.client import ToolCallError
from tghost.agent.directory import DirectoryTool, ToolDirectory
from tghost.agent.search import MAX_LIMIT, Found, SearchError
from tghost.agent.view import Selection
from tghost.protocol import wire
from tghost.protocol.descriptors import ToolDescriptor
from tghost.protocol.groups import DEFAULT_GROUPS, WILDCARD
from tghost.protocol.wire import Progress
from tghost.system.tasks import cancel_and_wait

__all__ = ["CALL_TOOL", "PAGE_SIZE", "SEARCH_TOOLS", "BearerToken", "Bridge", "Selection", "meta_tools", "page",
           "serve", "transport_security"]

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
    ``groups`` (``None``: ``["default"]``) and ``state`` may use, narrowed by ``selection``
    (:class:`Selection`), sorted by name, in pages of at most :data:`PAGE_SIZE` (:func:`page`);
    ``tools/call`` invokes one over Pulsar, and :meth:`follow` sends
    ``notifications/tools/list_changed`` when that list changes: to every initialized
    handshake-era session, and to every 2026-07-28 ``subscriptions/listen`` stream that asked
    for tool changes.

    With ``tool_search``, ``tools/list`` gives :func:`meta_tools` instead: ``search_tools``,
    which ranks the same tools for a request (BM25, :mod:`tghost.agent.search`) and whose
    description says how many there are and of which groups, and ``call_tool``, which calls one
    of them by name, so a client with a limit on tools reaches any number of them.
    """

    def __init__(self, directory: ToolDirectory, groups: Sequence[str] | None, state: str | None,
                 tool_search: bool = False, selection: Selection = Selection()) -> None:
        self.directory = directory
        self.groups = None if groups is None else list(groups)
        self.state = state
        self.tool_search = tool_search
        self.selection = selection
        self._selected: tuple[list[ToolDescriptor], list[ToolDescriptor]] = ([], [])
        """The directory's available list last seen, and :meth:`descriptors` of it."""

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

    def descriptors(self) -> list[ToolDescriptor]:
        """The tools this bridge serves, sorted by name: those the directory makes available to
        its groups and state (and identity), narrowed by its :class:`Selection` (once per list
        the directory gives: it gives the same one until the tool set changes)."""
        available = self.directory.available(self.groups, self.state)
        if self._selected[0] is not available:
            self._selected = (available, self.selection.select(available))
        return self._selected[1]

    def _meta_tools(self) -> list[dict[str, Any]]:
        return meta_tools(self.descriptors(), self.groups, self.selection.read_only)

    async def list_tools(self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None,
                         ) -> types.ListToolsResult:
        """One page (:func:`page`) of the MCP ``Tool`` objects of :meth:`descriptors` (with
        ``tool_search``: of :func:`meta_tools`): the first, or the one after ``params.cursor``.

        Raises:
            MCPError: the cursor is not one this bridge gave (``INVALID_PARAMS``).
        """
        cursor = None if params is None else params.cursor
        if self.tool_search:
            meta, next_cursor = page([types.Tool.model_validate(tool) for tool in self._meta_tools()], cursor)
            return types.ListToolsResult(tools=meta, next_cursor=next_cursor)
        shown, next_cursor = page(self.descriptors(), cursor)
        return types.ListToolsResult(tools=[types.Tool.model_validate(mcp_tool(d)) for d in shown],
                                     next_cursor=next_cursor)

    async def call_tool(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams,
                        ) -> types.CallToolResult:
        """Invoke the tool through the directory; an error reply or a refusal (``unknown-tool``
        with the closest names, or naming why the tool is outside this bridge's
        :class:`Selection`; ``no-provider``, ``not-allowed``, ``timeout``, ...) is a result with
        ``isError`` and ``type: message`` text; so is any other failure (e.g. the broker is
        unreachable), typed by its class name and logged. The observation of a tool with an
        output schema is ``structuredContent`` (the object) plus its JSON text; any other's is
        the text. With a progress token in the request's ``_meta``, the tool's progress updates
        go to the client as ``notifications/progress``."""
        name, arguments = params.name, dict(params.arguments or {})
        if self.tool_search and name == SEARCH_TOOLS:
            return self._search(arguments)
        if self.tool_search and name == CALL_TOOL:
            called, arguments = arguments.get("name"), arguments.get("arguments") or {}
            if not isinstance(called, str) or not isinstance(arguments, dict):
                return _error(f"{wire.INVALID_ARGUMENTS}: {CALL_TOOL} needs 'name' (a string, from "
                              f"{SEARCH_TOOLS}) and 'arguments' (an object)")
            name = called
        live = self.directory.tools.get(name)
        descriptor = None if live is None else live.descriptor
        refusal = self.selection.refusal(name, descriptor)
        if refusal is not None:
            return _error(f"{UNKNOWN_TOOL}: tool {name!r} is outside this bridge's set ({refusal}); "
                          f"find one with {self._listing}")
        token = (ctx.meta or {}).get("progress_token")
        progress = None if token is None else functools.partial(_forward_progress, ctx, token)
        try:
            observation = await self.directory.invoke(name, arguments, groups=self.groups, state=self.state,
                                                      progress=progress)
            return _result(observation)
        except UnknownTool as exc:  # the directory's hint names a CLI an MCP client cannot run
            return _error(f"{UNKNOWN_TOOL}: {self._within(exc).explain(f'find one with {self._listing}')}")
        except ToolCallError as exc:  # no-provider included: it says that no live host serves the tool
            return _error(str(exc))
        except Exception as exc:
            log.exception("calling %r failed", name)
            return _error(f"{type(exc).__name__}: {exc}")

    def _within(self, unknown: UnknownTool) -> UnknownTool:
        """``unknown`` suggesting only names inside this bridge's set: a client never learns of a
        tool the bridge hides from it."""
        def inside(name: str) -> bool:
            live = self.directory.tools.get(name)
            return self.selection.refusal(name, None if live is None else live.descriptor) is None
        return UnknownTool(unknown.name, [n for n in unknown.suggestions if inside(n)], unknown.unserved)

    def _shown(self) -> list[Any]:
        """What ``tools/list`` shows, in a form cheap to compare: the descriptors (each one's
        ``Tool`` is made of it alone), or with ``tool_search`` the meta tools' JSON."""
        return self._meta_tools() if self.tool_search else self.descriptors()

    @property
    def _listing(self) -> str:
        """Where this bridge's clients find the tools they may call."""
        return SEARCH_TOOLS if self.tool_search else "tools/list"

    async def follow(self) -> None:
        """Send ``notifications/tools/list_changed`` each time the listed tools change (a change
        that leaves the list as it was, such as one provider more, is not sent; with
        ``tool_search``, each time the number or groups of the tools behind ``search_tools``
        change its description). Runs until cancelled."""
        shown = self._shown()
        async for change in self.directory.changes():
            now = self._shown()
            if now == shown:
                continue
            shown = now
            log.info("tool list changed (%s %s): telling %d session(s)", change.kind, change.name, len(self.sessions))
            await self.bus.publish(ToolsListChanged())
            for session in list(self.sessions):
                await session.send_tool_list_changed()  # never raises: a closed channel drops it

    def _search(self, arguments: dict[str, Any]) -> types.CallToolResult:
        """``search_tools``: the best matches among :meth:`descriptors` as JSON, ``[{"name",
        "title", "description", "inputSchema", "annotations", "score", ...}, ...]``
        (:func:`tghost.adapters.export.mcp_tool`, with ``outputSchema`` for a typed tool); a
        contested tool (the one the directory would call) also has ``conflict``."""
        query, limit = arguments.get("query"), arguments.get("limit", 10)
        if not isinstance(query, str):
            return _error(f"{wire.INVALID_ARGUMENTS}: {SEARCH_TOOLS} needs 'query', a string: what the tool should do")
        served = {d.name for d in self.descriptors()}
        try:
            found = [Found(self.directory.tools[name], score)
                     for name, score in self.directory.index.ranked(query, served.__contains__, limit)]
        except SearchError as exc:
            return _error(f"{wire.INVALID_ARGUMENTS}: {exc}")
        matches = [{**mcp_tool(f.tool.descriptor), "score": round(f.score, 3),
                    **({"conflict": _contested(f.tool)} if f.tool.contested else {})} for f in found]
        return types.CallToolResult(content=[types.TextContent(text=json.dumps(matches))])


#: The most tools one ``tools/list`` answer holds; a longer list comes in pages.
PAGE_SIZE = 100


class _Named(Protocol):
    @property
    def name(self) -> str: ...


Named = TypeVar("Named", bound=_Named)


def page(tools: Sequence[Named], cursor: str | None, size: int = PAGE_SIZE) -> tuple[list[Named], str | None]:
    """One page of ``tools`` (sorted by name): the first ``size`` whose name sorts after the one
    ``cursor`` holds (from the start without a cursor), and the cursor of the next page
    (``None``: there is none). A cursor holds the last name a page gave, so a list that changed
    between pages goes on after it: a tool that stayed is never repeated or skipped; one added
    or removed meanwhile is on a page or not, as its name falls.

    Raises:
        MCPError: ``cursor`` is not one this function gave (``INVALID_PARAMS``); the message says
            to list again from the start.
    """
    after = None if cursor is None else _after(cursor)
    rest = [tool for tool in tools if after is None or tool.name > after]
    shown = rest[:size]
    return shown, _cursor(shown[-1].name) if len(rest) > size else None


def _cursor(name: str) -> str:
    """The opaque cursor of the page after ``name``: base64url (unpadded) of ``{"after": name}``."""
    return base64.urlsafe_b64encode(json.dumps({"after": name}).encode()).decode().rstrip("=")


def _after(cursor: str) -> str:
    """The name a :func:`_cursor` holds.

    Raises:
        MCPError: it is not one (``INVALID_PARAMS``).
    """
    try:
        value = json.loads(base64.b64decode(cursor + "=" * (-len(cursor) % 4), altchars=b"-_", validate=True))
    except (binascii.Error, ValueError):
        value = None
    if not (isinstance(value, dict) and isinstance(value.get("after"), str)):
        raise MCPError(types.INVALID_PARAMS, f"invalid cursor {cursor[:64]!r}: it is not one this server gave; "
                                             "list the tools again without a cursor")
    name: str = value["after"]
    return name


SEARCH_TOOLS = "search_tools"
CALL_TOOL = "call_tool"
#: The most groups ``search_tools``' description names; the others are counted.
MAX_GROUPS_NAMED = 10


def meta_tools(tools: Sequence[ToolDescriptor], groups: Sequence[str] | None, read_only: bool = False,
               ) -> list[dict[str, Any]]:
    """The two tools of ``tghost mcp --tool-search`` (MCP ``Tool`` JSON): ``search_tools``, whose
    description says how many ``tools`` it finds among (``read_only``: saying they are
    read-only) and their groups that a request with ``groups`` names (``None``: ``default``;
    with ``*``: all of theirs), and ``call_tool`` (hinted read-only when every tool it calls is)."""
    found = f"{len(tools)} {'read-only ' if read_only else ''}tool{'' if len(tools) == 1 else 's'}"
    return [
        {"name": SEARCH_TOOLS,
         "description": f"Find, among the {found} of {_groups_of(tools, groups)}, the ones that can do something: "
                        "describe the task in plain words. Returns the best matching tools, best first, each with "
                        f"its name, description and input schema; then call one with {CALL_TOOL}.",
         "inputSchema": {"type": "object", "required": ["query"], "properties": {
             "query": {"type": "string", "description": "What the tool should do, e.g. 'weather forecast for a city'"},
             "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": 10,
                       "description": "How many tools to return"}}},
         "annotations": {"title": "Search tools", "readOnlyHint": True}},
        {"name": CALL_TOOL,
         "description": f"Call a tool that {SEARCH_TOOLS} found, by its name, with arguments that match its input "
                        "schema.",
         "inputSchema": {"type": "object", "required": ["name", "arguments"], "properties": {
             "name": {"type": "string", "description": f"The tool's name, as {SEARCH_TOOLS} gave it"},
             "arguments": {"type": "object", "description": "The tool's arguments"}}},
         "annotations": {"title": "Call a tool", **({"readOnlyHint": True} if read_only else {})}},
    ]


def _groups_of(tools: Sequence[ToolDescriptor], groups: Sequence[str] | None) -> str:
    """``group default``, ``groups default and research``, ``groups a, b, ... and 3 more``: the
    groups of ``tools`` that a request with ``groups`` names (all of them with ``*``), else
    (no tools) the ones it names; ``any group`` for ``*`` and no tools."""
    requested = DEFAULT_GROUPS if groups is None else tuple(groups)
    every = WILDCARD in requested
    named = sorted({g for tool in tools for g in tool.group if every or g in requested}) or \
        sorted(g for g in set(requested) if g != WILDCARD)
    if not named:
        return "any group"
    shown = named[:MAX_GROUPS_NAMED] + ([f"{len(named) - MAX_GROUPS_NAMED} more"] if len(named) > MAX_GROUPS_NAMED
                                        else [])
    listed = shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} and {shown[-1]}"
    return f"group{'' if len(named) == 1 else 's'} {listed}"


def _result(observation: str | dict[str, Any]) -> types.CallToolResult:
    """A call's answer: the object of a tool with an output schema (``ToolDirectory.invoke``
    gives it parsed) as ``structuredContent``, plus its JSON text for clients that read text
    only, as MCP asks; any other tool's text as it is."""
    if isinstance(observation, str):
        return types.CallToolResult(content=[types.TextContent(text=observation)])
    return types.CallToolResult(content=[types.TextContent(text=json.dumps(observation))],
                                structured_content=observation)


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
                on_ready: Callable[[str], None] | None = None, selection: Selection = Selection()) -> None:
    """Follow ``directory`` and serve it until the stdio client leaves or the task is cancelled.

    ``transport`` is ``stdio`` (MCP on stdin/stdout) or ``http`` (streamable HTTP at
    ``http://host:port/mcp``, accepting the ``Host`` headers of :func:`transport_security`
    with ``allowed_hosts``; with a ``token``, every request must carry ``Authorization: Bearer
    <token>``, else it is answered 401, through the SDK's bearer auth). ``tool_search``: list
    the two tools of :func:`meta_tools` instead of every tool; ``selection`` narrows the tools
    served (:class:`Bridge`). Over HTTP, ``on_ready`` gets the endpoint's URL once it listens.

    Raises:
        tghost.pulsar.clients.BrokerError: no broker answered within the directory's ``connect_timeout``.
        OSError: over HTTP, the port could not be bound (:func:`tghost.adapters.web.bind`).
    """
    async with directory:
        bridge = Bridge(directory, groups, state, tool_search, selection)
        follower = asyncio.create_task(bridge.follow(), name="mcp list_changed")
        try:
            if transport == "stdio":
                await _serve_stdio(bridge.server)
            else:
                await _serve_http(bridge.server, host, port, allowed_hosts, token, on_ready)
        finally:
            await cancel_and_wait(follower)


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


def transport_security(allowed_hosts: Sequence[str] = ()) -> TransportSecuritySettings:
    """The SDK's DNS-rebinding protection, on whatever address the bridge binds.

    The ``Host`` headers accepted are :func:`tghost.adapters.web.allowed_host_patterns` with
    ``allowed_hosts`` (the inspector's too). The ``Origin`` headers accepted (a request without
    one is too) are ``http://`` of the loopback names, as the SDK's own loopback settings, and
    ``http://`` and ``https://`` of each allowed host. The SDK answers any other ``Host`` with
    421 and any other ``Origin`` with 403.
    """
    origins = [f"http://{name}" for name in allowed_host_patterns()]
    origins += [f"{scheme}://{name}" for name in allowed_hosts for scheme in ("http", "https")]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True,
                                     allowed_hosts=allowed_host_patterns(allowed_hosts), allowed_origins=origins)


async def _serve_http(server: Server[Any], host: str, port: int, allowed_hosts: Sequence[str],
                      token: str | None, on_ready: Callable[[str], None] | None) -> None:
    warn_if_unreachable_by_name("MCP", host, port, allowed_hosts)
    auth: dict[str, Any] = {} if token is None else {
        "auth": AuthSettings(issuer_url=AnyHttpUrl(f"http://{host}:{port}"), resource_server_url=None),
        "token_verifier": BearerToken(token)}
    app = server.streamable_http_app(transport_security=transport_security(allowed_hosts), **auth)
    await serve_app(app, "the MCP bridge", host, port, lifespan="on", path="/mcp", on_ready=on_ready)
