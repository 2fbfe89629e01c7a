"""integrations: the live tool directory as each agent framework's own tool set.

One small module per framework, each behind the extra that installs it (docs/integrations/):

- ``tghost.integrations.pydantic_ai``: ``pip install "tghost[pydantic-ai]"``;
- ``tghost.integrations.langchain``: ``pip install "tghost[langchain]"``;
- ``tghost.integrations.openai_agents``: ``pip install "tghost[openai-agents]"``.

Each adapts a :class:`tghost.ToolDirectory` and uses only tghost's public names; none is
imported by ``import tghost`` or by any ``tghost`` command, so the core install never needs a
framework.
"""
