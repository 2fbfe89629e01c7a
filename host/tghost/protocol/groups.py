"""groups: seed 001's tool group and state rules, as pure functions.

Never does I/O and never changes a tool: the directory and agents call these.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

from tghost.protocol.descriptors import ToolDescriptor

__all__ = ["DEFAULT_GROUPS", "DEFAULT_STATE", "WILDCARD", "is_available", "next_state", "select"]

DEFAULT_GROUPS: tuple[str, ...] = ("default",)
DEFAULT_STATE = "undefined"
WILDCARD = "*"

T = TypeVar("T", bound=ToolDescriptor)


def is_available(tool: ToolDescriptor, groups: Sequence[str] | None = None, state: str | None = None) -> bool:
    """Seed 001 section 4.2: may a request with these groups, in this state, use the tool?

    A missing request group means ``["default"]``; ``"*"`` in it grants every tool and
    ``[]`` grants none. A missing state means ``"undefined"``. A tool without
    ``available_in_states`` is available in every state, as is one listing ``"*"``.
    """
    requested = DEFAULT_GROUPS if groups is None else groups
    current = DEFAULT_STATE if state is None else state
    group_ok = WILDCARD in requested or not set(tool.group).isdisjoint(requested)
    states = tool.available_in_states
    return group_ok and (states is None or current in states or WILDCARD in states)


def select(tools: Iterable[T], groups: Sequence[str] | None = None, state: str | None = None) -> list[T]:
    """The tools available to a request with these groups and state, in the given order."""
    return [tool for tool in tools if is_available(tool, groups, state)]


def next_state(tool: ToolDescriptor, current: str | None, succeeded: bool) -> str:
    """Seed 001 section 4.2: the state after calling ``tool``.

    Only a successful call moves to the tool's ``state``; a failed call, or a tool without
    ``state``, leaves the state as it was (a missing state is ``"undefined"``).
    """
    current = DEFAULT_STATE if current is None else current
    return tool.state if succeeded and tool.state is not None else current
