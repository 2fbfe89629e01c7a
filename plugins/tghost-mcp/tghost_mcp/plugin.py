"""plugin: the ``tghost.plugins`` entry point ``mcp``. Adds one plugin of kind ``mcp`` per
``[mcp-servers.<name>]`` table of the host's config file (``tghost_register_plugins``); loading it
starts the server (:class:`~tghost_mcp.server.MountedServer`), and it serves a
:class:`tghost.ToolSet` named after the server: one tool service, ``<name>``, and one tool per MCP
tool over it (:mod:`tghost_mcp.tools`), replaced whenever the server's tools change.

A bad table, or a server that does not start, fails that plugin alone; ``--disable-plugins
<name>`` keeps a server from being started.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Callable
from typing import Any

import tghost

from .names import Claims, tool_name
from .server import MountedServer
from .settings import TABLE, ServerSettings, server_tables
from .tools import TOOL, Offered, observation, offer

__all__ = ["KIND", "McpServerPlugin", "McpService", "tghost_register_plugins"]

log = logging.getLogger(__name__)

#: The ``kind`` of the plugins added here, as ``tghost plugins`` shows it.
KIND = "mcp"
#: The distribution the plugins added here come from.
DISTRIBUTION = "tghost-mcp"
#: Which mounted server serves each tool name, across this host's servers.
CLAIMS = Claims()


@tghost.hookimpl
def tghost_register_plugins(register: Any, config: dict[str, Any]) -> None:
    """Add each ``[mcp-servers.<name>]`` server of ``config`` as a plugin named ``<name>``, of kind
    ``mcp``, from this distribution; its value is the server's command line or URL.

    Raises:
        ValueError: ``mcp-servers`` is not a table of tables.
    """
    version = _version()
    for name, table in server_tables(config).items():
        register(name, _loader(name, table), kind=KIND, value=_origin(name, table), distribution=DISTRIBUTION,
                 version=version)


def _version() -> str | None:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def _origin(name: str, table: Any) -> str:
    """Where the server comes from, even for a table that is not valid (then the table's name)."""
    try:
        return ServerSettings.of(name, table).origin
    except ValueError:
        return f"[{TABLE}.{name}]"


def _loader(name: str, table: Any) -> Callable[[], McpServerPlugin]:
    """The ``load()`` the host calls unless the server is disabled: check its table, start it."""

    def load() -> McpServerPlugin:
        settings = ServerSettings.of(name, table)
        _quiet_sdk()
        return McpServerPlugin(name, settings).start()

    return load


def _quiet_sdk() -> None:
    """Keep the MCP SDK's and httpx2's own log lines (each HTTP request at INFO, a lost
    connection's traceback) out of the host's log, which says what matters in this plugin's
    words; at ``--log-level debug`` they show."""
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        for library in ("mcp", "httpx2", "httpcore2"):
            logging.getLogger(library).setLevel(logging.CRITICAL)


class McpService(tghost.ToolService):
    """The tool service of one MCP server: every call names the MCP tool in the config param
    :data:`~tghost_mcp.tools.TOOL`, checks its arguments against that tool's schema, and is
    forwarded over the server's session. Runs on the host's event loop (never in a worker
    process: the session is this process's); the host's ``timeout`` cancels the MCP request.
    """

    config_params = (tghost.ConfigParam(name=TOOL, required=True),)
    allow_unknown_arguments = True
    isolation = "thread"

    def __init__(self, plugin: McpServerPlugin) -> None:
        settings = plugin.settings
        self.id = plugin.name
        self.input_schema = {"type": "object"}  # each tool's own schema is checked in invoke (ArgumentCheck)
        self.description = f"The tools of the MCP server {plugin.name}."  # not its command line: args may hold secrets
        self.timeout = settings.timeout
        self.max_concurrency = settings.max_concurrency
        self.plugin = plugin

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        """Call the MCP tool ``config["tool"]`` and return its observation
        (:func:`tghost_mcp.tools.observation`).

        Raises:
            tghost.InvalidArguments: the arguments break the tool's input schema.
            tghost.ToolError: the server offers no such tool now, is down (``unavailable``) or
                answered with an error (``tool-service-error``, naming the server).
        """
        offered = self.plugin.offered(config[TOOL])
        checked = offered.check.check_arguments(arguments)
        result = await self.plugin.server.call(offered.tool.name, checked, tghost.current_context())
        return observation(self.id, offered.tool, result)


class McpServerPlugin:
    """One mounted MCP server as a tghost plugin: its :class:`tghost.ToolSet` (the service and
    tools it serves now, and its problem while it is down) and its server."""

    def __init__(self, name: str, settings: ServerSettings) -> None:
        self.name = name
        self.settings = settings
        self.toolset = tghost.ToolSet(name)
        self.service = McpService(self)
        self.server = MountedServer(name, settings, self)
        self._offered: dict[str, Offered] = {}
        self._refused: set[str] = set()

    def start(self) -> McpServerPlugin:
        """Start the server and serve its tools; returns ``self``.

        Raises:
            tghost.DescriptorError: ``name`` is not a valid service id.
            RuntimeError: the server did not start (the message says why).
        """
        _ = self.service.descriptor
        self.server.start()
        return self

    def offered(self, tool: str) -> Offered:
        """The served MCP tool named ``tool``.

        Raises:
            tghost.ToolError: the server offers no such tool now (``tool-service-error``).
        """
        found = self._offered.get(tool)
        if found is None:
            raise tghost.ToolError(f"MCP server {self.name!r} offers no tool {tool!r} now (it offers: "
                                   f"{', '.join(sorted(self._offered)) or 'none'})")
        return found

    def up(self, tools: list[Any]) -> None:
        """The server offers ``tools`` (MCP ``Tool`` objects): serve those it can, announced now."""
        offered = self._offer(tools)
        self._offered = {o.tool.name: o for o in offered}
        self.toolset.problem = None
        self.toolset.replace([self.service], [o.descriptor for o in offered])
        log.info("MCP server %r serves %s", self.name, ", ".join(o.descriptor.name for o in offered) or "no tool")

    def down(self, problem: str) -> None:
        """The server went down: say so; a stdio server's tools are withdrawn until it is back."""
        self.toolset.problem = f"MCP server {self.name!r} {problem}"
        if self.settings.stdio:
            self.toolset.replace([])

    def _offer(self, tools: list[Any]) -> list[Offered]:
        """The tools as served: each under its tghost name (:func:`tghost_mcp.names.tool_name`).
        A tool without one, or whose name another tool of this server has, or that cannot be
        described, or whose name another server serves, is skipped with one log line."""
        offered: dict[str, Offered] = {}
        for tool in tools:
            name = tool_name(self.settings.prefix, tool.name)
            if name is None:
                self._skip(tool.name, "it has no letter or digit to make a tool name of")
            elif name in offered:
                self._skip(tool.name, f"its name maps to {name!r}, which tool {offered[name].tool.name!r} of this "
                                      "server has")
            else:
                try:
                    offered[name] = offer(self.name, name, tool, self.settings.group)
                except tghost.DescriptorError as exc:
                    self._skip(tool.name, str(exc))
        for name, owner in CLAIMS.claim(self.name, list(offered)).items():
            self._skip(offered.pop(name).tool.name, f"MCP server {owner!r} serves a tool named {name!r}; give one "
                                                    f"of them a prefix ([{TABLE}.{self.name}] prefix)")
        return list(offered.values())

    def _skip(self, tool: str, why: str) -> None:
        if tool not in self._refused:
            self._refused.add(tool)
            log.warning("MCP server %r: tool %r is not served: %s", self.name, tool, why)

    @tghost.hookimpl
    def tghost_register_services(self, register: Any) -> None:
        """Register the server's toolset (its service and tools, changed while the host runs)."""
        register(self.toolset)

    @tghost.hookimpl
    def tghost_shutdown(self) -> None:
        """Stop the server and free its tool names."""
        self.server.stop()
        CLAIMS.release(self.name)
