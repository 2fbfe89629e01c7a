"""app: the inspector's web app (Starlette) over a started directory.

Routes:

- ``GET /``: the page (``static/index.html``; its script and style under ``/static/``, shipped in
  the wheel, nothing fetched from elsewhere);
- ``GET /api/directory``: the directory now (:func:`tghost.adapters.inspector.views.snapshot`);
- ``GET /api/events``: server-sent events: a ``directory`` event with the snapshot at once and
  after each change to the live tools (bursts merged over :data:`SETTLE` seconds), and between
  them a ``hosts`` event every :data:`REFRESH` seconds
  (:func:`tghost.adapters.inspector.views.hosts_view`: leases, expired hosts, counters);
- ``POST /api/call`` (JSON ``{"tool", "arguments", "groups"?, "state"?, "user"?}``): calls the tool
  through the directory, exactly as an agent would, and streams newline-delimited JSON: a
  ``{"chunk": str, "ms": float}`` per observation chunk and a ``{"progress": {"done", "total",
  "message"}, "ms": float}`` per progress update (docs/protocol.md §2.12); for a tool with an
  ``output-schema``, ``{"structured": object}`` (the JSON object its observation holds, for the
  page to draw as a tree; docs/protocol.md §2.14); then ``{"done": {"first_chunk_ms",
  "total_ms"}}`` or ``{"error": {"type", "message", "host"?, "request_id"?}, "total_ms"}``
  (``host``: the host that answered with the error, ``request_id``: the call's, when known, for
  finding it in that host's log; ``bad-request`` for a tool with an ``output-schema`` that
  answered no JSON object, as an agent's call gets). Closing the request cancels the call.

Every request, static files and unknown paths included, has its ``Host`` checked against
loopback and the allowed hosts (:func:`tghost.adapters.web.is_allowed_host`, the MCP bridge's
rule; else 421), a POST its JSON content type (else 400), and its ``Origin``, if any, must be the
inspector's own (:func:`tghost.adapters.web.is_own_origin`): another page, on another loopback
port too, is answered 403.
With a token, every request must carry it: ``Authorization: Bearer <token>``, or the cookie
that ``GET /?token=<token>`` sets; else 401.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from importlib.resources import files
from typing import Any

from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from tghost.adapters.inspector.views import hosts_view, snapshot
from tghost.adapters.web import allowed_host_patterns, is_allowed_host, is_own_origin
from tghost.agent.calls import structured
from tghost.agent.client import ToolCallError
from tghost.agent.directory import ToolDirectory
from tghost.protocol.wire import Progress

__all__ = ["COOKIE", "REFRESH", "SETTLE", "Inspector"]

log = logging.getLogger(__name__)

#: Seconds a burst of directory changes is merged over before the page is sent a new snapshot.
SETTLE = 0.1
#: Seconds between snapshots when nothing changes (leases count down; hosts expire).
REFRESH = 2.0
#: The cookie that carries the token after ``GET /?token=...``.
COOKIE = "tghost-inspect-token"

_STATIC = ("tghost.adapters.inspector", "static")


class Inspector:
    """The inspector over ``directory`` (started by the caller, and followed here).

    ``token``: the secret every request must carry (``None``: none asked, for loopback).
    ``allowed_hosts``: ``Host`` names accepted besides loopback (:func:`tghost.adapters.web.allowed_host_patterns`).
    """

    def __init__(self, directory: ToolDirectory, token: str | None = None, allowed_hosts: Sequence[str] = ()) -> None:
        self.directory = directory
        self.token = token
        self._hosts = allowed_host_patterns(allowed_hosts)
        self._version = 0
        self._changed = asyncio.Condition()
        routes = Starlette(routes=[
            Route("/", self._index),
            Route("/api/directory", self._directory),
            Route("/api/events", self._events),
            Route("/api/call", self._call, methods=["POST"]),
            Mount("/static", app=StaticFiles(packages=[_STATIC]), name="static"),
        ])
        self.app = _Guarded(routes, self._refusal)
        """The ASGI app: every HTTP request, static files and unknown paths included, passes
        :meth:`_refusal` first."""

    async def follow(self) -> None:
        """Count the directory's changes and wake every event stream. Runs until cancelled."""
        async for _ in self.directory.changes():
            async with self._changed:
                self._version += 1
                self._changed.notify_all()

    async def _refusal(self, request: Request) -> Response | None:
        """Why ``request`` is not answered (400 for a POST that is not JSON, 421 for its Host, 403
        for an Origin not the inspector's own, 401 without the token), or ``None``.
        ``GET /?token=`` with the right token passes, to be given its cookie."""
        refused = _not_json(request) or _foreign_host(request, self._hosts) or _foreign_origin(request)
        if refused is not None or self.token is None or self._has_token(request):
            return refused
        if request.url.path == "/" and self._matches(request.query_params.get("token")):
            return None
        return PlainTextResponse("tghost inspect asks for its token: open /?token=<the secret in its --token-file>, "
                                 "or send 'Authorization: Bearer <token>'", status_code=401)

    async def _index(self, request: Request) -> Response:
        """The page; ``?token=`` with the right token sets the cookie and drops it from the URL."""
        if self.token is not None and not self._has_token(request) and self._matches(request.query_params.get("token")):
            response = RedirectResponse("/", status_code=303)
            response.set_cookie(COOKIE, self.token, httponly=True, samesite="strict")
            return response
        return FileResponse(_static_file("index.html"))

    def _has_token(self, request: Request) -> bool:
        bearer = request.headers.get("authorization", "")
        given = bearer[7:] if bearer.lower().startswith("bearer ") else request.cookies.get(COOKIE)
        return self._matches(given)

    def _matches(self, given: str | None) -> bool:
        return given is not None and self.token is not None and hmac.compare_digest(given.encode(), self.token.encode())

    async def _directory(self, request: Request) -> Response:
        return JSONResponse(snapshot(self.directory, time.time()))

    async def _events(self, request: Request) -> Response:
        async def events() -> AsyncIterator[dict[str, str]]:
            seen = self._version
            yield {"event": "directory", "data": json.dumps(snapshot(self.directory, time.time()))}
            while not await request.is_disconnected():
                if seen == self._version:
                    async with self._changed:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._changed.wait(), REFRESH)
                if seen == self._version:  # no tool changed: the hosts' leases and the counters did
                    yield {"event": "hosts", "data": json.dumps(hosts_view(self.directory, time.time()))}
                    continue
                await asyncio.sleep(SETTLE)  # merge a burst (a host starting announces many entries)
                seen = self._version
                yield {"event": "directory", "data": json.dumps(snapshot(self.directory, time.time()))}
        return EventSourceResponse(events(), ping=15)

    async def _call(self, request: Request) -> Response:
        try:
            body = await request.json()
            tool, arguments = body["tool"], body.get("arguments") or {}
            if not isinstance(tool, str) or not isinstance(arguments, dict):
                raise TypeError("'tool' must be a string and 'arguments' an object")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return JSONResponse({"error": {"type": "bad-request", "message": f"not a call: {exc}"}}, status_code=400)
        options = {"groups": body.get("groups") or None, "state": body.get("state") or None,
                   "user": body.get("user") or None}
        return _ndjson(self._stream(tool, arguments, options))

    async def _stream(self, tool: str, arguments: dict[str, Any],
                      options: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        started = time.perf_counter()
        first: float | None = None

        def ms(since: float = started) -> float:
            return round((time.perf_counter() - since) * 1000, 1)

        events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()  # the call waits as long as its service says
        calling = asyncio.create_task(self._pump(events, tool, arguments, options))
        try:
            while True:
                kind, value = await events.get()
                if kind == "chunk":
                    first = first if first is not None else ms()
                    yield {"chunk": value, "ms": ms()}
                elif kind == "progress":
                    yield {"progress": value._asdict(), "ms": ms()}
                elif kind == "structured":
                    yield {"structured": value}
                elif kind == "done":
                    yield {"done": {"first_chunk_ms": first, "total_ms": ms()}}
                    return
                else:
                    yield {"error": value, "total_ms": ms()}
                    return
        finally:  # the page went away (Stop): cancelling the call cancels it on its host
            calling.cancel()
            await asyncio.gather(calling, return_exceptions=True)

    async def _pump(self, events: asyncio.Queue[tuple[str, Any]], tool: str, arguments: dict[str, Any],
                    options: dict[str, Any]) -> None:
        """Make the call, putting each chunk and progress update on ``events``; then, for a tool
        with an ``output-schema``, ``("structured", object)`` (:func:`tghost.agent.calls.structured`);
        then its end: ``("done", None)`` or ``("error", {"type", "message", "host"?, "request_id"?})``."""
        def progress(update: Progress) -> None:
            events.put_nowait(("progress", update))

        known = self.directory.tools.get(tool)
        typed = known is not None and known.descriptor.output_schema is not None
        chunks: list[str] = []
        try:
            async for chunk in self.directory.stream(tool, arguments, progress=progress, **options):
                events.put_nowait(("chunk", chunk))
                if typed:
                    chunks.append(chunk)
            if typed:
                events.put_nowait(("structured", structured(tool, "".join(chunks))))
            events.put_nowait(("done", None))
        except ToolCallError as exc:
            where = {"host": exc.host, "request_id": exc.request_id}
            events.put_nowait(("error", {"type": exc.error_type, "message": exc.message,
                                         **{key: value for key, value in where.items() if value}}))
        except Exception as exc:  # the broker gone, say: the page shows it, the log keeps the trace
            log.exception("inspector: calling %r failed", tool)
            events.put_nowait(("error", {"type": type(exc).__name__, "message": str(exc)}))


class _Guarded:
    """ASGI middleware: an HTTP request ``refusal`` answers is answered so; others reach ``app``."""

    def __init__(self, app: ASGIApp, refusal: Callable[[Request], Awaitable[Response | None]]) -> None:
        self._app = app
        self._refusal = refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refused = await self._refusal(Request(scope, receive))
            if refused is not None:
                await refused(scope, receive, send)
                return
        await self._app(scope, receive, send)


def _not_json(request: Request) -> Response | None:
    """400 for a POST whose body is not JSON: a form, which any page can send without asking."""
    if request.method != "POST" or request.headers.get("content-type", "").lower().startswith("application/json"):
        return None
    return PlainTextResponse("tghost inspect takes JSON only: POST with 'Content-Type: application/json'",
                             status_code=400)


def _foreign_host(request: Request, hosts: Sequence[str]) -> Response | None:
    """421 for a request whose ``Host`` is none of ``hosts`` (:func:`tghost.adapters.web.allowed_host_patterns`):
    a name that is not the inspector's may be an attacker's, rebound to this address (DNS rebinding)."""
    host = request.headers.get("host", "")
    if is_allowed_host(host, hosts):
        return None
    return PlainTextResponse(f"tghost inspect does not answer to the name {host!r}: open it at localhost, or start "
                             "it with --allowed-host NAME for each name browsers use", status_code=421)


def _foreign_origin(request: Request) -> Response | None:
    """403 for a request whose ``Origin`` is another page's than the inspector's own: a web page
    elsewhere, on another loopback port too, never calls tools with the inspector's identity."""
    origin, host = request.headers.get("origin"), request.headers.get("host", "")
    if origin is None or is_own_origin(origin, host):
        return None
    return PlainTextResponse(f"tghost inspect answers its own page only, and this request comes from another: "
                             f"Origin {origin!r}; open the inspector at http://{host}/ and call from there",
                             status_code=403)


def _ndjson(lines: AsyncIterator[dict[str, Any]]) -> Response:
    async def encoded() -> AsyncIterator[bytes]:
        async for line in lines:
            yield (json.dumps(line) + "\n").encode()
    return StreamingResponse(encoded(), media_type="application/x-ndjson", headers={"Cache-Control": "no-store"})


def _static_file(name: str) -> str:
    return str(files(_STATIC[0]).joinpath(_STATIC[1], name))
