"""probe: discover's first step under isolation. Each plugin is imported, and its hooks called,
in a child process first (one pebble task per plugin), so a plugin that crashes or hangs the
interpreter is reported ``failed`` and the host never imports it.

Never imports a plugin in the calling process.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from importlib.metadata import EntryPoint
from typing import Any

import pebble

from .executors.process import CONTEXT, describe_exit

__all__ = ["PROBE_TIMEOUT", "probe"]

log = logging.getLogger(__name__)

#: Seconds one plugin's import and hook calls may take in the probe before it counts as hung.
PROBE_TIMEOUT = 120.0


def probe(eps: Sequence[EntryPoint], timeout: float = PROBE_TIMEOUT, config: dict[str, Any] | None = None
          ) -> dict[str, str]:
    """Import each entry point, and call its hooks (with ``config``, the host's TOML config file
    as a dict, so the plugins it adds are loaded too), one at a time in a child process.

    Returns, by entry point name, why each plugin that killed its process (a signal, ``os._exit``,
    ``sys.exit``) or hung past ``timeout`` seconds must not be imported; the others are left out.
    An ordinary exception is left out too: the host's own import reports it with its traceback.
    """
    if not eps:
        return {}
    failures: dict[str, str] = {}
    with pebble.ProcessPool(max_workers=1, context=CONTEXT) as pool:
        scheduled = [(ep, pool.schedule(_load, (ep.name, ep.value, config or {}), timeout=timeout)) for ep in eps]
        for ep, future in scheduled:
            try:
                fatal = future.result()
            except pebble.ProcessExpired as exc:
                fatal = f"importing it killed the process ({describe_exit(exc.exitcode)})"
            except FutureTimeout:
                fatal = f"importing it did not finish within {timeout:g}s"
            except Exception:
                fatal = None
            if fatal is not None:
                failures[ep.name] = f"{fatal} in a probe process, so the host did not import it"
                log.error("plugin %r: %s", ep.name, failures[ep.name])
    return failures


def _load(name: str, value: str, config: dict[str, Any]) -> str | None:
    """In the probe process: discover one entry point; what would have ended the importer, or ``None``."""
    from .discover import ENTRY_POINT_GROUP, PluginSelection, discover

    logging.disable(logging.CRITICAL)  # the host reports the plugin's ordinary errors itself
    try:
        catalog = discover([EntryPoint(name, value, ENTRY_POINT_GROUP)], strict=False, selection=PluginSelection(),
                           config=config)
        catalog.shutdown()
    except Exception:
        return None
    except BaseException as exc:  # SystemExit, KeyboardInterrupt: they would end the host
        return f"importing it raised {type(exc).__name__}({exc})"
    return None
