"""``python -m orchmode`` is the ``orchmode`` command."""

import sys

from .cli.commands import main

sys.exit(main())
