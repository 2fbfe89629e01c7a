"""author: what a plugin author writes and gets: the hookspecs, ``ToolService`` and ``@tghost.tool``,
the one argument policy of both, and ``tghost new``'s templates.

Never touches Pulsar.
"""
