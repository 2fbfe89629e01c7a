"""view: what one agent sees of a directory and where it stands: the live tools a seed 001
request with its groups and current state may use, narrowed by a :class:`Selection`, and calls
that carry those groups and move the state as each call succeeds. The MCP bridge and every
framework integration (:mod:`tghost.integrations`) are built on it, so each rule is written once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any

from tghost.agent.client import ToolCallError
from tghost.agent.search import MAX_LIMIT, Found
from tghost.protocol import wire
from tghost.protocol.descriptors import ToolDescriptor
from tghost.protocol.groups import next_state

if TYPE_CHECKING:
    from tghost.agent.directory import ToolDirectory

__all__ = ["Selection", "ToolView"]


@dataclass(frozen=True)
class Selection:
    """Which of the tools a request may use are served: with ``read_only``, only those hinted
    read-only (:attr:`tghost.protocol.ToolDescriptor.read_only`); with ``include`` globs, only
    those whose name matches one of them; never one whose name matches an ``exclude`` glob. Globs
    are shell patterns (``*``, ``?``, ``[seq]``), case-sensitive (:func:`fnmatch.fnmatchcase`).
    The default, ``Selection()``, serves them all."""

    read_only: bool = False
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    @property
    def narrows(self) -> bool:
        """Whether it leaves any tool out."""
        return self.read_only or bool(self.include or self.exclude)

    def refusal(self, name: str, tool: ToolDescriptor | None) -> str | None:
        """Why the tool ``name`` (its descriptor ``tool``; ``None`` if it is not live) is left
        out, e.g. ``"it is not hinted read-only"``; ``None`` if it is in (a tool that is not
        live is left out only by its name)."""
        excluded = [glob for glob in self.exclude if fnmatchcase(name, glob)]
        if excluded:
            return f"its name matches the excluded {excluded[0]!r}"
        if self.include and not any(fnmatchcase(name, glob) for glob in self.include):
            return f"its name matches none of the included {', '.join(map(repr, self.include))}"
        if self.read_only and tool is not None and not tool.read_only:
            return "it is not hinted read-only, and only read-only tools are served here"
        return None

    def select(self, tools: list[ToolDescriptor]) -> list[ToolDescriptor]:
        """The tools of ``tools`` it serves, in their order (``tools`` itself when it narrows nothing)."""
        if not self.narrows:
            return tools
        return [tool for tool in tools if self.refusal(tool.name, tool) is None]


class ToolView:
    """One agent's view of ``directory``: the tools a request with ``groups`` (``None``: the
    ``default`` group; ``["*"]``: every group) and the current :attr:`state` (seed 001) may use,
    narrowed by ``include``/``exclude`` globs and ``read_only`` (:class:`Selection`), and calls
    of them as ``user`` with ``timeout`` (seconds; ``None``: the service's own).

    Each successful call moves :attr:`state` to the tool's ``state``, if it has one (seed 001
    §4.2, :func:`tghost.next_state`), so the next :meth:`tools` offers what the new state allows.
    A view is one conversation's: :meth:`fork` gives another at the starting state.
    """

    def __init__(self, directory: ToolDirectory, *, groups: Sequence[str] | None = None, state: str | None = None,
                 include: Sequence[str] = (), exclude: Sequence[str] = (), read_only: bool = False,
                 user: str | None = None, timeout: float | None = None) -> None:
        self.directory = directory
        self.groups = None if groups is None else list(groups)
        self.initial_state = state
        self.state = state
        """The seed 001 state the next call is made in (``None``: ``undefined``)."""
        self.selection = Selection(read_only, tuple(include), tuple(exclude))
        self.user = user
        self.timeout = timeout
        self._selected: tuple[list[ToolDescriptor] | None, list[ToolDescriptor], frozenset[str]] = (
            None, [], frozenset())
        """The directory's list last seen, what the selection keeps of it, and their names."""

    def fork(self) -> ToolView:
        """A new view with the same directory, groups, selection, user and timeout, at the state
        this one started in: one per conversation or agent run."""
        return ToolView(self.directory, groups=self.groups, state=self.initial_state, include=self.selection.include,
                        exclude=self.selection.exclude, read_only=self.selection.read_only, user=self.user,
                        timeout=self.timeout)

    def tools(self) -> list[ToolDescriptor]:
        """The tools this view offers now, sorted by name: the live tools the directory makes
        available to its groups, state (and identity), narrowed by its selection. Cheap: the
        directory caches its list until the tool set changes, and the view what it selects of it."""
        available = self.directory.available(self.groups, self.state, self.selection.read_only)
        if self._selected[0] is not available:
            selected = self.selection.select(available)
            self._selected = (available, selected, frozenset(tool.name for tool in selected))
        return self._selected[1]

    def offers(self, name: str) -> bool:
        """Whether :meth:`tools` holds tool ``name`` now (a set lookup)."""
        self.tools()
        return name in self._selected[2]

    def reachable(self) -> list[ToolDescriptor]:
        """The tools :meth:`tools` offers now or in any seed 001 state that calls of this view's
        own tools can move it to, from the current :attr:`state` on, sorted by name: every tool an
        agent with a fixed list of tools may come to call. :attr:`state` stays where it is."""
        probe = self.fork()
        found: dict[str, ToolDescriptor] = {}
        seen: set[str | None] = set()
        pending: list[str | None] = [self.state]
        while pending:
            probe.state = pending.pop()
            seen.add(probe.state)
            for tool in probe.tools():
                found[tool.name] = tool
                if tool.state not in seen and tool.state not in pending:
                    pending.append(tool.state)
        return [found[name] for name in sorted(found)]

    def search(self, query: str, limit: int = 10) -> list[Found]:
        """The tools of :meth:`tools` that best match ``query`` (plain language), best first, at
        most ``limit`` (:meth:`tghost.ToolDirectory.search`).

        Raises:
            tghost.SearchError: the query has no words, or ``limit`` is out of range (1..1000).
        """
        wide = MAX_LIMIT if self.selection.narrows else limit
        found = self.directory.search(query, wide, self.groups, self.state, self.selection.read_only)
        kept = [hit for hit in found if self.selection.refusal(hit.tool.descriptor.name, hit.tool.descriptor) is None]
        return kept[:limit]

    def refusal(self, name: str) -> str | None:
        """Why tool ``name`` is outside this view's selection (e.g. ``"its name matches the
        excluded 'x-*'"``), or ``None`` if the selection lets it in (the directory may still
        refuse it: not live, not available in this state)."""
        live = self.directory.tools.get(name)
        return self.selection.refusal(name, None if live is None else live.descriptor)

    async def invoke(self, name: str, arguments: dict[str, Any], *,
                     progress: Callable[[wire.Progress], Any] | None = None) -> str | dict[str, Any]:
        """Call tool ``name`` with ``arguments`` in this view's groups and state, as its user,
        and return the observation (the JSON object, for a tool with an output schema). On
        success :attr:`state` moves as the tool says. ``progress`` gets the tool's progress
        updates (docs/protocol.md §2.12). Cancelling the task cancels the call on its host.

        Raises:
            tghost.ToolCallError: ``not-allowed`` when the tool is outside this view's selection
                (the message says why); otherwise as :meth:`tghost.ToolDirectory.invoke`
                (``unknown-tool``, ``no-provider``, ``invalid-arguments``, ``timeout``, ...).
        """
        refusal = self.refusal(name)
        if refusal is not None:
            raise ToolCallError(wire.NOT_ALLOWED, f"tool {name!r} is outside this agent's tools: {refusal}")
        live = self.directory.tools.get(name)
        observation = await self.directory.invoke(name, arguments, user=self.user, groups=self.groups,
                                                  state=self.state, timeout=self.timeout, progress=progress)
        if live is not None:
            self.state = next_state(live.descriptor, self.state, succeeded=True)
        return observation
