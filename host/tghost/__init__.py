"""tghost: host pip-installed agent tool services on Apache Pulsar.

This module is a plugin author's whole world: the ``hookimpl`` marker, the ``tool``
decorator, the ``ToolService`` base class, errors, and the seed 000 descriptor models.
Internals are free to move behind it.
"""

from .descriptors import Argument, ConfigParam, DescriptorError, ToolDescriptor, ToolServiceDescriptor
from .hookspecs import hookimpl
from .service import Context, InvalidArguments, ToolError, ToolService, tool

__version__ = "0.1.0"

__all__ = [
    "Argument",
    "ConfigParam",
    "Context",
    "DescriptorError",
    "InvalidArguments",
    "ToolDescriptor",
    "ToolError",
    "ToolService",
    "ToolServiceDescriptor",
    "__version__",
    "hookimpl",
    "tool",
]
