"""``python -m controller.cli``: the same entry point as the installed ``ffswarm`` command."""

from controller.cli.main import main

main()
