"""The settings table of docs/configuration.md, made from ``Settings`` by ``settings_table()``.

``python scripts/settings_table.py`` prints the table; ``--write`` puts it into
docs/configuration.md between its markers; ``--check`` exits 1 (saying what differs) when
the page's copy is stale. The table is ``orchmode.core.settings.settings_table()``, the
same declaration the flags, the ``ORCHMODE_*`` variables and the TOML keys come from.
"""

from __future__ import annotations

import sys
from pathlib import Path

import page_block

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "configuration.md"
BEGIN = "<!-- settings: made by scripts/settings_table.py from orchmode's Settings -->"
END = "<!-- /settings -->"


def table() -> str:
    """``settings_table()`` of the source tree next to this script."""
    sys.path.insert(0, str(ROOT / "src"))
    from orchmode.core.settings import settings_table

    return settings_table()


def main() -> int:
    return page_block.main(
        __doc__.split("\n\n")[0], PAGE, BEGIN, END, table(), "scripts/settings_table.py"
    )


if __name__ == "__main__":
    sys.exit(main())
