"""A session as one self-contained HTML file: timeline, findings, agents, totals.

The report is rendered from the templates the web console shows too (:mod:`orchmode.views.pages`);
the command line and the console's helpers import it from here.
"""

from __future__ import annotations

from .pages import render_report, run_sections

__all__ = ["render_report", "run_sections"]
