"""operate: one ``tghost run`` put together (serve, announce, watch for plugins), and what an
operator sees of it: Prometheus metrics, ``/health``, the audit log.
"""
