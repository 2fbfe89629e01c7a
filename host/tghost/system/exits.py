"""exits: how this process ends.

The ``tghost`` console script ends with ``os._exit`` right after its command
(:func:`tghost.cli.app.main`): no interpreter finalisation runs, so nothing it closes has to
wait for pulsar-client's C++ callbacks to drain before it (apache/pulsar-client-python#153,
#203 crash there). Anything else (a host embedded in an application, the tests) finalises
normally, and a Pulsar client waits (:data:`tghost.pulsar.clients.CLOSE_DRAIN`).
"""

from __future__ import annotations

__all__ = ["AT_ONCE", "end_at_once"]

#: Whether this process ends with ``os._exit`` after its work (set by :func:`end_at_once`).
AT_ONCE = False


def end_at_once() -> None:
    """Say that this process will end with ``os._exit``, with no finalisation."""
    global AT_ONCE
    AT_ONCE = True
