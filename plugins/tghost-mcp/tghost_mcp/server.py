"""server: one mounted MCP server, kept up while the host runs. Its session is the official SDK's
``ClientSession`` over ``stdio_client`` (a process the host starts) or ``streamable_http_client``,
on a :class:`~tghost_mcp.runtime.Runtime` of its own; no MCP protocol code is written here.

- :meth:`MountedServer.start` starts the server, completes ``initialize``, lists its tools and
  tells the :class:`Listener` (``up``); a failure then is the start's, and nothing is retried.
- While it runs: a ``notifications/tools/list_changed`` lists the tools again (``up``); a stdio
  server whose process exits, or an HTTP server that stops answering a ping, is ``down``: calls
  in flight end ``unavailable``, the failure is logged once with the server's last stderr lines,
  and it is started again after 1, 2, 4 ... 30 seconds (:data:`MAX_DELAY`), until it is back.
- :meth:`MountedServer.call` forwards a ``tools/call`` from the host's loop: its progress
  notifications go to the call's ``tghost.Context``, and cancelling the call cancels the
  request, for which the SDK sends ``notifications/cancelled``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import IO, Any, Protocol

import anyio
import httpx2
from anyio.abc import ObjectReceiveStream, ObjectSendStream
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

import tghost
from tghost.protocol import UNAVAILABLE

from .runtime import Runtime
from .settings import TABLE, ServerSettings

__all__ = ["MAX_DELAY", "PING_INTERVAL", "Listener", "MountedServer", "describe"]

log = logging.getLogger(__name__)

#: The longest wait, in seconds, before a server that went down is started again.
MAX_DELAY = 30.0
#: Seconds between two pings of a streamable-HTTP server (a failed call pings at once).
PING_INTERVAL = 10.0
#: Seconds a ping may take before the server counts as not answering.
PING_TIMEOUT = 10.0
#: Seconds stopping a server may take (the SDK gives a stdio server 2 s to exit, then kills it).
STOP_TIMEOUT = 15.0
#: The last lines of a stdio server's stderr that a failure's log line quotes.
STDERR_LINES = 5

Message = SessionMessage | Exception


class Listener(Protocol):
    """Told, on the server's loop, what it offers: ``up(tools)`` after each start and each
    listing, ``down(problem)`` when it went down (``problem`` says why, and when it restarts)."""

    def up(self, tools: list[types.Tool]) -> None: ...

    def down(self, problem: str) -> None: ...


class MountedServer:
    """The MCP server ``name`` with ``settings``, telling ``listener`` what it offers.

    ``problem`` is why it is down (``None`` while it is up).
    """

    def __init__(self, name: str, settings: ServerSettings, listener: Listener) -> None:
        self.name = name
        self.settings = settings
        self.listener = listener
        self.problem: str | None = None
        self._session: ClientSession | None = None
        self._runtime: Runtime | None = None
        self._task: asyncio.Task[None] | None = None
        self._stderr: IO[str] | None = None
        self._changed = asyncio.Event()  # a list_changed came
        self._doubt = asyncio.Event()  # a call lost its connection: ping now
        self._why_ended = ""
        self._refused_with: str | None = None  # the last HTTP error status the server answered

    def start(self) -> None:
        """Start the server, complete ``initialize`` and list its tools within ``start-timeout``
        seconds (``listener.up``), then keep it up in the background.

        Raises:
            RuntimeError: it did not start; the message says why (a command not found, the
                timeout, what the server answered) and quotes its last stderr lines.
        """
        self._runtime = Runtime(f"mcp {self.name}")
        try:
            self._runtime.run(self._begin(), self.settings.start_timeout + STOP_TIMEOUT)
        except BaseException:
            self.stop()
            raise

    async def _begin(self) -> None:
        first: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._keep_up(first), name=f"mcp {self.name}")
        await first

    def stop(self) -> None:
        """End the session and stop the server's loop, waiting at most ``STOP_TIMEOUT`` seconds: the
        SDK closes a stdio server's input, terminates it after 2 s and kills it after 2 more.
        Safe to call twice."""
        if self._runtime is None:
            return
        if self._task is not None:
            with contextlib.suppress(Exception):
                self._runtime.run(_cancelled(self._task), STOP_TIMEOUT)
        self._runtime.stop()
        if self._stderr is not None:
            self._stderr.close()

    async def call(self, tool: str, arguments: dict[str, Any], context: tghost.Context | None) -> types.CallToolResult:
        """Call the MCP tool ``tool`` with ``arguments``, from any event loop (the host's); its
        progress goes to ``context``. Cancelling this cancels the MCP request.

        Raises:
            tghost.ToolError: ``unavailable``: the server is down, or went down during the call;
                ``tool-service-error``: it answered the call with an error, or a result whose
                ``structuredContent`` breaks the tool's output schema.
        """
        assert self._runtime is not None, "call() before start()"
        return await self._runtime.call(self._call(tool, arguments, context))

    async def _call(self, tool: str, arguments: dict[str, Any], context: tghost.Context | None) -> types.CallToolResult:
        session = self._session
        if session is None:
            raise tghost.ToolError(f"MCP server {self.name!r} is down ({self.problem}); retry later", UNAVAILABLE)
        try:
            return await session.call_tool(tool, arguments, progress_callback=_progress_to(context))
        except MCPError as exc:
            if exc.code != types.CONNECTION_CLOSED:
                raise tghost.ToolError(f"MCP server {self.name!r} refused the call of {tool!r}: "
                                       f"{exc.message}") from None
            self._doubt.set()
            raise tghost.ToolError(f"MCP server {self.name!r} went down during the call ({exc.message}); retry once "
                                   "it is back", UNAVAILABLE) from None
        except RuntimeError as exc:  # the SDK's check of structuredContent against the output schema
            raise tghost.ToolError(f"MCP server {self.name!r}, tool {tool!r}: {exc}") from None

    async def _keep_up(self, first: asyncio.Future[None]) -> None:
        """Run the session; when it ends, tell the listener, wait and start it again. A failure
        before the first ``up`` ends ``first`` with it instead."""
        failures = 0
        while True:
            up_since = time.monotonic()
            try:
                async with self._connected() as (session, tools, ended):
                    up_since = time.monotonic()
                    self._session, self.problem = session, None
                    self.listener.up(tools)
                    if not first.done():
                        first.set_result(None)
                    elif failures:
                        log.info("MCP server %r is back; its tools are served again", self.name)
                    await self._serve(session, ended)
                reason = self._why_ended
            except Exception as exc:
                reason = self._failure(exc)
                if not first.done():
                    first.set_exception(RuntimeError(f"the MCP server {reason}{self._stderr_tail()}"))
                    return
            finally:
                self._session = None
            failures = 0 if time.monotonic() - up_since >= 2 * MAX_DELAY else failures
            delay = min(MAX_DELAY, 2.0 ** failures)
            failures += 1
            self.problem = f"{reason}; {'restarting' if self.settings.stdio else 'reconnecting'} in {delay:g} s"
            log.warning("MCP server %r %s%s", self.name, self.problem, self._stderr_tail())
            self.listener.down(self.problem)
            await asyncio.sleep(delay)

    @asynccontextmanager
    async def _connected(self) -> AsyncIterator[tuple[ClientSession, list[types.Tool], anyio.Event]]:
        """A session that completed ``initialize``, the server's tools, and the event set when
        the session ends (the stdio server's output closed, or a ping failed)."""
        self._changed, self._doubt, ended = asyncio.Event(), asyncio.Event(), anyio.Event()
        self._why_ended = "exited" if self.settings.stdio else "closed the connection"
        async with AsyncExitStack() as stack:
            read, write = await stack.enter_async_context(await self._transport(stack))
            send, receive = anyio.create_memory_object_stream[Message]()
            pumps = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(pumps.cancel_scope.cancel)
            pumps.start_soon(_pump, read, send, ended)
            session = await stack.enter_async_context(ClientSession(receive, write, message_handler=self._heard))
            with anyio.fail_after(self.settings.start_timeout):
                await session.initialize()
                tools = await _all_tools(session)
            yield session, tools, ended

    async def _transport(self, stack: AsyncExitStack) -> contextlib.AbstractAsyncContextManager[Any]:
        """The SDK's transport to the server: ``stdio_client`` (its stderr to a file of ours, for
        the tail a failure quotes) or ``streamable_http_client`` (with the bearer token)."""
        settings = self.settings
        if settings.command is not None:
            if settings.cwd is not None and not settings.cwd.is_dir():
                raise Unfit(f"cannot start: its cwd {str(settings.cwd)!r} is no directory ([{TABLE}.{self.name}] cwd)")
            if self._stderr is not None:
                self._stderr.close()
            # kept open past the session: a failure's log line quotes its last lines
            self._stderr = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115
            parameters = StdioServerParameters(command=settings.command, args=settings.args, env=settings.env or None,
                                               cwd=settings.cwd)
            return stdio_client(parameters, errlog=self._stderr)
        headers = {"Authorization": f"Bearer {self._token()}"} if settings.token_file is not None else {}
        self._refused_with = None
        client = await stack.enter_async_context(httpx2.AsyncClient(
            headers=headers, timeout=httpx2.Timeout(30.0, read=300.0), event_hooks={"response": [self._answered]}))
        return streamable_http_client(str(settings.url), http_client=client)

    async def _answered(self, response: httpx2.Response) -> None:
        """Keep the last HTTP error status the server answered (a failure names it)."""
        if response.status_code >= 400:
            self._refused_with = f"HTTP {response.status_code} {response.reason_phrase}".strip()

    def _token(self) -> str:
        """The bearer token: the text of ``token-file``, read at each connection (so a rotated
        token is used at the next one).

        Raises:
            Unfit: the file cannot be read (the message names it and the table).
        """
        path = self.settings.token_file
        try:
            return path.read_text().strip() if path is not None else ""
        except OSError as exc:
            raise Unfit(f"cannot read the token file {str(path)!r} ([{TABLE}.{self.name}] token-file): "
                        f"{exc.strerror}") from None

    async def _serve(self, session: ClientSession, ended: anyio.Event) -> None:
        """Follow the server until the session ends: list the tools again on each change, and
        ping a streamable-HTTP server."""
        async with anyio.create_task_group() as watchers:
            watchers.start_soon(self._follow_changes, session)
            if not self.settings.stdio:
                watchers.start_soon(self._watch_answers, session, ended)
            await ended.wait()
            watchers.cancel_scope.cancel()

    async def _follow_changes(self, session: ClientSession) -> None:
        while True:
            await self._changed.wait()
            self._changed.clear()
            self.listener.up(await _all_tools(session))

    async def _watch_answers(self, session: ClientSession, ended: anyio.Event) -> None:
        """Ping every :data:`PING_INTERVAL` seconds, or at once after a call lost its connection;
        a ping that fails ends the session."""
        while True:
            with anyio.move_on_after(PING_INTERVAL):
                await self._doubt.wait()
            self._doubt.clear()
            try:
                with anyio.fail_after(PING_TIMEOUT):
                    await session.send_ping()
            except Exception as exc:
                self._why_ended = f"does not answer at {self.settings.url} ({describe(exc)})"
                ended.set()
                return

    async def _heard(self, message: Any) -> None:
        """The session's notifications and transport errors: a tools list change is followed
        (:meth:`_follow_changes`); a transport error makes the next ping come at once."""
        if isinstance(message, types.ToolListChangedNotification):
            self._changed.set()
        elif isinstance(message, Exception):
            log.debug("MCP server %r: transport error: %s", self.name, describe(message))
            self._doubt.set()

    def _failure(self, exc: BaseException) -> str:
        """Why a session failed, in words that say what to do."""
        exc = _leaf(exc)
        settings = self.settings
        if isinstance(exc, Unfit):
            return str(exc)
        if isinstance(exc, FileNotFoundError) and settings.stdio:
            return (f"cannot start: command {settings.command!r} not found; install it, or give its full path in "
                    f"[{TABLE}.{self.name}] command")
        if isinstance(exc, TimeoutError):
            return (f"did not complete MCP's initialize and tools/list within {settings.start_timeout:g} s "
                    f"(start-timeout in [{TABLE}.{self.name}])")
        if settings.stdio:
            return "exited before it answered" if isinstance(exc, MCPError) and exc.code == types.CONNECTION_CLOSED \
                else describe(exc)
        if self._refused_with is not None:
            fix = "; check its token-file" if self._refused_with.startswith(("HTTP 401", "HTTP 403")) else ""
            return f"answered {self._refused_with} at {settings.url}{fix}"
        return f"does not answer at {settings.url} ({describe(exc)})"

    def _stderr_tail(self) -> str:
        """``; its stderr ended: "..."`` with the stdio server's last :data:`STDERR_LINES`
        lines (joined by `` | ``), or ``""``."""
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        lines = [line.strip()[:200] for line in self._stderr.read().splitlines() if line.strip()]
        self._stderr.seek(0, 2)
        return f'; its stderr ended: "{" | ".join(lines[-STDERR_LINES:])}"' if lines else ""


class Unfit(Exception):
    """A server's settings it cannot start with (its cwd, its token file); the message says which."""


def describe(exc: BaseException) -> str:
    """An exception as ``Type: message`` (an MCP error as its message; a group as its first)."""
    exc = _leaf(exc)
    if isinstance(exc, MCPError):
        return exc.message
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _leaf(exc: BaseException) -> BaseException:
    """The first exception of a task group's (nested) exception group, or ``exc``."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


async def _pump(source: ObjectReceiveStream[Message], sink: ObjectSendStream[Message], ended: anyio.Event) -> None:
    """Pass the transport's messages on to the session; set ``ended`` when the transport has no
    more (a stdio server's output closed: it exited)."""
    try:
        async with sink:
            async for message in source:
                await sink.send(message)
    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
        pass
    finally:
        ended.set()


async def _all_tools(session: ClientSession) -> list[types.Tool]:
    """Every tool the server lists, page after page."""
    tools: list[types.Tool] = []
    cursor: str | None = None
    while True:
        page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
        tools += page.tools
        if not (cursor := page.next_cursor):
            return tools


def _progress_to(context: tghost.Context | None) -> ProgressFnT | None:
    """The call's progress callback: each MCP progress notification as a tghost progress update
    (one tghost cannot carry, such as a negative count, is dropped)."""
    if context is None:
        return None

    async def report(progress: float, total: float | None, message: str | None) -> None:
        with contextlib.suppress(TypeError, ValueError):
            context.progress(progress, total if total else None, message)

    return report


async def _cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
