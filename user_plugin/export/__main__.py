"""``python -m user_plugin.export``: see :mod:`user_plugin.export.cli`."""

import sys

from .cli import main

sys.exit(main())
