"""``python -m orchmode`` is the ``orchmode`` command."""

import sys

from .cli import main

sys.exit(main())
