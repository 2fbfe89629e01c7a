"""hookspecs: the plugin contract. Markers once, then one short hook per thing a plugin adds.

A registration hook receives a ``register`` callable rather than returning a list, so the
host knows which plugin registered what and isolates each plugin's failures (as llm does).
Every hook is called with keyword arguments only; an implementation may accept fewer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

from tghost.protocol.callers import Caller

hookspec = pluggy.HookspecMarker("tghost")
hookimpl = pluggy.HookimplMarker("tghost")

#: What the host calls per request: every ``tghost_authorize`` answer combined, called as
#: ``authorize(user, service_id, config, arguments, caller)``; ``None`` allows, a string is the deny reason.
Authorize = Callable[[str, str, dict[str, Any], dict[str, Any], Caller | None], str | None]


@hookspec
def tghost_register_services(register: Any) -> None:
    """Register tool services: call ``register(service)`` once per service.

    ``service`` is a :class:`tghost.ToolService` instance or a function decorated with
    :func:`tghost.tool`. A decorated function with no required config params also
    registers its own tool. Raising here skips the whole plugin; others are still served.
    """


@hookspec
def tghost_register_tools(register: Any) -> None:
    """Register tools: call ``register(tool)`` with a :class:`tghost.ToolDescriptor` or a dict.

    A dict uses seed 000 JSON keys. Build one from a service with ``service.tool(...)``.
    A tool must reference a service some plugin registered, and supply its required
    config params.
    """


@hookspec
def tghost_register_plugins(register: Any, config: dict[str, Any]) -> None:
    """Add plugins loaded from another plugin system, each listed and isolated as a plugin of its
    own: call ``register(name, load, kind=..., value=..., distribution=None, version=None)`` once each.

    ``load()`` returns the plugin, an object with hook implementations as an entry point's module
    is; the host calls it only when ``--load-plugins``/``--disable-plugins`` allow ``name``, then
    calls its hooks as any plugin's, so its failure skips it alone. ``kind`` names the plugin
    system (``tghost plugins`` shows it), ``value`` where the plugin comes from (for an entry
    point, its value). A name already taken is an error of the registering plugin. ``config`` is
    the host's TOML config file (``tghost run --config``) as a dict, ``{}`` without one: read your
    own top-level table. Plugins added here cannot add plugins in turn.
    """


@hookspec
def tghost_shutdown() -> None:
    """Release what the plugin holds, once, when the host is done with it: after ``tghost run``
    answered its last call, after ``tghost plugins`` listed it, or when ``--watch-plugins``
    sees it uninstalled. Called in a worker thread; an exception is logged and the others run.
    """


@hookspec
def tghost_authorize(user: str, service: str, config: dict[str, Any], arguments: dict[str, Any],
                     caller: Caller | None) -> Any:
    """Allow or deny one call before ``invoke``: ``service`` is the service id, ``user`` is
    asserted by the caller (nothing checks it), ``caller`` is the verified caller
    (:class:`tghost.protocol.callers.Caller`: name and key id) under the host's ``[access]``
    policy, ``None`` when anonymous or without a policy; the rest as decoded. An implementation
    names only the arguments it needs.

    Return ``None`` for no opinion, ``True`` to allow, ``False`` or a reason string to deny.
    Any deny wins: the call is answered ``not-allowed`` (with the reason) and never invoked.
    An implementation that raises denies too (fail closed). It runs on the event loop, or for a
    plain ``def`` tool on the service's worker thread (the thread lane): keep it fast and thread-safe.
    """
