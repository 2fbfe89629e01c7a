"""discovery: from installed entry points (group ``tghost.plugins``) and the host's config file to
a checked catalog of services and tools; the import probe; live plugin install.

Never serves or announces.
"""
