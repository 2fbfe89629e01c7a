"""modules: which installed Amplifier modules are tool modules, and the settings the host's config
file gives each (``[amplifier.<entry point name>]``, in the spirit of Amplifier's mount plan).

Reads entry point metadata and config tables only: never imports or mounts a module.
"""

from __future__ import annotations

import os
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = ["ENTRY_POINT_GROUP", "OWN_MODULE", "ModuleSettings", "is_tool_module", "tool_modules"]

#: Amplifier's entry point group for modules (seed 002, "Entry Point Pattern").
ENTRY_POINT_GROUP = "amplifier.modules"
#: This distribution's own module (every live tghost tool in a session): never served back.
OWN_MODULE = "tool-tghost"

#: Amplifier's naming convention for a module without metadata, in amplifier-core's order
#: (``ModuleLoader`` types entry points by the first keyword in the name; no keyword: a tool).
_NAMING = (("orchestrat", "orchestrator"), ("loop", "orchestrator"), ("provider", "provider"),
           ("tool", "tool"), ("hook", "hook"), ("context", "context"))


def is_tool_module(name: str) -> bool:
    """Whether Amplifier types the module named ``name`` (its entry point name) a tool module:
    ``tool-filesystem`` yes; ``provider-anthropic``, ``loop-basic``, ``hooks-logging`` no."""
    lowered = name.lower()
    return next((kind for keyword, kind in _NAMING if keyword in lowered), "tool") == "tool"


def tool_modules() -> list[EntryPoint]:
    """The installed ``amplifier.modules`` entry points of tool modules, by name, without
    :data:`OWN_MODULE`. Nothing is imported."""
    found = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)
             if ep.name != OWN_MODULE and is_tool_module(ep.name)}
    return [found[name] for name in sorted(found)]


class ModuleSettings(BaseModel):
    """One module's ``[amplifier.<name>]`` table in the host's config file; every key optional.

    - ``config``: the table passed to the module's ``mount(coordinator, config)`` (default ``{}``).
    - ``working_dir``: the ``session.working_dir`` capability (default: the host's working directory).
    - ``mount_timeout``: seconds ``mount()`` may take before the module is reported and skipped.
    """

    model_config = ConfigDict(extra="forbid")

    config: dict[str, Any] = Field(default_factory=dict)
    working_dir: str = Field(default_factory=os.getcwd)
    mount_timeout: float = Field(default=60.0, gt=0)

    @classmethod
    def of(cls, name: str, config: dict[str, Any]) -> ModuleSettings:
        """The settings of module ``name`` in the host's config file ``config`` (as a dict).

        Raises:
            ValueError: the table is not a table, or a key is unknown or of the wrong type;
                the message names ``[amplifier.<name>]`` and the key.
        """
        table = config.get("amplifier", {})
        table = table.get(name, {}) if isinstance(table, dict) else table
        try:
            return cls.model_validate(table)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'the table'}: {e['msg']}" for e in exc.errors())
            raise ValueError(f"[amplifier.{name}] in the config file: {problems}") from None
