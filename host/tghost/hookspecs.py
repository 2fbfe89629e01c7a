"""hookspecs: the plugin contract. Markers once, then one short hook per thing a plugin adds.

A registration hook receives a ``register`` callable rather than returning a list, so the
host knows which plugin registered what and isolates each plugin's failures (as llm does).
Every hook is called with keyword arguments only; an implementation may accept fewer.
Never imports the host's stages.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

hookspec = pluggy.HookspecMarker("tghost")
hookimpl = pluggy.HookimplMarker("tghost")

#: What the host calls per request: every ``tghost_authorize`` answer combined, called as
#: ``authorize(user, service_id, config, arguments)``; ``None`` allows, a string is the deny reason.
Authorize = Callable[[str, str, dict[str, Any], dict[str, Any]], str | None]


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
def tghost_authorize(user: str, service: str, config: dict[str, Any], arguments: dict[str, Any]) -> Any:
    """Allow or deny one call before ``invoke``: ``service`` is the service id, the rest as decoded.

    Return ``None`` for no opinion, ``True`` to allow, ``False`` or a reason string to deny.
    Any deny wins: the call is answered ``not-allowed`` (with the reason) and never invoked.
    An implementation that raises denies too (fail closed). It runs on the event loop: keep it fast.
    """
