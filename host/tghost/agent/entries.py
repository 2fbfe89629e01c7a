"""entries: what a directory holds once it has resolved the hosts' claims: a live tool service
(:class:`ServiceEntry`, with the versions of its code when its providers disagree:
:class:`CodeVersion`, :func:`skew_of`), a live tool (:class:`DirectoryTool`), and a change to the
live tool set (:class:`Change`); which hosts on this machine serve an installed plugin at other
code than installed (:func:`old_code`). Plain data, shared by the directory and its calls. :meth:`DirectoryTool.to_json`
is the one JSON shape of a tool for programs (``tghost tools --json``, ``tghost watch --json``,
the inspector).
"""

from __future__ import annotations

import functools
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tghost.agent.ledger import Provider
from tghost.protocol.access import ToolAccess
from tghost.protocol.descriptors import ToolDescriptor, ToolServiceDescriptor, schema_of_arguments

__all__ = ["Change", "CodeVersion", "DirectoryTool", "ServiceEntry", "Side", "describe_old_code", "describe_skew",
           "input_schema", "old_code", "policy_mismatch", "skew_of"]


def input_schema(tool: ToolDescriptor) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12 object schema) of the tool's arguments: its ``input-schema``
    if it has one (a tghost host announces the schema it checks, :attr:`tghost.ToolService.arguments_schema`),
    else built from its seed 000 ``arguments`` list (:func:`tghost.protocol.descriptors.schema_of_arguments`)."""
    if tool.input_schema is not None:
        return dict(tool.input_schema)
    return schema_of_arguments(tool.arguments)


@dataclass(frozen=True)
class Side:
    """One side of a conflict, or of a drift (docs/protocol.md §4.8): the ``host`` id(s)
    (comma-separated), the ``service`` id its claim names and, for a claim on a service id, its
    ``request_queue``. ``differs``: for a drift, the descriptor fields (their wire names, and
    ``access`` for a tool's) in which its claim differs from the one applied."""

    host: str
    service: str
    request_queue: str = ""
    differs: tuple[str, ...] = ()

    def describe(self) -> str:
        """``service 'x' on TOPIC from host h``, and for a drift ``, announced with another timeout``
        (a tool's fields: ``another tool description``)."""
        where = f" on {self.request_queue}" if self.request_queue else ""
        of = "" if self.request_queue else "tool "
        differs = f", announced with another {of}{', '.join(self.differs)}" if self.differs else ""
        return f"service {self.service!r}{where} from host {self.host}{differs}"

    @classmethod
    def from_json(cls, side: dict[str, Any]) -> Side:
        """The side :meth:`to_json` gave."""
        return cls(side["host"], side["service"], side.get("request_queue", ""), tuple(side.get("differs", ())))

    def to_json(self) -> dict[str, Any]:
        """``{"host", "service", "request_queue", "differs"}``, ``request_queue`` only for a claim on a
        service id, ``differs`` (a list) only for a drift."""
        side: dict[str, Any] = {"host": self.host, "service": self.service}
        if self.request_queue:
            side["request_queue"] = self.request_queue
        return {**side, "differs": list(self.differs)} if self.differs else side


@dataclass(frozen=True)
class CodeVersion:
    """One version of a tool service's code that live providers serve, as their ``plugin`` objects
    announce it (docs/protocol.md §4.3): the ``distribution`` and its ``version`` (``None``: a
    service not from a distribution), the ``fingerprint`` of its files (``None``: not announced),
    and the ids of the ``hosts`` serving it, in the order the directory saw them."""

    distribution: str | None
    version: str | None
    fingerprint: str | None
    hosts: tuple[str, ...]

    def describe(self) -> str:
        """``tghost-joke 0.1.0 (code 5cd7fb336cb5) on host(s) h1, h2``: the fingerprint's first 12 hex digits."""
        code = f" (code {self.fingerprint[:12]})" if self.fingerprint else ""
        name = self.distribution or "no distribution"
        return f"{name} {self.version or '(no version)'}{code} on host(s) {', '.join(self.hosts)}"

    @classmethod
    def from_json(cls, version: dict[str, Any]) -> CodeVersion:
        """The version :meth:`to_json` gave."""
        return cls(version.get("distribution"), version.get("version"), version.get("fingerprint"),
                   tuple(version["hosts"]))

    def to_json(self) -> dict[str, Any]:
        """``{"distribution", "version", "fingerprint", "hosts"}``; a field without a value is left out."""
        shape = {"distribution": self.distribution, "version": self.version, "fingerprint": self.fingerprint,
                 "hosts": list(self.hosts)}
        return {key: value for key, value in shape.items() if value is not None}


def _code(provider: Provider) -> tuple[str | None, str | None, str | None]:
    """What the provider's ``plugin`` object says of its code: (distribution, version, fingerprint)."""
    plugin = provider.plugin or {}
    fields = (plugin.get(key) for key in ("distribution", "version", "fingerprint"))
    distribution, version, fingerprint = (None if value is None else str(value) for value in fields)
    return distribution, version, fingerprint


def skew_of(providers: Iterable[Provider]) -> tuple[CodeVersion, ...]:
    """The versions of a service's code its ``providers`` serve (docs/protocol.md §4.8 skew),
    the first provider's first, when they disagree on distribution, version or fingerprint; ``()``
    when they agree. External providers serve nothing and do not count; one without a
    fingerprint (a host that predates it) agrees with every fingerprint of its distribution and
    version."""
    hosts: dict[tuple[str | None, str | None, str | None], list[str]] = {}
    for provider in providers:
        if not provider.external:
            hosts.setdefault(_code(provider), []).append(str(provider.host.get("id")))
    fingerprinted = {code[:2] for code in hosts if code[2] is not None}
    versions = [CodeVersion(*code, tuple(dict.fromkeys(ids))) for code, ids in hosts.items()
                if code[2] is not None or code[:2] not in fingerprinted]
    return tuple(versions) if len(versions) > 1 else ()


def describe_skew(service_id: str, skew: Iterable[CodeVersion]) -> str:
    """The one sentence every view says of a skewed service: each version of its code with its
    hosts (:meth:`CodeVersion.describe`), and what to do."""
    return (f"tool service {service_id!r} is skewed: its hosts serve different code: "
            f"{'; '.join(version.describe() for version in skew)}. A call goes to any of them, so the same call may "
            "get different answers: finish the upgrade, or restart the hosts on one version")


def old_code(services: Iterable[ServiceEntry], installed: Mapping[str, Any],
             hostname: str | None = None) -> tuple[CodeVersion, ...]:
    """The versions of an installed plugin's code, other than the installed one, that live hosts
    on this machine (``hostname``, default :func:`socket.gethostname`) serve: hosts started before
    it was edited or upgraded, without ``--reload``. ``installed`` is the plugin as a host starting
    here would announce it (docs/protocol.md §4.3 ``plugin``: ``entry_point``, ``distribution``,
    ``version``, ``fingerprint``). A provider of any of ``services`` serves it when its ``plugin``
    names the same entry point and distribution, at other code when it gives another version, or
    another fingerprint where both give one (:func:`skew_of`'s rule). Each version once, with its
    hosts in the order seen; ``()`` when there is none (or ``installed`` has no distribution).
    Hosts elsewhere serve their own machine's install, and are left out."""
    here = socket.gethostname() if hostname is None else hostname
    mine = (installed.get("distribution"), installed.get("version"), installed.get("fingerprint"))
    hosts: dict[tuple[str | None, str | None, str | None], list[str]] = {}
    for provider in (provider for service in services for provider in service.providers):
        code = _code(provider)
        if (mine[0] is None or provider.external or provider.host.get("hostname") != here or code[0] != mine[0]
                or (provider.plugin or {}).get("entry_point") != installed.get("entry_point")):
            continue
        if code[1] != mine[1] or (None not in (code[2], mine[2]) and code[2] != mine[2]):
            hosts.setdefault(code, []).append(str(provider.host.get("id")))
    return tuple(CodeVersion(*code, tuple(dict.fromkeys(ids))) for code, ids in hosts.items())


def describe_old_code(what: str, installed_version: str | None, versions: Sequence[CodeVersion]) -> str:
    """What :func:`old_code` found, in one sentence: ``host h1 serves plugin 'textkit' at its old
    code (before your edit): restart it or run it with --reload``; ``what`` names the plugin, and
    each version other than ``installed_version`` is said as ``(version 0.1.0; installed here:
    0.2.0)``. ``""`` for no versions."""
    clauses: list[str] = []
    for version in versions:
        why = ("before your edit" if version.version == installed_version
               else f"version {version.version or '?'}; installed here: {installed_version or '?'}")
        one = len(version.hosts) == 1
        clauses.append(f"host{'' if one else 's'} {', '.join(version.hosts)} serve{'s' if one else ''} "
                       f"{'it' if clauses else what} at its old code ({why})")
    them = "it" if len({host for version in versions for host in version.hosts}) == 1 else "them"
    return f"{'; '.join(clauses)}: restart {them} or run {them} with --reload" if clauses else ""


@dataclass(frozen=True)
class ServiceEntry:
    """A live tool service and every host whose lease on it is alive, in the order the
    directory saw them: its ``descriptor`` is the first one's (the claim of record).
    ``rivals``: the hosts that announce its id, live or lately, with other queues or config
    params. ``drift``: the providers whose descriptor differs from the one applied otherwise
    (``timeout``, ``description``, ``max-concurrency``; docs/protocol.md §4.8). ``skew``: every
    version of its code the providers serve when they disagree (:func:`skew_of`), else empty."""

    descriptor: ToolServiceDescriptor
    providers: tuple[Provider, ...]
    rivals: tuple[Side, ...] = ()
    drift: tuple[Side, ...] = ()
    skew: tuple[CodeVersion, ...] = ()

    @functools.cached_property
    def policies(self) -> dict[str, tuple[str, ...]]:
        """Each ``access-policy`` its live providers announce (docs/protocol.md §4.3: a fingerprint
        of the access rules a host applies to the service, ``"none"`` for no policy) -> the ids of
        the hosts announcing it, sorted (computed once: the entry is replaced when they change).
        Providers that announce none (they predate it, or announce the service as external) are
        left out."""
        hosts: dict[str, set[str]] = {}
        for provider in self.providers:
            if provider.policy is not None:
                hosts.setdefault(provider.policy, set()).add(str(provider.host.get("id")))
        return {policy: tuple(sorted(ids)) for policy, ids in sorted(hosts.items())}

    def mismatch(self) -> str:
        """The policy mismatch in words (``""`` while the providers agree): who announces which
        access policy, what every host does meanwhile, and what to do."""
        if not self.policy_mismatch:
            return ""
        sides = "; ".join(f"{policy} on host(s) {','.join(hosts)}" for policy, hosts in self.policies.items())
        return (f"service {self.descriptor.id!r} is served under different access policies ({sides}): each of its "
                "hosts refuses ('unauthorized') what any of them forbids until they agree; give every host of the "
                "service the same [access] policy (or none)")

    @property
    def policy_mismatch(self) -> bool:
        """Whether its live providers announce different access policies (docs/protocol.md §4.8):
        then each of them, and every directory, admits a caller only where all of them do."""
        return len(self.policies) > 1


@dataclass(frozen=True)
class DirectoryTool:
    """A live tool: its descriptor, its service, and the hosts announcing it, in the order the
    directory saw them: the descriptor and access are the first one's (the claim of record).
    ``rivals``: the hosts that announce its name, live or lately, over another service or with
    other config values (its service's rivals are in ``service.rivals``). ``drift``: the
    providers that announce it with another descriptor or access otherwise (its service's drift
    is in ``service.drift``)."""

    descriptor: ToolDescriptor
    service: ServiceEntry
    providers: tuple[Provider, ...]
    rivals: tuple[Side, ...] = ()
    drift: tuple[Side, ...] = ()

    @property
    def _announced(self) -> ToolAccess | None:
        """Who may call the tool (``None``: everyone): as the host seen first announces it, or,
        while its service's providers announce different policies, those every provider admits
        (a provider with no policy admits a caller with a key only where all admit anonymous ones)."""
        if not self.service.policy_mismatch:
            return self.providers[0].access if self.providers else None
        common = _common([p.access for p in self.providers if p.access is not None])
        if common is None or all(p.access is not None for p in self.providers if not p.external):
            return common
        # a provider without a policy takes every caller as anonymous (docs/protocol.md §2.8): it
        # admits a caller with a key only where every provider admits anonymous callers
        return common if common.anonymous else ToolAccess(False)

    def admits(self, key_id: str | None) -> bool:
        """Whether a caller with this key id (``None``: anonymous) may call the tool, as the host
        seen first announces it (docs/protocol.md §4.3 ``access``: the providers whose access
        differs are its :attr:`drift`); while the service's providers announce different access
        policies (:attr:`ServiceEntry.policy_mismatch`), only where every provider admits it."""
        return self._announced is None or self._announced.admits(key_id)

    def access(self) -> str:
        """Who may call it, in words: ``everyone``, or ``anonymous`` and the callers, by the name
        the announcing host gives each (else its key id), or ``nobody`` (see :meth:`admits`)."""
        announced = self._announced
        return "everyone" if announced is None else announced.describe()

    @property
    def contested(self) -> bool:
        """Whether another host claims this tool's name or its service id differently."""
        return bool(self.rivals or self.service.rivals)

    @property
    def drifted(self) -> bool:
        """Whether a provider announces this tool or its service with another descriptor than the
        one applied (calls go ahead, with the one applied)."""
        return bool(self.drift or self.service.drift)

    @property
    def skewed(self) -> bool:
        """Whether the providers of its service serve different versions of its code (calls go
        to any of them, so one call may be answered by either version)."""
        return bool(self.service.skew)

    def sides(self) -> list[Side]:
        """Every side of its conflicts: first the live claims that win (the claims seen first),
        then the rivals of the tool and of its service."""
        first = Side(",".join(sorted({str(p.host.get("id")) for p in self.providers})), self.service.descriptor.id,
                     self.service.descriptor.request_queue)
        return [first, *self.rivals, *self.service.rivals]

    def to_json(self) -> dict[str, Any]:
        """The tool for programs, the one shape every command and API gives:
        ``name``, ``title``, ``description``, ``service``, ``arguments``, ``input-schema``
        (:func:`input_schema`), ``output-schema`` and ``annotations`` (the hints set; docs/protocol.md
        §3.3), ``group``, ``state`` and ``available_in_states`` (seed 001; left out when unset), ``config``
        (its config values, only there), ``providers`` (host ids), ``external`` (a provider
        announces its service as served elsewhere), ``access`` (:meth:`access`), ``conflicts``
        (the other side of each conflict over its name or service: :meth:`Side.to_json`) and
        ``drift`` (each provider announcing it or its service with another descriptor, with the
        fields that differ), ``policy_mismatch`` (while its service's providers announce different
        access policies: ``{"policy", "hosts"}`` per policy) and ``skew`` (each version of its
        service's code when its providers serve more than one: :meth:`CodeVersion.to_json`). No
        ``null``: a field without a value is left out."""
        d = self.descriptor
        shape: dict[str, Any] = {
            "name": d.name, "title": d.title, "description": d.description, "service": d.service,
            "arguments": [a.model_dump() for a in d.arguments], "input-schema": input_schema(d),
            "output-schema": d.output_schema,
            "annotations": None if d.annotations is None else d.annotations.to_json_dict() or None,
            "group": list(d.group), "state": d.state,
            "available_in_states": None if d.available_in_states is None else list(d.available_in_states),
            "config": d.config, "providers": [p.host["id"] for p in self.providers],
            "external": any(p.external for p in self.service.providers), "access": self.access(),
            "conflicts": [side.to_json() for side in self.sides()[1:]] if self.contested else [],
            "drift": [side.to_json() for side in (*self.drift, *self.service.drift)],
            "policy_mismatch": policy_mismatch(self.service),
            "skew": [version.to_json() for version in self.service.skew],
        }
        return {key: value for key, value in shape.items() if value is not None}


def policy_mismatch(service: ServiceEntry) -> list[dict[str, Any]]:
    """``[{"policy", "hosts"}]``, one per access policy the service's live providers announce,
    while they announce different ones; ``[]`` while they agree."""
    if not service.policy_mismatch:
        return []
    return [{"policy": policy, "hosts": list(hosts)} for policy, hosts in service.policies.items()]


def _common(accesses: list[ToolAccess]) -> ToolAccess | None:
    """Who every one of ``accesses`` admits (``None`` when there is none: everyone), with the
    names any of them gives."""
    if not accesses:
        return None
    keys = set.intersection(*(set(a.keys) for a in accesses))
    names = {k: n for a in accesses for k, n in a.names if k in keys}
    return ToolAccess(all(a.anonymous for a in accesses), tuple(sorted(keys)), tuple(sorted(names.items())))


@dataclass(frozen=True)
class Change:
    """A change to the live tool set: ``added``, ``updated``, ``removed`` (withdrawn) or ``expired``."""

    kind: Literal["added", "updated", "removed", "expired"]
    name: str
    tool: DirectoryTool | None

    def to_json(self) -> dict[str, Any]:
        """``{"change": kind, ...}`` and the tool (:meth:`DirectoryTool.to_json`; for ``removed`` and
        ``expired`` as it was last), or only its ``name`` when the tool is unknown."""
        return {"change": self.kind, **(self.tool.to_json() if self.tool else {"name": self.name})}
