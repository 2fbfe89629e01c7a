"""tghost: host pip-installed agent tool services on Apache Pulsar.

This module is a plugin author's whole world: the ``hookimpl`` marker, the ``tool``
decorator, the ``ToolService`` base class, errors, and the seed 000 descriptor models.
A host to run in one's own program is ``Host`` with its ``HostConfig``.
An agent's world is here too: ``ToolDirectory``, ``PulsarSettings`` and ``ToolCallError``, with
its refusals ``UnknownTool`` and ``NoProvider``.
Each name is loaded on first use, so importing tghost costs nothing until one is needed.
Internals are free to move behind it.
"""

from typing import TYPE_CHECKING, Any

from tghost._version import __version__

if TYPE_CHECKING:
    from tghost.agent.calls import NoProvider, UnknownTool
    from tghost.agent.client import ToolCallError
    from tghost.agent.directory import ToolDirectory
    from tghost.author.hookspecs import hookimpl
    from tghost.operate.host import Host, HostConfig, HostError
    from tghost.author.service import Context, InvalidArguments, ToolError, ToolService, current_caller, tool
    from tghost.protocol.descriptors import (
        Argument,
        ConfigParam,
        DescriptorError,
        ToolDescriptor,
        ToolServiceDescriptor,
    )
    from tghost.protocol.wire import Progress
    from tghost.pulsar.clients import PulsarSettings

#: Every name here, imported on first access (PEP 562), so that ``import tghost`` (which every
#: ``tghost.*`` import runs) costs nothing: a plugin's ``tghost.tool`` loads the authoring
#: modules, an agent's ``tghost.ToolDirectory`` the Pulsar client, and ``tghost --help`` neither.
_LAZY = {
    "ToolDirectory": "tghost.agent.directory", "PulsarSettings": "tghost.pulsar.clients",
    "ToolCallError": "tghost.agent.client", "NoProvider": "tghost.agent.calls", "UnknownTool": "tghost.agent.calls",
    "hookimpl": "tghost.author.hookspecs", "Progress": "tghost.protocol.wire",
    **dict.fromkeys(("Host", "HostConfig", "HostError"), "tghost.operate.host"),
    **dict.fromkeys(("Context", "InvalidArguments", "ToolError", "ToolService", "current_caller", "tool"),
                    "tghost.author.service"),
    **dict.fromkeys(("Argument", "ConfigParam", "DescriptorError", "ToolDescriptor", "ToolServiceDescriptor"),
                    "tghost.protocol.descriptors"),
}

__all__ = [
    "Argument",
    "ConfigParam",
    "Context",
    "DescriptorError",
    "Host",
    "HostConfig",
    "HostError",
    "InvalidArguments",
    "NoProvider",
    "Progress",
    "PulsarSettings",
    "ToolCallError",
    "ToolDescriptor",
    "ToolDirectory",
    "ToolError",
    "ToolService",
    "ToolServiceDescriptor",
    "UnknownTool",
    "__version__",
    "current_caller",
    "hookimpl",
    "tool",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # the next access is a plain attribute
        return value
    raise AttributeError(f"module 'tghost' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
