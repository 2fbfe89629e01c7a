"""session: the ``tool-tghost`` Amplifier module (``amplifier.modules`` entry point). Its
``mount(coordinator, config)`` follows a :class:`tghost.ToolDirectory` and keeps one Tool
mounted per live tghost tool the session may use: mounted when announced, unmounted when
withdrawn or expired. Never serves anything, and never replaces a tool another module mounted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from amplifier_core import ToolResult
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tghost import (
    DEFAULT_TOPIC,
    DEFAULT_URL,
    PulsarSettings,
    ToolCallError,
    ToolDescriptor,
    ToolDirectory,
    TrustedKeys,
    input_schema,
    is_reachable,
)

__all__ = ["SessionSettings", "TghostTool", "ToolMounter", "mount"]

log = logging.getLogger(__name__)


def _env(name: str) -> Callable[[], str | None]:
    return lambda: os.environ.get(name) or None


def _env_or(name: str, default: str) -> Callable[[], str]:
    return lambda: os.environ.get(name) or default


class SessionSettings(BaseModel):
    """The module's ``config`` (Amplifier's mount plan); every key optional, unknown keys refused.

    - ``pulsar_url`` (env ``TGHOST_PULSAR_URL``, default ``pulsar://localhost:6650``),
      ``pulsar_token`` (env ``TGHOST_PULSAR_TOKEN``), ``tls_trust_certs`` (env
      ``TGHOST_TLS_TRUST_CERTS``): the cluster, as for every ``tghost`` command.
    - ``topic`` (env ``TGHOST_DESCRIPTORS_TOPIC``): where hosts announce their tools.
    - ``groups``, ``state``: the seed 001 request groups and state; only the tools they may use
      are mounted (default: the ``default`` group, no state; ``["*"]`` for every group).
    - ``trusted_keys``: paths of public keys (``tghost keygen``); with any, only tools announced
      by hosts that sign with one of them are mounted.
    - ``user``: the request's ``user``, for the hosts' ``tghost_authorize`` checks.
    - ``timeout``: seconds a call may take (default: the timeout the tool's service announces,
      else 30, as for every caller: docs/reference/agent-api.md "Call options").
    """

    model_config = ConfigDict(extra="forbid")

    pulsar_url: str = Field(default_factory=_env_or("TGHOST_PULSAR_URL", DEFAULT_URL))
    pulsar_token: str | None = Field(default_factory=_env("TGHOST_PULSAR_TOKEN"), repr=False)
    tls_trust_certs: str | None = Field(default_factory=_env("TGHOST_TLS_TRUST_CERTS"))
    topic: str = Field(default_factory=_env_or("TGHOST_DESCRIPTORS_TOPIC", DEFAULT_TOPIC))
    groups: list[str] | None = None
    state: str | None = None
    trusted_keys: list[Path] = Field(default_factory=list)
    user: str | None = None
    timeout: float | None = Field(default=None, gt=0)

    @classmethod
    def of(cls, config: dict[str, Any] | None) -> SessionSettings:
        """Validate the module's config.

        Raises:
            ValueError: a key is unknown or of the wrong type (the message names it).
        """
        try:
            return cls.model_validate(config or {})
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in exc.errors())
            raise ValueError(f"tool-tghost config: {problems}") from None

    @property
    def pulsar(self) -> PulsarSettings:
        return PulsarSettings(self.pulsar_url, token=self.pulsar_token, tls_trust_certs=self.tls_trust_certs)

    def trusted(self) -> TrustedKeys | None:
        """The trusted keys, or ``None`` (every host believed).

        Raises:
            tghost.KeyFileError: a key file is missing or not an Ed25519 public key.
        """
        return TrustedKeys.from_files(self.trusted_keys) if self.trusted_keys else None


class TghostTool:
    """A live tghost tool as an Amplifier Tool (seed 002): ``name``, ``description``,
    ``input_schema`` (the tool's own, or built from its seed 000 ``arguments``) and
    ``execute()``, which calls it by name over Pulsar with its config values merged.
    """

    def __init__(self, descriptor: ToolDescriptor, directory: ToolDirectory, settings: SessionSettings) -> None:
        self.descriptor = descriptor
        self.name = descriptor.name
        self.description = descriptor.description
        self.input_schema = input_schema(descriptor)
        self._directory = directory
        self._settings = settings

    def get_schema(self) -> dict[str, Any]:
        """The input schema, for orchestrators that ask seed 002's ``get_schema()``."""
        return self.input_schema

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        """Call the tool; never raises. The observation is the ``output``; an error reply, a
        refusal (``not-allowed``, ``unknown-tool``, ``no-provider``) or a timeout is ``success=False`` with
        ``error={"type": <wire error type>, "message": ...}``."""
        settings = self._settings
        try:
            output = await self._directory.invoke(self.name, dict(input or {}), user=settings.user,
                                                  groups=settings.groups, state=settings.state,
                                                  timeout=settings.timeout)
        except ToolCallError as exc:
            return ToolResult(success=False, error={"type": exc.error_type, "message": exc.message})
        except Exception as exc:
            return ToolResult(success=False, error={"type": type(exc).__name__, "message": str(exc)})
        return ToolResult(success=True, output=output)


class ToolMounter:
    """Keeps the tools a coordinator has mounted from tghost equal to the directory's live tools
    that ``settings.groups``/``settings.state`` may use: :meth:`start`, then :meth:`close`.

    A tool whose name another module already mounted is skipped (logged once), not replaced.
    """

    def __init__(self, coordinator: Any, directory: ToolDirectory, settings: SessionSettings) -> None:
        self.coordinator = coordinator
        self.directory = directory
        self.settings = settings
        self.mounted: dict[str, TghostTool] = {}
        self._skipped: set[str] = set()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> ToolMounter:
        """Follow the directory's changes, then mount what is live now; returns ``self``."""
        self._task = asyncio.create_task(self._follow(), name="tool-tghost follow")
        await asyncio.sleep(0)  # the task subscribes to the changes first: none is missed after the sync
        await self.sync()
        return self

    async def _follow(self) -> None:
        async for _ in self.directory.changes():
            try:
                await self.sync()
            except Exception:
                log.exception("tool-tghost: could not follow a change of the live tools")

    async def sync(self) -> None:
        """Unmount the tools no longer offered (or changed), then mount the ones offered now."""
        async with self._lock:
            offered = {d.name: d for d in self.directory.available(self.settings.groups, self.settings.state)}
            for name, tool in list(self.mounted.items()):
                if offered.get(name) != tool.descriptor:
                    await self.coordinator.unmount("tools", name)
                    del self.mounted[name]
                    log.info("tool-tghost: unmounted %s", name)
            taken = self.coordinator.get("tools") or {}
            for name, descriptor in offered.items():
                if name in self.mounted:
                    continue
                if name in taken:
                    if name not in self._skipped:
                        self._skipped.add(name)
                        log.warning("tool-tghost: tool %r is already mounted by another module; not mounted", name)
                    continue
                tool = TghostTool(descriptor, self.directory, self.settings)
                await self.coordinator.mount("tools", tool, name=name)
                self.mounted[name] = tool
                log.info("tool-tghost: mounted %s", name)

    async def close(self) -> None:
        """Stop following, unmount every tool mounted here and close the directory."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        async with self._lock:
            for name in list(self.mounted):
                with contextlib.suppress(Exception):
                    await self.coordinator.unmount("tools", name)
                del self.mounted[name]
        await self.directory.close()


async def mount(coordinator: Any, config: dict[str, Any] | None = None) -> Callable[[], Awaitable[None]]:
    """Amplifier's module entry point (seed 002): mount every live tghost tool this session may
    use, and keep them in step with the cluster while it runs. Returns the cleanup that stops
    following and closes the directory (Amplifier's session registers and runs it).

    Raises:
        ValueError: the config is invalid (names the key).
        tghost.KeyFileError: a trusted key file cannot be read.
        ConnectionError: no broker answers at ``pulsar_url``.
        tghost.BrokerError: the broker did not let the directory read the topic.
    """
    settings = SessionSettings.of(config)
    trusted = settings.trusted()
    if not await asyncio.to_thread(is_reachable, settings.pulsar_url):
        raise ConnectionError(f"tool-tghost: no Pulsar broker answers at {settings.pulsar_url}: set 'pulsar_url' in "
                              "the module's config or TGHOST_PULSAR_URL, or start one with 'tghost run'")
    directory = await ToolDirectory(settings.pulsar, settings.topic, trusted=trusted).start()
    try:
        mounter = await ToolMounter(coordinator, directory, settings).start()
    except BaseException:
        await directory.close()
        raise
    log.info("tool-tghost: following %s on %s; mounted %s", settings.topic, settings.pulsar_url,
             ", ".join(mounter.mounted) or "no tool yet")
    return mounter.close
