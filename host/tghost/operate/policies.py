"""policies: one access policy per service, as a host applies it (docs/protocol.md §2.8): what
the other live providers of its services announce, read from the host's own directory of its
announcement topics (:class:`DirectoryPeers`, the :class:`tghost.serving.access.Peers` its
fleet check asks), and its services whose providers announce different access policies, in
words (:func:`mismatch_problems`, for ``/health``). Never changes what the host announces.
"""

from __future__ import annotations

from tghost.agent.directory import ToolDirectory

__all__ = ["DirectoryPeers", "mismatch_problems"]


class DirectoryPeers:
    """The other live providers of a service, as ``directory`` (following this host's
    announcement topics) sees them; ``host_id`` is this host's. Safe from any thread: it only
    reads the directory's current entries, which are replaced, never changed."""

    def __init__(self, directory: ToolDirectory, host_id: str) -> None:
        self.directory = directory
        self.host_id = host_id

    def policies(self, service: str) -> set[str | None]:
        """The ``access-policy`` each other live provider of ``service`` announces (``None``: one
        that predates it); empty when no other host serves it."""
        entry = self.directory.services.get(service)
        if entry is None:
            return set()
        return {p.policy for p in entry.providers if p.host.get("id") != self.host_id and not p.external}

    def forbidding(self, tool: str, key_id: str | None) -> str | None:
        """The id of another live provider of ``tool`` whose announced access does not admit a
        caller with ``key_id`` (``None``: anonymous), else ``None``."""
        entry = self.directory.tools.get(tool)
        for provider in entry.providers if entry is not None else ():
            host = str(provider.host.get("id"))
            if host != self.host_id and provider.access is not None and not provider.access.admits(key_id):
                return host
        return None


def mismatch_problems(directory: ToolDirectory, host_id: str) -> list[str]:
    """One line per service that host ``host_id`` serves whose live providers announce different
    access policies (docs/protocol.md §4.8), naming each policy's hosts and what to do."""
    return [entry.mismatch() for _, entry in sorted(directory.services.items())
            if entry.policy_mismatch and any(p.host.get("id") == host_id for p in entry.providers)]
