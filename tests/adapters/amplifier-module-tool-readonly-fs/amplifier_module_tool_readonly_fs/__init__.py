"""Read-only filesystem tools for Amplifier: ``read_file`` and ``list_dir`` under one workspace.

An Amplifier tool module as seed 002 describes it (after amplifier-module-tool-filesystem's
ReadTool): an ``amplifier.modules`` entry point naming ``mount(coordinator, config)``, tools with
``name``, ``description``, an input schema and ``async execute(input) -> ToolResult``, failures
reported as ``success=False``. tghost's tests pip-install it and serve it unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from amplifier_core import ModuleCoordinator, ToolResult
from amplifier_core.events import ARTIFACT_READ

#: Amplifier module metadata: amplifier-core's loader derives the mount point ("tools") from it.
__amplifier_module_type__ = "tool"

logger = logging.getLogger(__name__)


class Workspace:
    """The directory the tools may read (config ``working_dir``, else ``session.working_dir``)."""

    def __init__(self, config: dict[str, Any], coordinator: ModuleCoordinator) -> None:
        self.root = Path(config["working_dir"]).resolve()
        self.max_bytes = int(config.get("max_bytes", 1024 * 1024))
        self.coordinator = coordinator

    def resolve(self, given: str) -> Path | None:
        """The path ``given`` names under the workspace, or ``None`` if it is outside."""
        path = (self.root / given).resolve()
        return path if path == self.root or self.root in path.parents else None


class ReadFileTool:
    """Read a text file, with line numbers."""

    name = "read_file"
    description = "Read a text file under the workspace, with line numbers (cat -n style)."

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace

    @property
    def input_schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {
                "file_path": {"type": "string", "description": "Path of the file, relative to the workspace"},
                "offset": {"type": "integer", "minimum": 1, "description": "First line to read (1-indexed)"},
                "limit": {"type": "integer", "minimum": 1, "description": "How many lines to read"},
            },
            "required": ["file_path"],
        }

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        file_path = input.get("file_path", "")
        offset, limit = input.get("offset", 1), input.get("limit", 2000)
        path = self.workspace.resolve(file_path)
        if path is None:
            return ToolResult(success=False, error={"message": f"Access denied: {file_path} is outside the workspace"})
        if not path.is_file():
            return ToolResult(success=False, error={"message": f"Path not found: {file_path}"})
        size = path.stat().st_size
        if size > self.workspace.max_bytes:
            return ToolResult(success=False, error={
                "type": "FileTooLarge", "size_bytes": size,
                "message": f"{file_path} is {size} bytes, over the limit of {self.workspace.max_bytes}"})
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError:
            return ToolResult(success=False, error={"type": "UnicodeDecodeError",
                                                    "message": f"Cannot read file: {file_path} (not a text file)"})
        selected = lines[offset - 1:offset - 1 + limit]
        await self.workspace.coordinator.hooks.emit(ARTIFACT_READ, {"path": str(path), "bytes": size})
        content = "\n".join(f"{number:6d}\t{line}" for number, line in enumerate(selected, start=offset))
        return ToolResult(success=True, output={"file_path": file_path, "content": content,
                                                "total_lines": len(lines), "lines_read": len(selected)})


class ListDirTool:
    """List a directory."""

    name = "list_dir"
    description = "List a directory under the workspace: one 'DIR  name' or 'FILE name' line per entry."

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace

    def get_schema(self) -> dict[str, Any]:
        return {"type": "object",
                "properties": {"path": {"type": "string", "description": "Directory, relative to the workspace"}}}

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        given = input.get("path", ".")
        path = self.workspace.resolve(given)
        if path is None or not path.is_dir():
            return ToolResult(success=False, error={"message": f"Not a directory in the workspace: {given}"})
        entries = sorted(path.iterdir(), key=lambda p: (not p.is_dir(), p.name))
        return ToolResult(success=True,
                          output="\n".join(f"{'DIR ' if p.is_dir() else 'FILE'} {p.name}" for p in entries))


async def mount(coordinator: ModuleCoordinator, config: dict[str, Any] | None = None) -> Callable[[], Awaitable[None]]:
    """Mount ``read_file`` and ``list_dir``; config ``working_dir`` (default: the session's) and
    ``max_bytes`` (default 1 MiB). Returns the cleanup."""
    config = dict(config or {})
    if "working_dir" not in config:
        config["working_dir"] = coordinator.get_capability("session.working_dir") or "."
    workspace = Workspace(config, coordinator)
    for tool in (ReadFileTool(workspace), ListDirTool(workspace)):
        await coordinator.mount("tools", tool, name=tool.name)
    coordinator.register_contributor("observability.events", "tool-readonly-fs", lambda: [ARTIFACT_READ])
    logger.info("Mounted read-only filesystem tools under %s", workspace.root)

    async def cleanup() -> None:
        logger.info("Unmounted read-only filesystem tools under %s", workspace.root)

    return cleanup
