"""untrusted: what the hosts that a directory's trusted keys ignore say they serve, kept as a hint
for a call that no trusted host serves ("2 unsigned host(s) serve it; --trusted-key ignores
them"). Read from the ignored messages themselves, never validated, never applied, and bounded
(docs/internals/scale.md): a flood of forged names costs at most :data:`MAX_UNTRUSTED_ENTRIES`
names and ``max_hosts`` host ids, each short (a name as descriptors have them, a host id of at most
:data:`MAX_HOST_ID` printable characters: a message with others is skipped), and past those the
hint undercounts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from tghost.protocol.descriptors import NAME_PATTERN

__all__ = ["MAX_HOST_ID", "MAX_UNTRUSTED_ENTRIES", "Untrusted"]

#: (kind, name) of a tool service or tool.
Key = tuple[str, str]

#: Entries (a host announcing a tool or tool service) of ignored hosts held at once; further ones are not noted.
MAX_UNTRUSTED_ENTRIES = 10_000
#: The longest host id noted (characters); a longer one is skipped, as is one a terminal would not print as it is.
MAX_HOST_ID = 256
_NAME = re.compile(NAME_PATTERN)


class Untrusted:
    """The entries that ignored hosts announce available, and how long each host's lease runs
    (from its host messages: the broker's publish time plus its lease, at most ``max_lease``
    seconds). :meth:`note` takes each ignored message's decoded value; :meth:`serving` answers
    which of those hosts, live now, announce an entry, and why each is ignored."""

    def __init__(self, max_hosts: int, max_lease: float, max_entries: int = MAX_UNTRUSTED_ENTRIES) -> None:
        self.max_hosts = max_hosts
        self.max_lease = max_lease
        self.max_entries = max_entries
        self._leases: dict[str, float] = {}
        """Host id -> when (unix seconds) its lease ends, from its last host message."""
        self._reasons: dict[str, str] = {}
        """Host id -> why its last message was ignored (``unsigned``, ``unknown-key``, ``bad-signature``)."""
        self._holders: dict[Key, set[str]] = {}
        self._keys: dict[str, set[Key]] = {}
        self._held = 0

    def note(self, value: Mapping[str, Any], reason: str, publish_time: float) -> None:
        """Note an ignored message's decoded ``value`` (ignored for ``reason``, published by the
        broker at ``publish_time``, unix seconds). A value without the fields it needs is skipped,
        and so is one whose host id or entry name no genuine announcement has (see the module's
        bounds): nothing vouches for them, and a no-provider line prints them."""
        host, kind, name, status = value.get("host"), value.get("kind"), value.get("name"), value.get("status")
        host_id = host.get("id") if isinstance(host, dict) else None
        if not isinstance(host_id, str) or not isinstance(name, str) or kind not in ("host", "tool", "tool-service"):
            return
        if not (0 < len(host_id) <= MAX_HOST_ID and host_id.isprintable()) or (
                kind != "host" and not _NAME.fullmatch(name)):
            return
        if host_id not in self._reasons and not self._room_for_a_host(publish_time):
            return
        self._reasons[host_id] = reason
        if kind == "host":
            self._lease(host_id, value.get("lease"), status, publish_time)
        elif status == "available":
            self._hold((kind, name), host_id)
        else:
            self._drop((kind, name), host_id)

    def serving(self, key: Key, now: float) -> dict[str, str]:
        """Host id -> why it is ignored, of each ignored host whose lease runs at ``now`` (unix
        seconds) and that announces ``key`` available, by id."""
        return {host_id: self._reasons[host_id] for host_id in sorted(self._holders.get(key, ()))
                if self._leases.get(host_id, 0.0) > now}

    def _lease(self, host_id: str, lease: Any, status: Any, publish_time: float) -> None:
        seconds = lease.get("seconds") if isinstance(lease, dict) else None
        if status != "available" or not isinstance(seconds, int | float):
            self._forget(host_id)
            return
        self._leases[host_id] = publish_time + min(float(seconds), self.max_lease)

    def _room_for_a_host(self, now: float) -> bool:
        """Whether a new host id may be noted: under ``max_hosts``, once the hosts whose lease
        ended before ``now`` are forgotten (looked for only when full)."""
        if len(self._reasons) < self.max_hosts:
            return True
        for host_id in [h for h in self._reasons if self._leases.get(h, 0.0) <= now]:
            self._forget(host_id)
        return len(self._reasons) < self.max_hosts

    def _hold(self, key: Key, host_id: str) -> None:
        keys = self._keys.setdefault(host_id, set())
        if key in keys or self._held >= self.max_entries:
            return
        keys.add(key)
        self._holders.setdefault(key, set()).add(host_id)
        self._held += 1

    def _drop(self, key: Key, host_id: str) -> None:
        keys = self._keys.get(host_id)
        if keys is not None and key in keys:
            keys.discard(key)
            self._release(key, host_id)

    def _release(self, key: Key, host_id: str) -> None:
        holders = self._holders[key]
        holders.discard(host_id)
        if not holders:
            del self._holders[key]
        self._held -= 1

    def _forget(self, host_id: str) -> None:
        for key in self._keys.pop(host_id, set()):
            self._release(key, host_id)
        self._leases.pop(host_id, None)
        self._reasons.pop(host_id, None)
