"""serve: the ``tghost.plugins`` entry point. Adds one plugin per installed Amplifier tool module
(``tghost_register_plugins``), which mounts the module unchanged on a coordinator of its own and
registers each mounted tool as a tool service (:mod:`tghost_amplifier.service`).

Never talks to Pulsar, and never imports amplifier-core unless a tool module is installed.
"""

from __future__ import annotations

import copy
import gc
import logging
from collections.abc import Callable
from importlib.metadata import EntryPoint
from types import SimpleNamespace
from typing import Any

import tghost

from .modules import ModuleSettings, tool_modules
from .runtime import ModuleRuntime

__all__ = ["KIND", "AmplifierModule", "tghost_register_plugins"]

log = logging.getLogger(__name__)

#: The ``kind`` of the plugins added here, as ``tghost plugins`` shows it.
KIND = "amplifier"
#: Seconds the module's cleanups may take at shutdown.
CLEANUP_TIMEOUT = 10.0


@tghost.hookimpl
def tghost_register_plugins(register: Any, config: dict[str, Any]) -> None:
    """Add each installed Amplifier tool module (:func:`tghost_amplifier.modules.tool_modules`)
    as a plugin named by its entry point, with its ``[amplifier.<name>]`` settings from ``config``."""
    for ep in tool_modules():
        dist = ep.dist
        register(ep.name, _loader(ep, config), kind=KIND, value=ep.value,
                 distribution=dist.name if dist else None, version=dist.version if dist else None)


def _loader(ep: EntryPoint, config: dict[str, Any]) -> Callable[[], AmplifierModule]:
    """The ``load()`` the host calls unless the module is blocked: read its settings, import it, mount it."""

    def load() -> AmplifierModule:
        settings = ModuleSettings.of(ep.name, config)
        return AmplifierModule(ep.name, ep.load(), settings).mount()

    return load


class AmplifierModule:
    """One Amplifier tool module as a tghost plugin: its coordinator, its loop, its tools.

    :meth:`mount` calls the module's ``mount(coordinator, config)`` on the module's own
    :class:`~tghost_amplifier.runtime.ModuleRuntime`, with a ``ModuleCoordinator`` from
    amplifier-core whose ``session.working_dir`` capability is set; a cleanup ``mount()``
    returns is registered on the coordinator, as Amplifier's session does. Every tool the
    module mounts at ``"tools"`` becomes a tool service; :meth:`tghost_shutdown` runs the
    coordinator's cleanups and stops the loop.
    """

    def __init__(self, name: str, mount_function: Any, settings: ModuleSettings) -> None:
        self.name = name
        self.mount_function = mount_function
        self.settings = settings
        self.runtime = ModuleRuntime(name)
        self.coordinator: Any = None
        self.tools: dict[str, Any] = {}

    def mount(self) -> AmplifierModule:
        """Mount the module; returns ``self``.

        Raises:
            RuntimeError: ``mount()`` raised, did not finish within ``mount_timeout`` seconds,
                or mounted no tool; what it registered is cleaned up and its loop stopped.
        """
        self.runtime.start()
        try:
            self.runtime.run(self._mount(), self.settings.mount_timeout)
        except Exception as exc:
            self.tghost_shutdown()
            raise RuntimeError(f"mount() raised {type(exc).__name__}: {exc}") from exc
        if not self.tools:
            self.tghost_shutdown()
            raise RuntimeError("mount() mounted no tool (no coordinator.mount('tools', ...)): nothing to serve")
        log.info("amplifier module %s mounted tools %s", self.name, ", ".join(self.tools))
        return self

    async def _mount(self) -> None:
        from amplifier_core import ModuleCoordinator  # only once a tool module is installed

        plan = {"session": {}, "tools": [{"module": self.name, "config": self.settings.config}]}
        session = SimpleNamespace(session_id=f"tghost-{self.name}", parent_id=None, config=plan)
        self.coordinator = ModuleCoordinator(session)
        self.coordinator.register_capability("session.working_dir", self.settings.working_dir)
        returned = await self.mount_function(self.coordinator, copy.deepcopy(self.settings.config))
        if callable(returned) and not hasattr(returned, "execute"):
            self.coordinator.register_cleanup(returned)
        self.tools = dict(self.coordinator.get("tools") or {})

    @tghost.hookimpl
    def tghost_register_services(self, register: Any) -> None:
        """Register one :class:`~tghost_amplifier.service.AmplifierToolService` per mounted tool."""
        from .service import AmplifierToolService

        for name, tool in self.tools.items():
            if not callable(getattr(tool, "execute", None)):
                raise TypeError(f"tool {name!r} has no execute(input) method (seed 002's Tool protocol)")
            register(AmplifierToolService(name, tool, self.coordinator, self.runtime))

    async def _cleanup(self) -> None:
        await self.coordinator.cleanup()  # amplifier-core makes its future on the running loop: call it there

    @tghost.hookimpl
    def tghost_shutdown(self) -> None:
        """Run the coordinator's cleanups (at most ``CLEANUP_TIMEOUT`` seconds), stop the loop and
        let the coordinator go."""
        if self.coordinator is not None:
            try:
                self.runtime.run(self._cleanup(), CLEANUP_TIMEOUT)
            except Exception:
                log.exception("amplifier module %s: cleanup failed", self.name)
        self.runtime.stop()
        self.coordinator, self.tools = None, {}
        gc.collect()  # see tghost_amplifier/__init__.py: never leave a coordinator to interpreter exit
