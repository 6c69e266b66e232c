"""``python -m user_plugin.export``: the ``vaswani-export`` command
(:mod:`user_plugin.commands.export`)."""

import sys

from ..commands.export import cli_main

sys.exit(cli_main())
