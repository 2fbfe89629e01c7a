"""__main__: ``python -m tghost``, the same as the ``tghost`` command."""

from tghost.cli import main

main()
