"""lazy: a package's public names, each imported from the module that defines it on first
access (PEP 562), so that importing the package costs nothing until a name is used.

Imports nothing of tghost: ``tghost`` and ``tghost.protocol`` build their ``__getattr__`` and
``__dir__`` here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["exports"]


def exports(
    namespace: dict[str, Any], where: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of a package whose globals are ``namespace``.

    ``where`` maps each lazily loaded name to the dotted name of the module that defines it.
    ``__getattr__(name)`` imports that module, keeps the value in ``namespace`` (the next access
    is a plain attribute) and returns it; ``__dir__()`` is the sorted ``namespace["__all__"]``.

    Raises (from ``__getattr__``):
        AttributeError: ``name`` is not in ``where``; the message is Python's own
            (``module 'tghost' has no attribute 'x'``).
    """
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name]), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(namespace["__all__"])

    return __getattr__, __dir__
