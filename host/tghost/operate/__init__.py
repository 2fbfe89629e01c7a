"""operate: one host put together (:class:`~tghost.operate.host.Host`: serve, announce, watch for
plugins; ``tghost run`` and embedders alike), and what an operator sees of it: Prometheus metrics,
``/health``, the audit log.
"""
