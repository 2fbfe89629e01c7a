"""tghost: host pip-installed agent tool services on Apache Pulsar.

This module is a plugin author's whole world: the ``hookimpl`` marker, the ``tool``
decorator, the ``ToolService`` base class, errors, and the seed 000 descriptor models.
An agent's world is here too, loaded on first use so that plugins stay cheap to import:
``ToolDirectory``, ``PulsarSettings`` and ``ToolCallError``. Internals are free to move behind it.
"""

from typing import TYPE_CHECKING, Any

from .descriptors import Argument, ConfigParam, DescriptorError, ToolDescriptor, ToolServiceDescriptor
from .hookspecs import hookimpl
from .service import Context, InvalidArguments, ToolError, ToolService, tool

__version__ = "0.1.0"

if TYPE_CHECKING:
    from .broker import PulsarSettings
    from .client import ToolCallError
    from .directory import ToolDirectory

#: Agent-side names, imported on first access (PEP 562): they pull in the Pulsar client.
_LAZY = {"ToolDirectory": "directory", "PulsarSettings": "broker", "ToolCallError": "client"}

__all__ = [
    "Argument",
    "ConfigParam",
    "Context",
    "DescriptorError",
    "InvalidArguments",
    "PulsarSettings",
    "ToolCallError",
    "ToolDescriptor",
    "ToolDirectory",
    "ToolError",
    "ToolService",
    "ToolServiceDescriptor",
    "__version__",
    "hookimpl",
    "tool",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'tghost' has no attribute {name!r}")
