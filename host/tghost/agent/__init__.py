"""agent: the caller's side. Read the epoch topics, keep the live tool directory, call a tool by
name or a service by id.

Never imports the host side (serving, announcing, discovery, operate): an import-linter
contract in pyproject.toml.
"""
