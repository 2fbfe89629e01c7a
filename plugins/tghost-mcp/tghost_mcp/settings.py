"""settings: the ``[mcp-servers.<name>]`` tables of the host's config file, one per MCP server to
mount, checked with pydantic: a stdio server (``command``, ``args``, ``env``, ``cwd``) or a
streamable-HTTP one (``url``, ``token-file``), and what every server may set (``prefix``,
``group``, ``timeout``, ``max-concurrency``, ``start-timeout``).

Reads tables only: never starts a server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

__all__ = ["TABLE", "ServerSettings", "server_tables"]

#: The config file's table of MCP servers: ``[mcp-servers.<name>]``.
TABLE = "mcp-servers"


def _kebab(name: str) -> str:
    return name.replace("_", "-")


class ServerSettings(BaseModel):
    """One ``[mcp-servers.<name>]`` table; its keys are spelled with ``-`` (``token-file``).

    - ``command`` (with ``args``, ``env`` over the host's ``HOME``, ``PATH``, ... and ``cwd``, by
      default the host's working directory): a stdio server, a process the host starts.
    - ``url`` (with ``token-file``, a file whose text is sent as a bearer token): a streamable-HTTP
      server. A table has one of ``command`` and ``url``, never both.
    - ``prefix``: put before each tool's name (letters, digits, ``_``, ``.``, ``-``; default none).
    - ``group``: the tools' seed 001 groups (default ``["default"]``).
    - ``timeout`` (seconds) and ``max-concurrency``: the tool service's (default the host's:
      ``tghost run --timeout``, 30 s, and ``--max-concurrency``, 16).
    - ``start-timeout``: seconds a start may take, from starting the process (or connecting)
      to the end of the first listing of the tools (default 30).
    """

    model_config = ConfigDict(extra="forbid", alias_generator=_kebab, frozen=True)

    command: str | None = Field(default=None, min_length=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: Path | None = None
    url: str | None = Field(default=None, pattern=r"^https?://\S+$")
    token_file: Path | None = None
    prefix: str = Field(default="", pattern=r"^([A-Za-z0-9][A-Za-z0-9_.-]{0,63})?$")
    group: list[str] | None = None
    timeout: float | None = Field(default=None, gt=0)
    max_concurrency: int | None = Field(default=None, ge=1)
    start_timeout: float = Field(default=30.0, gt=0)

    @field_validator("group", mode="before")
    @classmethod
    def _one_group(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _one_transport(self) -> ServerSettings:
        if (self.command is None) == (self.url is None):
            raise ValueError("give either 'command' (a stdio server) or 'url' (a streamable-HTTP server)"
                             + (", not both" if self.command else ""))
        stdio_only = [key for key in ("args", "env", "cwd") if key in self.model_fields_set]
        if self.url is not None and stdio_only:
            raise ValueError(f"{', '.join(map(repr, stdio_only))} belong to a stdio server ('command'), not to 'url'")
        if self.command is not None and self.token_file is not None:
            raise ValueError("'token-file' belongs to a streamable-HTTP server ('url'), not to 'command'")
        return self

    @property
    def stdio(self) -> bool:
        """Whether the server is a process the host starts (else it is reached at ``url``)."""
        return self.command is not None

    @property
    def origin(self) -> str:
        """Where the server comes from, in a line: its command line, or its URL."""
        return " ".join([self.command, *self.args]) if self.command is not None else str(self.url)

    @classmethod
    def of(cls, name: str, table: Any) -> ServerSettings:
        """The settings of the server ``name`` from its table (as TOML gave it).

        Raises:
            ValueError: the table is not a table, lacks ``command`` and ``url`` or has both, or a
                key is unknown or of the wrong type: one line naming ``[mcp-servers.<name>]`` and
                each key.
        """
        try:
            return cls.model_validate(table)
        except ValidationError as exc:
            problems = "; ".join(_problem(error) for error in exc.errors())
            raise ValueError(f"[{TABLE}.{name}] in the config file: {problems}") from None


def _problem(error: Any) -> str:
    """One pydantic error as ``key 'k': what is wrong`` (a key it does not know: the keys it does)."""
    where = ".".join(map(str, error["loc"]))
    if error["type"] == "extra_forbidden":
        keys = ", ".join(field.alias or name for name, field in ServerSettings.model_fields.items())
        return f"key {where!r} is not a setting of an MCP server (they are: {keys})"
    message = error["msg"].removeprefix("Value error, ")
    return f"key {where!r}: {message}" if where else message


def server_tables(config: dict[str, Any]) -> dict[str, Any]:
    """The ``[mcp-servers.<name>]`` tables of the host's config file (a dict), by name, in the
    file's order; ``{}`` without any.

    Raises:
        ValueError: ``mcp-servers`` is not a table.
    """
    tables = config.get(TABLE, {})
    if not isinstance(tables, dict):
        raise ValueError(f"'{TABLE}' in the config file is not a table: write [{TABLE}.<name>] tables, one per server")
    return tables
