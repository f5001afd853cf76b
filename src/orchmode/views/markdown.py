"""Answers and findings are Markdown: drawn for a terminal by Rich, and as sanitised HTML.

Both readers parse the same way: CommonMark with tables and strikethrough, and raw HTML off,
so any HTML in the text (``<script>``, ``<img onerror=…>``, ``List<String>``) is shown as
text, never dropped and never live. The HTML side, for the report, is stricter still: a link
is live only when its scheme is http, https or mailto (a relative, ``javascript:`` or
``data:`` one stays literal text), and an image never loads — it reads as its alt text and
its address. On a terminal an answer's control characters are shown as escapes (see
:mod:`orchmode.views.escape`); into a pipe or a file it is printed exactly as the model wrote it.

Rich and markdown-it are imported here, so only a command that prints an answer on a
terminal, or writes a report, pays for them.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from functools import cache
from html import escape
from typing import TYPE_CHECKING, Any, TextIO

from .escape import visible

if TYPE_CHECKING:
    from markdown_it import MarkdownIt
    from markdown_it.rules_core import StateCore
    from markdown_it.token import Token
    from markdown_it.utils import EnvType, OptionsDict

#: The only schemes a link in the report may have.
SAFE_SCHEMES = frozenset({"http", "https", "mailto"})

_SCHEME = re.compile(r"([a-z][a-z0-9+.\-]*):", re.IGNORECASE)


def safe_url(url: str) -> bool:
    """True for an absolute http, https or mailto address; False for anything else (relative
    ones included: the report is a file that may be read anywhere)."""
    found = _SCHEME.match(url)
    return found is not None and found[1].lower() in SAFE_SCHEMES


# --- the terminal -------------------------------------------------------------------------


def is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty is not None and isatty())
    except ValueError:  # a closed stream
        return False


def print_answer(text: str, stream: TextIO | None = None) -> None:
    """An answer on ``stream`` (stdout): rendered Markdown on a terminal, as wide as it is,
    its control characters shown as escapes; anywhere else exactly ``print(text)``, byte for
    byte (a file or a program gets the model's text as it is)."""
    out = stream if stream is not None else sys.stdout
    if not is_terminal(out):
        print(text, file=out, flush=True)
        return
    from rich.console import Console

    body = text.lstrip("\n")
    console = Console(file=out, highlight=False)
    for _ in range(len(text) - len(body)):  # the blank lines before a second answer
        console.line()
    console.print(terminal_markdown(visible(body)))
    out.flush()


def terminal_markdown(text: str) -> Any:
    """A Rich renderable for ``text``: links show their address, images their alt text and
    address, HTML is shown as written."""
    from rich.markdown import Markdown

    class _Markdown(Markdown):
        def __init__(self, markup: str) -> None:
            super().__init__(markup, hyperlinks=False)
            self.parsed = _terminal_parser().parse(markup)

    return _Markdown(text)


@cache
def _terminal_parser() -> MarkdownIt:
    md = _parser()
    md.core.ruler.push("orchmode_terminal", _plain_images_and_autolinks)
    return md


def _plain_images_and_autolinks(state: StateCore) -> None:
    """Images become ``alt (address)`` and ``<https://…>`` plain text (Rich would show the
    address twice)."""
    from markdown_it.token import Token

    for block in state.tokens:
        if block.type != "inline" or not block.children:
            continue
        children: list[Token] = []
        autolink = False
        for token in block.children:
            if token.type == "image":
                text = Token("text", "", 0)
                text.content = _image_text(state, token)
                children.append(text)
            elif token.type == "link_open" and token.markup == "autolink":
                autolink = True
            elif token.type == "link_close" and autolink:
                autolink = False
            else:
                children.append(token)
        block.children = children


def _image_text(state: StateCore, token: Token) -> str:
    alt = _alt(token.children or [])
    src = str(token.attrs.get("src", ""))
    return f"{alt} ({src})" if alt else src


def _alt(tokens: Sequence[Token]) -> str:
    """An image's description as plain text (emphasis and code marks dropped)."""
    parts = []
    for token in tokens:
        if token.type in ("text", "code_inline"):
            parts.append(token.content)
        elif token.type in ("softbreak", "hardbreak"):
            parts.append(" ")
        elif token.children:
            parts.append(_alt(token.children))
    return "".join(parts)


# --- HTML ---------------------------------------------------------------------------------


def to_html(text: str, *, breaks: bool = False) -> str:
    """``text`` as sanitised HTML blocks (paragraphs, lists, headings, tables, code)."""
    return str(_html_parser(breaks).render(str(text)))


def to_inline_html(text: str) -> str | None:
    """The inline HTML of ``text`` when it is one paragraph and nothing more (a one-line
    claim, to sit beside its badge); None when it has blocks of its own."""
    md = _html_parser(False)
    env: dict[str, object] = {}
    tokens = md.parse(str(text), env)
    kinds = [t.type for t in tokens]
    if kinds != ["paragraph_open", "inline", "paragraph_close"]:
        return None
    return str(md.renderer.render(tokens[1].children or [], md.options, env))


def _parser(*, breaks: bool = False) -> MarkdownIt:
    from markdown_it import MarkdownIt

    options = {"html": False, "linkify": False, "typographer": False, "breaks": breaks}
    return MarkdownIt("commonmark", options).enable(["table", "strikethrough"])


@cache
def _html_parser(breaks: bool) -> MarkdownIt:
    md = _parser(breaks=breaks)
    # an unsafe destination is not a link at all: the text stays as written, brackets and all
    md.validateLink = safe_url  # type: ignore[method-assign]
    md.add_render_rule("link_open", _link_open)
    md.add_render_rule("link_close", _link_close)
    md.add_render_rule("image", _image)
    return md


def _link_open(
    self: Any, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    token = tokens[idx]
    href = str(token.attrs.get("href", ""))
    if not safe_url(href):  # never reached through the parser; kept as the last word
        env["orchmode_dropped_link"] = True
        return ""
    title = token.attrs.get("title")
    titled = f' title="{escape(str(title))}"' if title else ""
    return f'<a href="{escape(href)}"{titled} rel="noopener noreferrer nofollow">'


def _link_close(
    self: Any, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    if env.pop("orchmode_dropped_link", False):
        return ""
    return "</a>"


def _image(self: Any, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType) -> str:
    """An image that loads nothing: its alt text, then its address as a link (or as text)."""
    token = tokens[idx]
    alt = _alt(token.children or [])
    src = str(token.attrs.get("src", ""))
    where = (
        f'<a href="{escape(src)}" rel="noopener noreferrer nofollow">{escape(src)}</a>'
        if safe_url(src)
        else f"<code>{escape(src)}</code>"
    )
    label = f"{escape(alt)} " if alt else ""
    return f'<span class="md-image">[image: {label}{where}]</span>'
