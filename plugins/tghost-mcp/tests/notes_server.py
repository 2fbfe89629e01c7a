"""notes_server: the MCP server the tests mount, written with the SDK's ``MCPServer`` (mcp 2.x's
FastMCP): a memory (``remember`` writes, ``recall`` reads back, with hints), a typed result
(``word_count``, an output schema), ``progress`` (MCP progress notifications), ``sleep`` (a slow
tool to cancel: it writes ``cancelled`` to ``$NOTES_LOG`` when cancelled), ``grow`` (adds a tool,
then sends ``notifications/tools/list_changed``), ``crash`` (``os._exit``), ``fail`` (an
``isError`` result), ``pid``, and a tool whose name is no tghost name (``say hello``).

``python notes_server.py`` serves it on stdio; ``python notes_server.py --http PORT [TOKEN]`` on
streamable HTTP at ``http://127.0.0.1:PORT/mcp`` (answering 401 without ``Bearer TOKEN``).
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import TypedDict

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

server = MCPServer("notes")
NOTES: dict[str, str] = {}


def note(line: str) -> None:
    """Append ``line`` to the file ``$NOTES_LOG`` names, if any (what the tests read back)."""
    if path := os.environ.get("NOTES_LOG"):
        with open(path, "a") as log:
            log.write(line + "\n")


@server.tool(title="Remember a note", structured_output=False, annotations=ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False))
def remember(key: str, text: str) -> str:
    """Remember a text under a key."""
    NOTES[key] = text
    return f"remembered {key}"


@server.tool(structured_output=False, annotations=ToolAnnotations(title="Recall a note", read_only_hint=True))
def recall(key: str) -> str:
    """Recall the text remembered under a key."""
    return NOTES.get(key, f"nothing remembered under {key}")


class Count(TypedDict):
    words: int
    longest: str


@server.tool()
def word_count(text: str) -> Count:
    """Count the words of a text, and find the longest."""
    words = text.split()
    return Count(words=len(words), longest=max(words, key=len, default=""))


@server.tool(structured_output=False)
async def progress(steps: int, ctx: Context) -> str:
    """Report progress step by step; waits for the file $NOTES_GO before the last step, if set."""
    for step in range(1, steps + 1):
        await ctx.report_progress(step, steps, f"step {step}")
        while step == 1 and (go := os.environ.get("NOTES_GO")) and not os.path.exists(go):
            await asyncio.sleep(0.05)
    return f"done in {steps} steps"


@server.tool(structured_output=False)
async def sleep(seconds: float) -> str:
    """Sleep, then say so (logs 'cancelled' to $NOTES_LOG when cancelled)."""
    note("sleeping")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        note("cancelled")
        raise
    return "slept"


@server.tool(structured_output=False)
async def grow(name: str, ctx: Context) -> str:
    """Add a tool that echoes, named as asked, and tell the client the tool list changed."""

    def echo(text: str) -> str:
        return text

    server.add_tool(echo, name=name, description=f"Echo, added as {name}.", structured_output=False)
    await ctx.session.send_tool_list_changed()
    return f"added {name}"


@server.tool(structured_output=False)
def crash(code: int = 3) -> str:
    """Exit the server process at once, saying so on stderr."""
    print(f"notes: crashing on purpose with code {code}", file=sys.stderr, flush=True)
    os._exit(code)


@server.tool(structured_output=False)
def fail(reason: str) -> str:
    """Fail with the reason (an isError result)."""
    raise ToolError(reason)


@server.tool(structured_output=False)
def pid() -> str:
    """The server's process id."""
    return str(os.getpid())


@server.tool(name="say hello", structured_output=False)
def say_hello(name: str) -> str:
    """Greet someone (its name has a space: no tghost name)."""
    return f"hello {name}"


def http_app(token: str | None) -> object:
    """The streamable-HTTP app, answering 401 to a request without ``Bearer token`` if given."""
    app = server.streamable_http_app()
    if token is None:
        return app

    async def guarded(scope: dict, receive: object, send: object) -> None:
        headers = dict(scope.get("headers") or [])
        if scope["type"] == "http" and headers.get(b"authorization") != f"Bearer {token}".encode():
            await send({"type": "http.response.start", "status": 401, "headers": []})  # type: ignore[operator]
            await send({"type": "http.response.body", "body": b"no token"})  # type: ignore[operator]
            return
        await app(scope, receive, send)  # type: ignore[operator]

    return guarded


if __name__ == "__main__":
    print("notes: starting", file=sys.stderr, flush=True)
    note("started")
    if len(sys.argv) > 2 and sys.argv[1] == "--http":
        import uvicorn

        token = sys.argv[3] if len(sys.argv) > 3 else None
        uvicorn.run(http_app(token), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")  # type: ignore[arg-type]
    else:
        server.run()
