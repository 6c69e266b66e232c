"""``python -m user_plugin.hub``: see :mod:`user_plugin.hub.cli`."""

import sys

from .cli import main

sys.exit(main())
