"""``python -m user_plugin.hub``: the ``vaswani-translate`` command
(:mod:`user_plugin.commands.translate`)."""

import sys

from ..commands.translate import cli_main

sys.exit(cli_main())
