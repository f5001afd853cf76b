"""Renders a session's pages from the Jinja2 templates the report file and the web console share.

The report file must open anywhere, offline, years later, so it carries its own CSS and a few
lines of JavaScript and loads nothing. Everything in a page that came from a user, a model, a
command or a file name is untrusted: every ``{{ value }}`` goes through :func:`html.escape` with
its control characters and bidirectional overrides shown as escapes
(:func:`orchmode.views.escape.visible`), as on a terminal, where an override would reorder the
text as it reorders a terminal's. Only the HTML of orchmode's own Markdown sanitiser
(:mod:`orchmode.views.markdown`: any HTML shown as text, only http, https and mailto links, no
image loaded) reaches a page unescaped, marked safe here and never in a template. The report's
Content-Security-Policy allows only its own script (by hash) and no fetches, so even a missed
escape could not run injected code or call out.
"""

from __future__ import annotations

import base64
import hashlib
import re
from functools import cache
from html import escape
from importlib.resources import files
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from jinja2.ext import Extension
from markupsafe import Markup

from ..records.history import SessionHistory
from . import report_model
from .escape import visible
from .formatting import money, seconds, when
from .markdown import to_html, to_inline_html

#: A Jinja tag, expression or comment: left as written when the lines around it are joined.
_JINJA_SYNTAX = re.compile(r"(\{%.*?%\}|\{\{.*?\}\}|\{#.*?#\})", re.DOTALL)
#: A character HTML gives a meaning to.
_HTML_SPECIAL = re.compile("[&<>\"']")
#: A line break with the indentation around it, in a template's own markup.
_LINE_BREAK = re.compile(r"[ \t]*\n\s*")


class JoinedLines(Extension):
    """Joins each template's lines, so the markup can be indented for people while a page
    carries no whitespace between tags (a space in text is written on its line)."""

    def preprocess(self, source: str, name: str | None, filename: str | None = None) -> str:
        parts = _JINJA_SYNTAX.split(source)
        return "".join(
            part if index % 2 else _LINE_BREAK.sub("", part) for index, part in enumerate(parts)
        )


def _shown(value: object) -> object:
    """Every value a template prints: escaped, with its control characters made visible.

    Text with nothing to escape or show — nearly all of it — goes on as it is (autoescaping
    leaves it so); the rest is escaped here, quotes as :func:`html.escape` writes them.
    """
    if isinstance(value, Markup) or type(value) is int:
        return value
    text = value if isinstance(value, str) else str(value)
    shown = visible(text)
    if shown is text and _HTML_SPECIAL.search(text) is None:
        return text
    # str.__new__ skips Markup's own constructor: a page prints tens of values per agent
    return str.__new__(Markup, escape(shown, quote=True))


def _markdown(text: str, breaks: bool = False) -> Markup:
    kind = "breaks" if breaks else "block"
    return report_model.remembered(
        (kind, text), lambda: Markup(to_html(visible(text), breaks=breaks))
    )


def _markdown_inline(text: str) -> Markup | None:
    """A single paragraph's inline HTML, or None when the text is more than one."""

    def make() -> Markup | None:
        inline = to_inline_html(visible(text))
        return None if inline is None else Markup(inline)

    return report_model.remembered(("inline", text), make)


@cache
def _environment() -> Environment:
    environment = Environment(
        loader=PackageLoader("orchmode.views", "templates"),
        autoescape=select_autoescape(["html", "j2"], default_for_string=True),
        finalize=_shown,
        extensions=[JoinedLines],
        auto_reload=False,  # package data: a template changes only with orchmode
    )
    environment.filters.update(
        markdown=_markdown,
        markdown_inline=_markdown_inline,
        money=money,
        seconds=seconds,
        clock=report_model.clock,
        hour=lambda at: when(at, "%H:%M:%S"),
        thousands="{:,}".format,
    )
    environment.globals.update(model=report_model)
    return environment


def _static(name: str) -> str:
    return (files("orchmode.views") / "templates" / "static" / name).read_text(encoding="utf-8")


@cache
def report_style() -> str:
    """The pages' stylesheet."""
    return _static("report.css")


@cache
def report_script() -> str:
    """The report's script: it opens an agent's details from its timeline bar and lets the
    legend hide states; the page is complete without it."""
    return _static("report.js")


def script_hash(script: str) -> str:
    """``sha256-…`` of a script, for a Content-Security-Policy that allows only it."""
    return "sha256-" + base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode()


def _render(template: str, **values: Any) -> str:
    with report_model.rendering():
        return _environment().get_template(template).render(**values)


def render_report(history: SessionHistory) -> str:
    """The whole self-contained HTML document for one session."""
    script = report_script()
    csp = (
        "default-src 'none'; style-src 'unsafe-inline'; "
        f"script-src '{script_hash(script)}'; base-uri 'none'; form-action 'none'"
    )
    sections = run_sections(history)
    return _render(
        "report.html.j2",
        history=history,
        csp=csp,
        style=Markup(report_style()),
        script=Markup(script),
        sections=Markup(sections),
    )


def run_sections(history: SessionHistory, *, transcripts: bool = True) -> str:
    """Every section of a session's report as one HTML fragment: the report file wraps it in a
    self-contained page, the web console in its own. Without ``transcripts`` each agent's
    details hold an empty ``data-transcript`` placeholder, for a page that loads an agent's
    transcript (:func:`agent_transcript`) only when it is opened."""
    return _render("sections.html.j2", history=history, transcripts=transcripts)


def agent_transcript(history: SessionHistory, agent_id: str) -> str | None:
    """One agent's transcript (its facts, prompt, result, change and commands) by its anchor
    (``agent-t1-2-3-worker``); None when no agent of the session has that anchor."""
    found = report_model.find_agent(history, agent_id)
    if found is None:
        return None
    turn, fanout, agent = found
    return _render(
        "transcript.html.j2",
        turn=turn,
        agent=agent,
        nodes=report_model.on_nodes(history),
        checked=fanout.resolution_verifier(agent),
    )
