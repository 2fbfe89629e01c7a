"""tghost: host pip-installed agent tool services on Apache Pulsar.

This module is a plugin author's whole world: the ``hookimpl`` marker, the ``tool``
decorator, the ``ToolService`` base class, errors, and the seed 000 descriptor models.
An agent's world is here too, loaded on first use so that plugins stay cheap to import:
``ToolDirectory``, ``PulsarSettings`` and ``ToolCallError``. Internals are free to move behind it.
"""

from typing import TYPE_CHECKING, Any

from tghost._version import __version__
from tghost.author.hookspecs import hookimpl
from tghost.author.service import Context, InvalidArguments, ToolError, ToolService, current_caller, tool
from tghost.protocol.descriptors import Argument, ConfigParam, DescriptorError, ToolDescriptor, ToolServiceDescriptor
from tghost.protocol.wire import Progress

if TYPE_CHECKING:
    from tghost.agent.client import ToolCallError
    from tghost.agent.directory import ToolDirectory
    from tghost.pulsar.clients import PulsarSettings

#: Agent-side names, imported on first access (PEP 562): they pull in the Pulsar client.
_LAZY = {"ToolDirectory": "tghost.agent.directory", "PulsarSettings": "tghost.pulsar.clients",
         "ToolCallError": "tghost.agent.client"}

__all__ = [
    "Argument",
    "ConfigParam",
    "Context",
    "DescriptorError",
    "InvalidArguments",
    "Progress",
    "PulsarSettings",
    "ToolCallError",
    "ToolDescriptor",
    "ToolDirectory",
    "ToolError",
    "ToolService",
    "ToolServiceDescriptor",
    "__version__",
    "current_caller",
    "hookimpl",
    "tool",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tghost' has no attribute {name!r}")
