"""tghost: host pip-installed agent tool services on Apache Pulsar.

This module is tghost's public face (docs/internals/architecture.md "The public line"); with
``tghost.testing`` (plugin tests) and ``tghost.protocol`` (the wire) it is all a user imports.

- A plugin author's world: the ``hookimpl`` marker, the ``tool`` decorator, the ``ToolService``
  base class, ``ToolSet`` (services and tools a plugin changes while the host runs), ``Context``
  (``current_context`` and ``current_caller`` in a class service), the errors ``ToolError`` and
  ``InvalidArguments``, and the seed 000 descriptor models; ``discover``, ``Catalog`` and
  ``PluginSelection`` load the installed plugins as ``tghost run`` does, and ``ServeSettings``
  and ``CallRecord`` are what ``tghost.testing.LocalHost`` takes and tells its listeners.
- A host's: ``Host``, configured by ``HostConfig`` (``HostError``, ``ConfigError`` and
  ``PluginLoadError`` when it cannot start),
  which ``tghost run`` builds and a program embeds (docs/guides/embedding.md).
- An agent's world: ``ToolDirectory`` and ``ToolView`` (one agent's tools and seed 001 state
  over it, which the framework integrations in ``tghost.integrations`` build on),
  ``PulsarSettings`` (``DEFAULT_URL``, ``DEFAULT_TOPIC``),
  the ``CallOptions`` of a call, ``ToolCallError`` with its refusals ``UnknownTool`` and
  ``NoProvider``, what a directory gives (``Change``, ``DirectoryTool``, ``Found``,
  ``LiveHost``, ``ToolCallRecord``, ``input_schema``), seed 001's ``select`` and ``next_state``,
  keys (``Signer``, ``TrustedKeys``, ``KeyFileError``), ``ToolServiceClient`` for one service
  without a directory, and the errors ``BrokerError`` (``BrokerUnavailable``,
  ``NotPulsarBroker``) and ``SearchError``.

Each name is loaded on first use, so importing tghost costs nothing until one is needed.
Internals are free to move behind it.
"""

from typing import TYPE_CHECKING

from tghost._version import __version__
from tghost.system import lazy

if TYPE_CHECKING:
    from tghost.agent.calls import CallOptions, NoProvider, ToolCallRecord, UnknownTool
    from tghost.agent.client import ToolCallError, ToolServiceClient
    from tghost.agent.directory import ToolDirectory
    from tghost.agent.entries import Change, DirectoryTool, input_schema
    from tghost.agent.hosts import LiveHost
    from tghost.agent.search import Found, SearchError
    from tghost.agent.view import ToolView
    from tghost.author.hookspecs import hookimpl
    from tghost.author.service import (
        Context,
        InvalidArguments,
        ToolError,
        ToolService,
        current_caller,
        current_context,
        tool,
    )
    from tghost.author.toolset import ToolSet
    from tghost.discovery.catalog import Catalog
    from tghost.discovery.config import ConfigError
    from tghost.discovery.discover import PluginLoadError, PluginSelection, discover
    from tghost.operate.host import Host, HostConfig, HostError
    from tghost.protocol.callers import Caller
    from tghost.protocol.descriptors import (
        Argument,
        ConfigParam,
        DescriptorError,
        ToolDescriptor,
        ToolServiceDescriptor,
    )
    from tghost.protocol.epochs import DEFAULT_TOPIC
    from tghost.protocol.groups import next_state, select
    from tghost.protocol.trust import KeyFileError, Signer, TrustedKeys
    from tghost.protocol.wire import Progress
    from tghost.pulsar.clients import (
        DEFAULT_URL,
        BrokerError,
        BrokerUnavailable,
        NotPulsarBroker,
        PulsarSettings,
        is_reachable,
    )
    from tghost.serving.request import CallRecord
    from tghost.serving.settings import ServeSettings

#: Every name here by the module that defines it, imported on first access (PEP 562), so that
#: ``import tghost`` (which every ``tghost.*`` import runs) costs nothing: a plugin's
#: ``tghost.tool`` loads the authoring modules, an agent's ``tghost.ToolDirectory`` the Pulsar
#: client, and ``tghost --help`` neither. Kept in step with the imports above by
#: tests/test_public_api.py.
_LAZY = {
    **dict.fromkeys(("CallOptions", "NoProvider", "ToolCallRecord", "UnknownTool"), "tghost.agent.calls"),
    **dict.fromkeys(("ToolCallError", "ToolServiceClient"), "tghost.agent.client"),
    "ToolDirectory": "tghost.agent.directory",
    **dict.fromkeys(("Change", "DirectoryTool", "input_schema"), "tghost.agent.entries"),
    "LiveHost": "tghost.agent.hosts",
    **dict.fromkeys(("Found", "SearchError"), "tghost.agent.search"),
    "ToolView": "tghost.agent.view",
    "hookimpl": "tghost.author.hookspecs",
    **dict.fromkeys(("Context", "InvalidArguments", "ToolError", "ToolService", "current_caller", "current_context",
                     "tool"), "tghost.author.service"),
    "ToolSet": "tghost.author.toolset",
    "ConfigError": "tghost.discovery.config",
    "Catalog": "tghost.discovery.catalog",
    **dict.fromkeys(("PluginLoadError", "PluginSelection", "discover"), "tghost.discovery.discover"),
    **dict.fromkeys(("Host", "HostConfig", "HostError"), "tghost.operate.host"),
    "Caller": "tghost.protocol.callers",
    **dict.fromkeys(("Argument", "ConfigParam", "DescriptorError", "ToolDescriptor", "ToolServiceDescriptor"),
                    "tghost.protocol.descriptors"),
    "DEFAULT_TOPIC": "tghost.protocol.epochs",
    **dict.fromkeys(("next_state", "select"), "tghost.protocol.groups"),
    **dict.fromkeys(("KeyFileError", "Signer", "TrustedKeys"), "tghost.protocol.trust"),
    "Progress": "tghost.protocol.wire",
    **dict.fromkeys(("DEFAULT_URL", "BrokerError", "BrokerUnavailable", "NotPulsarBroker", "PulsarSettings",
                     "is_reachable"), "tghost.pulsar.clients"),
    "CallRecord": "tghost.serving.request",
    "ServeSettings": "tghost.serving.settings",
}

__all__ = [
    "DEFAULT_TOPIC",
    "DEFAULT_URL",
    "Argument",
    "BrokerError",
    "BrokerUnavailable",
    "CallOptions",
    "CallRecord",
    "Caller",
    "Catalog",
    "Change",
    "ConfigError",
    "ConfigParam",
    "Context",
    "DescriptorError",
    "DirectoryTool",
    "Found",
    "Host",
    "HostConfig",
    "HostError",
    "InvalidArguments",
    "KeyFileError",
    "LiveHost",
    "NoProvider",
    "NotPulsarBroker",
    "PluginLoadError",
    "PluginSelection",
    "Progress",
    "PulsarSettings",
    "SearchError",
    "ServeSettings",
    "Signer",
    "ToolCallError",
    "ToolCallRecord",
    "ToolDescriptor",
    "ToolDirectory",
    "ToolError",
    "ToolService",
    "ToolServiceClient",
    "ToolServiceDescriptor",
    "ToolSet",
    "ToolView",
    "TrustedKeys",
    "UnknownTool",
    "__version__",
    "current_caller",
    "current_context",
    "discover",
    "hookimpl",
    "input_schema",
    "is_reachable",
    "next_state",
    "select",
    "tool",
]

__getattr__, __dir__ = lazy.exports(globals(), _LAZY)
