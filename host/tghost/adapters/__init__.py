"""adapters: meet other agents: the MCP bridge (``tghost mcp``), exports to TrustGraph, OpenAI and
MCP shapes, and TrustGraph's config service.
"""
