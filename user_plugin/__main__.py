"""``python -m user_plugin``: print the plugin's ``--user-dir`` path (as ``vaswani-user-dir``)."""

import sys

from .commands.user_dir import cli_main

sys.exit(cli_main())
