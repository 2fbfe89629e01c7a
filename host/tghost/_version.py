"""_version: the version of tghost, in one place (``tghost.__version__`` re-exports it)."""

__version__ = "0.1.0"
