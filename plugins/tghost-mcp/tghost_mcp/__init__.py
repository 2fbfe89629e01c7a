"""tghost-mcp: MCP servers as tghost tool services. :mod:`.plugin` is the ``tghost.plugins`` entry
point: it mounts each ``[mcp-servers.<name>]`` server of the host's config file as a plugin of its
own, whose tools are the server's (:mod:`.tools`), kept live by :mod:`.server`.
"""
