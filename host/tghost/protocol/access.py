"""access: who may call what on a host, as its ``[access]`` config table states it and its
announcements publish it (docs/protocol.md §2.8, §4.3).

Config (docs/guides/security.md "Who may call what")::

    [access]
    anonymous = ["tell-joke"]              # tools callers without a verified identity may use; "*" = all

    [access.callers.alice]
    public-key = "keys/alice.pub"          # a path relative to the config file, or the PEM itself
    tools = ["calculate", "solve-steps"]   # "*" = all
    rate = "30/minute"                     # optional: calls per period, per host (the `limits` notation)

A request is allowed only when the policy allows the caller every tool it is for
(:func:`tools_for`), so a tool's announced access, ``{"anonymous": bool, "keys": [key ids]}``,
is who may send the tool's own request: those allowed it and each tool over its service with
the same config values.

Pure data but for the caller key files a table names (read by :meth:`AccessPolicy.from_table`,
through :func:`tghost.protocol.trust.load_public_key`): never talks to Pulsar and never reads a request.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tghost.protocol.trust import KeyFileError, canonical_json, key_id, load_public_key

if TYPE_CHECKING:  # cryptography is imported where a key is read: an announcement's ToolAccess needs none
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from tghost.protocol.descriptors import ToolDescriptor

__all__ = ["ALL", "ANONYMOUS", "NO_POLICY", "AccessError", "AccessPolicy", "CallerGrant", "ToolAccess",
           "policy_fingerprint", "tools_for"]

#: In a tools list: every tool the host serves.
ALL = "*"
#: The name of a caller without a verified identity, in refusals, audit records and metrics.
ANONYMOUS = "anonymous"
#: The ``access-policy`` a host without an ``[access]`` policy announces for its services (docs/protocol.md §4.3).
NO_POLICY = "none"


class AccessError(ValueError):
    """An ``[access]`` table that cannot be used: the message names the table and the field."""


class _CallerTable(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, defer_build=True)  # built on first use

    public_key: str = Field(alias="public-key", min_length=1)
    tools: list[str] = Field(default_factory=list)
    rate: str | None = None

    @field_validator("rate")
    @classmethod
    def _rate(cls, value: str | None) -> str | None:
        if value is not None:
            from limits import parse

            try:
                parse(value)
            except ValueError:
                raise ValueError(f"{value!r} is not a rate: write e.g. '30/minute' or '5 per second'") from None
        return value


class _AccessTable(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)  # built on first use: only a host's [access] needs it

    anonymous: list[str] = Field(default_factory=list)
    callers: dict[str, _CallerTable] = Field(default_factory=dict)


@dataclass(frozen=True)
class CallerGrant:
    """One caller of an access policy: its ``name``, public ``key`` (and its id), the ``tools``
    it may call (``"*"``: all) and its ``rate`` (``None``: unlimited; the `limits` notation)."""

    name: str
    key: Ed25519PublicKey
    key_id: str
    tools: frozenset[str]
    rate: str | None = None


@dataclass(frozen=True)
class ToolAccess:
    """Who may call one tool, as announced: ``anonymous`` callers, and the callers whose key ids
    are in ``keys``; ``names``: (key id, the caller's name in the host's policy) pairs, for people
    to read (never an access decision)."""

    anonymous: bool
    keys: tuple[str, ...] = ()
    names: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        shape: dict[str, Any] = {"anonymous": self.anonymous, "keys": list(self.keys)}
        return shape | ({"names": dict(self.names)} if self.names else {})

    @classmethod
    def from_json(cls, value: Any) -> ToolAccess | None:
        """The announced field, or ``None`` (everyone may call) when absent or not an object;
        ``names`` that are not an object of strings are ignored."""
        if not isinstance(value, dict):
            return None
        keys, names = value.get("keys"), value.get("names")
        return cls(value.get("anonymous") is True,
                   tuple(k for k in keys if isinstance(k, str)) if isinstance(keys, list) else (),
                   tuple(sorted((k, n) for k, n in names.items() if isinstance(n, str)))
                   if isinstance(names, dict) else ())

    def admits(self, caller_key_id: str | None) -> bool:
        """Whether a caller with this key id (``None``: anonymous) may call the tool. A key the
        host's policy does not know is refused even an anonymous tool (docs/protocol.md §2.8),
        and the keys of a tool anonymous callers may call list every key the policy knows."""
        return self.anonymous if caller_key_id is None else caller_key_id in self.keys

    def rules(self) -> dict[str, Any]:
        """What the access decides, without the names: ``{"anonymous", "keys"}`` (keys sorted)."""
        return {"anonymous": self.anonymous, "keys": sorted(self.keys)}

    def describe(self) -> str:
        """Who may call it, in words: ``anonymous`` and each caller's name (its key id where the
        host gave no name), comma-separated, or ``nobody``."""
        named = dict(self.names)
        return ",".join(([ANONYMOUS] if self.anonymous else []) + [named.get(k, k) for k in self.keys]) or "nobody"


@dataclass(frozen=True)
class AccessPolicy:
    """A host's ``[access]`` table, keys loaded: ``anonymous`` tools (``"*"``: all) and the
    ``callers`` by key id."""

    anonymous: frozenset[str]
    callers: Mapping[str, CallerGrant] = field(default_factory=dict)

    @classmethod
    def from_table(cls, table: Any, base: Path, where: str = "[access]") -> AccessPolicy:
        """The policy of an ``[access]`` table (its parsed TOML), with relative key paths read
        from ``base`` (the config file's directory); ``where`` names the table in errors.

        Raises:
            AccessError: a field is wrong or a key file is missing or not an Ed25519 public key;
                the message names the table and the field.
        """
        try:
            parsed = _AccessTable.model_validate(table)
        except ValidationError as exc:
            first = exc.errors()[0]
            path = ".".join(str(p) for p in first["loc"])
            raise AccessError(f"{where}: {path}: {first['msg']}") from None
        callers: dict[str, CallerGrant] = {}
        for name, entry in parsed.callers.items():
            key = _public_key(entry.public_key, base, f"{where} callers.{name}.public-key")
            grant = CallerGrant(name, key, key_id(key), frozenset(entry.tools), entry.rate)
            if grant.key_id in callers:
                raise AccessError(f"{where} callers.{name}.public-key: the same key as callers."
                                  f"{callers[grant.key_id].name}: give each caller its own key")
            callers[grant.key_id] = grant
        return cls(frozenset(parsed.anonymous), callers)

    def tool_names(self) -> set[str]:
        """Every tool name the policy names (not ``"*"``), to check against what the host serves."""
        names = set(self.anonymous) | {t for grant in self.callers.values() for t in grant.tools}
        return names - {ALL}

    def allows(self, caller: CallerGrant | None, tool: str) -> bool:
        """Whether ``caller`` (``None``: anonymous) may call ``tool``."""
        return _grants(self.anonymous, tool) or (caller is not None and _grants(caller.tools, tool))

    def refused(self, caller: CallerGrant | None, tools: Iterable[str]) -> list[str]:
        """Those of ``tools`` that ``caller`` (``None``: anonymous) may not call. A request that
        could be for any of ``tools`` (:func:`tools_for`) is allowed only when this is empty."""
        return [tool for tool in tools if not self.allows(caller, tool)]

    def access_of(self, tools: Collection[str]) -> ToolAccess:
        """What the host announces about a tool whose own request could be for any of ``tools``
        (:func:`tools_for` of its service and config values, the tool among them): who may send
        that request, the callers allowed every one of ``tools``."""
        keys = tuple(sorted(k for k, grant in self.callers.items() if not self.refused(grant, tools)))
        return ToolAccess(not self.refused(None, tools), keys, tuple((k, self.callers[k].name) for k in keys))

    def ungranted(self, tools: Mapping[str, ToolDescriptor]) -> Iterator[str]:
        """A sentence per tool of ``tools`` (a host's, name -> descriptor) that the policy grants
        to callers who still may not call it, since its own request is also for a tool with the
        same config values that they are not granted (:func:`tools_for`): who, why, and what to do."""
        for name, tool in tools.items():
            could_be = tools_for(tools, tool.service, tool.config)
            granted, able = self.access_of([name]), self.access_of(could_be)
            lost = ([ANONYMOUS] if granted.anonymous and not able.anonymous else []) + [
                self.callers[k].name for k in granted.keys if k not in able.keys]
            if lost:
                yield (f"tool {name!r} is granted to {', '.join(lost)}, who may not call it all the same: a "
                       f"request for it is for {', '.join(t for t in could_be if t != name)} too (the same "
                       "config values over its service), which they are not granted; grant them that too, or "
                       "give the tools different config values")

    def unknown_tools(self, served: Iterable[str]) -> list[str]:
        """The tools the policy names that are not in ``served``."""
        return sorted(self.tool_names() - set(served))


def policy_fingerprint(policy: AccessPolicy | None, tools: Mapping[str, ToolDescriptor], service: str) -> str:
    """The ``access-policy`` a host announces for ``service`` (docs/protocol.md §4.3): :data:`NO_POLICY`
    without a ``policy``, else the first 16 hex digits of SHA-256 over the canonical JSON of
    ``{"tools": {<name>: {"anonymous": bool, "keys": [sorted key ids]}}}``, the announced access
    (:meth:`AccessPolicy.access_of`) of each of ``tools`` (a host's, name -> descriptor) over
    ``service``. Names and rates are left out: they decide nothing another host could apply."""
    if policy is None:
        return NO_POLICY
    over = {name: tool for name, tool in tools.items() if tool.service == service}
    same = _same_config(over)
    rules: dict[str, dict[str, Any]] = {}
    by_group: dict[tuple[str, ...], dict[str, Any]] = {}
    for name, tool in over.items():
        could_be = same.get(name)
        if could_be is None:
            rules[name] = policy.access_of(tools_for(over, service, tool.config)).rules()
        else:
            rules[name] = by_group.get(could_be) or by_group.setdefault(could_be, policy.access_of(could_be).rules())
    return hashlib.sha256(canonical_json({"tools": rules})).hexdigest()[:16]


def _same_config(over: Mapping[str, ToolDescriptor]) -> dict[str, tuple[str, ...]]:
    """Tool name -> the names of ``over`` (the tools of one service) with equal config values:
    what :func:`tools_for` gives for a request with the tool's own config values, found in one
    pass. A tool whose config holds a null or a value that is not hashable is left out (ask
    :func:`tools_for`)."""
    keys: dict[str, frozenset[tuple[str, Any]]] = {}
    for name, tool in over.items():
        config = tool.config
        try:
            if None not in config.values():
                keys[name] = frozenset(config.items())
                hash(keys[name])
        except TypeError:
            keys.pop(name, None)
    groups: dict[frozenset[tuple[str, Any]], list[str]] = {}
    for name, key in keys.items():
        groups.setdefault(key, []).append(name)
    return {name: tuple(groups[key]) for name, key in keys.items()}


def tools_for(tools: Mapping[str, ToolDescriptor], service: str, config: Mapping[str, Any]) -> list[str]:
    """The names of ``tools`` (a host's, name -> descriptor) that a request to ``service`` with
    ``config`` is for (docs/protocol.md §2.8): each tool over ``service`` whose config values
    ``config`` carries, as long as ``config`` sets no config param that other tools over the
    service set and this one does not. So a tool without config values is for the requests
    that set none of its service's tools' params, and only tools with the same config values
    share a request."""
    over = {name: tool for name, tool in tools.items() if tool.service == service}
    set_by_some = {key for tool in over.values() for key in tool.config}
    return [name for name, tool in over.items()
            if all(config.get(k) == v for k, v in tool.config.items())
            and all(key in tool.config for key in set_by_some if key in config)]


def _public_key(value: str, base: Path, where: str) -> Ed25519PublicKey:
    """The public key in ``value``: PEM text itself, or a path (relative to ``base``)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        if value.lstrip().startswith("-----BEGIN"):
            key = serialization.load_pem_public_key(value.encode())
            if not isinstance(key, Ed25519PublicKey):
                raise AccessError(f"{where}: not an Ed25519 public key")
            return key
        return load_public_key(base / value, "caller's public key")
    except KeyFileError as exc:
        raise AccessError(f"{where}: {exc}") from None
    except ValueError as exc:
        raise AccessError(f"{where}: not a PEM public key ({exc})") from None


def _grants(tools: frozenset[str], tool: str) -> bool:
    return ALL in tools or tool in tools
