"""``python -m corral`` is the ``corral`` command."""

from corral.cli.entry import main

main()
