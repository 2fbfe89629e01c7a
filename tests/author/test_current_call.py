"""current_call: a ``ToolService`` subclass's ``invoke``, plain or ``async``, sees its call through
``tghost.current_context()`` and ``tghost.current_caller()`` while it runs, awaited or not; outside
a call both are ``None``."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import tghost
from tghost.author.service import Call, invoke
from tghost.protocol.callers import Caller
from tghost.protocol.wire import Progress


class Plain(tghost.ToolService):
    id = "plain"

    def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> Any:
        return seen()


class Awaited(tghost.ToolService):
    id = "awaited"

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> Any:
        await asyncio.sleep(0)  # past the first await: the coroutine runs in its awaiting task
        return seen()


def seen() -> tuple[Any, ...]:
    """What the running invoke sees of its call; reports progress 1 of 2 through the context."""
    context = tghost.current_context()
    assert context is not None
    context.progress(1, 2, "half")
    return context.user, context.config, context.caller, context.cancelled, tghost.current_caller()


def a_call() -> tuple[Call, list[Progress]]:
    updates: list[Progress] = []
    caller = Caller("alice", "k1")
    return Call("ada", {"tool": "t"}, {}, caller, threading.Event(), updates.append), updates


def test_a_plain_invoke_sees_its_call() -> None:
    call, updates = a_call()
    assert invoke(Plain(), call) == ("ada", {"tool": "t"}, call.caller, call.cancelled, call.caller)
    assert updates == [Progress(1, 2, "half")]


async def test_an_async_invoke_sees_its_call_while_it_is_awaited() -> None:
    call, updates = a_call()
    assert await invoke(Awaited(), call) == ("ada", {"tool": "t"}, call.caller, call.cancelled, call.caller)
    assert updates == [Progress(1, 2, "half")]


def test_outside_a_call_there_is_no_context_and_no_caller() -> None:
    assert (tghost.current_context(), tghost.current_caller()) == (None, None)
