"""``python -m tghost``: the same as the ``tghost`` command."""

from .cli import main

main()
