"""probe: discovery's first step under isolation. Each plugin is imported, and its hooks called,
in a child process first (one pebble task per plugin), so a plugin that crashes or hangs the
interpreter is reported ``failed`` and the host never imports it.

Never imports a plugin in the calling process.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent import futures
from importlib.metadata import EntryPoint
from typing import Any

import pebble

from tghost.system.processes import CONTEXT, describe_exit

__all__ = ["PROBE_TIMEOUT", "Load", "probe"]

log = logging.getLogger(__name__)

#: Seconds one plugin's import and hook calls may take in the probe before it counts as hung.
PROBE_TIMEOUT = 120.0


#: What the probe process runs per plugin: ``load(name, value, config)`` returns why the plugin
#: would end its importer, or ``None``. A module-level function (it is pickled by reference).
Load = Callable[[str, str, dict[str, Any]], str | None]


def probe(eps: Sequence[EntryPoint], load: Load, timeout: float = PROBE_TIMEOUT,
          config: dict[str, Any] | None = None) -> dict[str, str]:
    """Run ``load`` on each entry point (with ``config``, the host's TOML config file as a dict),
    one at a time in a child process: discovery's import of the plugin and its hook calls.

    Returns, by entry point name, why each plugin that killed its process (a signal, ``os._exit``,
    ``sys.exit``) or hung past ``timeout`` seconds must not be imported; the others are left out.
    An ordinary exception is left out too: the host's own import reports it with its traceback.
    """
    if not eps:
        return {}
    failures: dict[str, str] = {}
    with pebble.ProcessPool(max_workers=1, context=CONTEXT) as pool:
        scheduled = [(ep, pool.schedule(load, (ep.name, ep.value, config or {}), timeout=timeout)) for ep in eps]
        for ep, future in scheduled:
            try:
                fatal = future.result()
            except pebble.ProcessExpired as exc:
                fatal = f"importing it killed the process ({describe_exit(exc.exitcode)})"
            except futures.TimeoutError:
                fatal = f"importing it did not finish within {timeout:g}s"
            except Exception:
                fatal = None
            if fatal is not None:
                failures[ep.name] = f"{fatal} in a probe process, so the host did not import it"
                log.error("plugin %r: %s", ep.name, failures[ep.name])
    return failures
