"""Answers as Markdown: drawn in a real terminal, left as written in a pipe, and sanitised in
the HTML report (checked by a parser, by properties over arbitrary text, and in Chromium)."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchmode.records.history import read_session
from orchmode.store import EventRow
from orchmode.testing.scenario import OrchestrationScenario
from orchmode.views.markdown import print_answer, safe_url, to_html, to_inline_html
from orchmode.views.report import render_report
from recorded_runs import base_env, orchmode, spawn_on_a_terminal
from test_report import browse, chromium, page_requests  # noqa: F401  (chromium: a fixture)

#: An answer with the structure a terminal should draw: a heading, bullets, code, a long line.
ANSWER = (
    "# Review of the tree\n"
    "\n"
    "- first bullet about `count_words`\n"
    "- second bullet\n"
    "\n"
    "```python\n"
    'print("hello from the code block")\n'
    "```\n"
    "\n"
    "This paragraph is one long line on purpose, so that a terminal seventy-two columns wide "
    "has to wrap it: a renderer that follows the width breaks it before the end."
)
LONG_LINE = ANSWER.rsplit("\n", 1)[1]
SYNTHESIS = "Synthesis: 1 agents reported; 1 results were confirmed."
WIDTH = 72
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][A-Z0-9]")


def screen_text(raw: str) -> str:
    """What a terminal shows of ``raw``, as lines of text: escape sequences and \\r dropped."""
    return _ESCAPES.sub("", raw).replace("\r", "")


def assert_drawn(text: str) -> None:
    """``text`` (a terminal's) shows ANSWER rendered, not as its Markdown source."""
    lines = [line.rstrip() for line in text.splitlines()]
    assert any(line.strip() == "Review of the tree" for line in lines), text
    assert "# Review" not in text and "```" not in text, text
    assert any(line.strip() == "• first bullet about count_words" for line in lines), text
    assert any(line.strip() == "• second bullet" for line in lines), text
    assert "- first bullet" not in text
    assert any(line.strip() == 'print("hello from the code block")' for line in lines), text
    assert LONG_LINE not in text  # wrapped to the terminal's width…
    assert "has to wrap it: a renderer" in " ".join(text.split())  # …with every word shown
    drawn = [line for line in lines if not line.startswith(("[", "orchmode:"))]  # progress
    assert max(len(line) for line in drawn) <= WIDTH, text


def spawn(*args: str, cwd: Path) -> Any:
    return spawn_on_a_terminal(*args, cwd=cwd, width=WIDTH)


# --- in a terminal, and in a pipe ---------------------------------------------------------


@pytest.mark.slow
def test_run_draws_the_answers_as_markdown_in_a_terminal_and_prints_them_as_written_in_a_pipe(
    scripted: Any, tmp_path: Path
) -> None:
    import pexpect

    server = scripted(OrchestrationScenario(subtasks=1, summary=ANSWER))
    flags = ("--base-url", server.url, "--sandbox", "off", "--plain")
    tty = tmp_path / "tty"
    tty.mkdir()
    child = spawn("run", "review this", *flags, cwd=tty)
    try:
        child.expect(pexpect.EOF)
        raw = child.before
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, raw
    text = screen_text(raw)
    assert SYNTHESIS in text
    answer = text.split(SYNTHESIS, 1)[1]
    assert_drawn(answer)
    # the separator between the two answers is a rule across the whole terminal
    assert any(re.fullmatch(f"[─-]{{{WIDTH}}}", line.rstrip()) for line in answer.splitlines())

    piped = tmp_path / "pipe"
    piped.mkdir()
    result = orchmode("run", "review this", *flags, cwd=piped)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{SYNTHESIS}\n\n---\n\n{ANSWER}\n"  # byte for byte


@pytest.mark.slow
def test_chat_draws_an_answer_in_a_terminal_and_prints_it_as_written_in_a_pipe(
    scripted: Any, tmp_path: Path
) -> None:
    import pexpect

    server = scripted(OrchestrationScenario(subtasks=1, summary=ANSWER))
    flags = ("--base-url", server.url, "--no-mode", "--plain", "--sandbox", "off")
    child = spawn("chat", *flags, "--session", "t1", cwd=tmp_path)
    try:
        child.expect_exact("you>")
        child.send("hello\r")
        child.expect_exact("before the end.")  # the answer's last words
        raw = child.before + child.after
        child.expect_exact("you>")
        raw += child.before
        child.send("/exit\r")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    assert_drawn(screen_text(raw))

    result = subprocess.run(
        [sys.executable, "-m", "orchmode", "chat", *flags, "--session", "p1"],
        cwd=tmp_path,
        env=base_env(),
        input="hello\n/exit\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{ANSWER}\n"


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_print_answer_draws_on_a_terminal_and_keeps_the_bytes_elsewhere() -> None:
    drawn = FakeTerminal()
    print_answer("\n# Title\n\n- one\n- two\n\n| a | b |\n|---|---|\n| 1 | 2 |", drawn)
    text = screen_text(drawn.getvalue())
    assert text.startswith("\n") and "# Title" not in text and "Title" in text
    assert "• one" in text and "|---|" not in text and "| a |" not in text  # a drawn table
    plain = io.StringIO()
    print_answer("# Title\n\n- one\n", plain)
    assert plain.getvalue() == "# Title\n\n- one\n\n"


@given(st.text())
def test_into_a_pipe_an_answer_is_exactly_print_s_bytes(text: str) -> None:
    out = io.StringIO()
    print_answer(text, out)
    assert out.getvalue() == text + "\n"


# --- the sanitiser ------------------------------------------------------------------------


class Tree(HTMLParser):
    """Every element with its attributes and the tags and classes of the elements around it."""

    VOID: ClassVar[set[str]] = {
        "area",
        "base",
        "br",
        "col",
        "embed",
        "hr",
        "img",
        "input",
        "link",
        "meta",
        "source",
    }

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str], tuple[str, ...]]] = []
        self.stack: list[tuple[str, str]] = []
        self.texts: list[tuple[str, tuple[str, ...]]] = []
        self.feed(html)
        self.close()

    def _around(self) -> tuple[str, ...]:
        return tuple(f"{tag}.{'.'.join(cls.split())}" for tag, cls in self.stack)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {k: v or "" for k, v in attrs}
        self.elements.append((tag, values, self._around()))
        if tag not in self.VOID:
            self.stack.append((tag, values.get("class", "")))

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                del self.stack[i:]
                break

    def handle_data(self, data: str) -> None:
        self.texts.append((data, self._around()))

    def inside(self, container: str) -> list[tuple[str, dict[str, str]]]:
        """The elements inside an element whose ``tag.class…`` path contains ``container``."""
        return [(t, a) for t, a, around in self.elements if any(container in p for p in around)]

    def text_inside(self, container: str) -> str:
        return "".join(d for d, around in self.texts if any(container in p for p in around))


def browser_url(value: str) -> str:
    """A URL as a browser reads it: tabs and newlines removed, leading controls and spaces
    stripped."""
    return re.sub(r"[\t\n\r]", "", value).lstrip("".join(chr(c) for c in range(33)))


def assert_sanitised(html: str) -> None:
    assert "<script" not in html.lower()
    tree = Tree(html)
    for tag, attrs, _ in tree.elements:
        assert tag not in {"script", "img", "iframe", "object", "embed", "style", "form"}, tag
        assert not [name for name in attrs if name.lower().startswith("on")], (tag, attrs)
        assert set(attrs) <= {"href", "title", "rel", "class"}, (tag, attrs)
        if "href" in attrs:
            assert tag == "a"
            assert re.match(r"(https?|mailto):", browser_url(attrs["href"]), re.I), attrs
            assert "javascript:" not in browser_url(attrs["href"]).lower()
    assert not re.search(r"<[^>]*\son[a-z]*\s*=", html, re.I)  # no on…= inside any tag


FRAGMENTS = st.sampled_from(
    [
        "<script>", "</script>", "<img src=x onerror=alert(1)>", "<a href=", "javascript:",
        "JaVaScRiPt:", "java\tscript:", "&#106;avascript:", "&#x6A;avascript:", "data:",
        "data:text/html,<script>", "vbscript:", "https://example.com", "mailto:a@b.c", "[", "]",
        "(", ")", "![", "](", "<", ">", '"', "'", "`", "```", "\n", "\n\n", " ", "*", "_", "#",
        "- ", "1. ", "|", "---", "\\", ":", "onerror=", " onload=", "=", "&", "&amp;", "<svg/",
        "[x]: ", "<https://a.b>", "<javascript:x>", "\x00", "\u2028",
    ]
)  # fmt: skip
MARKDOWN = st.lists(FRAGMENTS | st.text(max_size=8), max_size=30).map("".join)


@given(MARKDOWN | st.text())
def test_no_text_becomes_script_handlers_or_unsafe_links(text: str) -> None:
    assert_sanitised(to_html(text))
    assert_sanitised(to_html(text, breaks=True))
    inline = to_inline_html(text)
    if inline is not None:
        assert_sanitised(inline)


@pytest.mark.parametrize(
    "text",
    [
        "[x](javascript:alert(1))",
        "[x](JAVASCRIPT:alert(1))",
        "[x](&#106;avascript:alert(1))",
        "[x](java%0ascript:alert(1))",
        "[x](data:text/html;base64,PHNjcmlwdD4=)",
        "[x](vbscript:msgbox)",
        "[x](notes.md)",
        "[x](#agent-t1-1-1-worker)",
        "[x](//example.com/a)",
        "[x][r]\n\n[r]: javascript:alert(1)",
        "<javascript:alert(1)>",
    ],
)
def test_an_unsafe_or_relative_link_is_plain_text(text: str) -> None:
    html = to_html(text)
    assert "<a" not in html and "href" not in html, html
    assert "x" in html or "javascript" in html


def test_safe_links_are_live_and_html_is_shown_as_text() -> None:
    html = to_html(
        '[docs](https://example.com/a?b=1&c=2 "the docs") <https://x.example> '
        "[mail](mailto:a@b.c) <b onclick=x>bold?</b> List<String>"
    )
    tree = Tree(html)
    links = [a for t, a, _ in tree.elements if t == "a"]
    assert [a["href"] for a in links] == [
        "https://example.com/a?b=1&c=2",
        "https://x.example",
        "mailto:a@b.c",
    ]
    assert links[0]["title"] == "the docs"
    assert all(a["rel"] == "noopener noreferrer nofollow" for a in links)
    assert "&lt;b onclick=x&gt;bold?&lt;/b&gt; List&lt;String&gt;" in html
    assert [t for t, _, _ in tree.elements if t == "b"] == []


def test_an_image_is_its_alt_text_and_its_address_and_loads_nothing() -> None:
    html = to_html('![a *diagram*](https://example.com/d.png "t") ![](http://x.example/p.gif)')
    tree = Tree(html)
    assert [t for t, _, _ in tree.elements if t == "img"] == []
    assert "src=" not in html
    assert tree.text_inside("span.md-image").startswith("[image: a diagram https://example.com/")
    hrefs = [a["href"] for t, a, _ in tree.elements if t == "a"]
    assert hrefs == ["https://example.com/d.png", "http://x.example/p.gif"]
    # an image with a destination that is not safe stays literal text
    assert to_html("![a](data:image/png;base64,AAAA)") == (
        "<p>![a](data:image/png;base64,AAAA)</p>\n"
    )


def test_structure_becomes_elements_and_a_code_fence_s_language_is_escaped() -> None:
    html = to_html(
        '# Title\n\n1. one\n2. two\n\n```"><script>\nx < y\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |'
    )
    tags = [t for t, _, _ in Tree(html).elements]
    assert tags[:4] == ["h1", "ol", "li", "li"] and "table" in tags and "td" in tags
    (code,) = [a for t, a, _ in Tree(html).elements if t == "code"]
    assert code["class"] == 'language-"><script>'  # an attribute's value, escaped in the HTML
    assert "x &lt; y" in html and "<script" not in html
    assert to_inline_html("a *b* `c`") == "a <em>b</em> <code>c</code>"
    assert to_inline_html("- a list") is None and to_inline_html("one\n\ntwo") is None


@pytest.mark.parametrize(
    ("url", "safe"),
    [
        ("https://a", True),
        ("HTTP://a", True),
        ("mailto:x@y", True),
        ("javascript:x", False),
        (" https://a", False),
        ("ftp://a", False),
        ("/etc/passwd", False),
        ("", False),
    ],
)
def test_safe_url(url: str, safe: bool) -> None:
    assert safe_url(url) is safe


# --- in the report ------------------------------------------------------------------------

INJECTED = (
    "<script>document.title='pwned'</script>\n"
    "<img src=x onerror=\"document.title='img'\">\n"
    "[bad link](javascript:document.title='js') and [good link](https://example.com)\n"
)
REPORT_ANSWER = (
    "# Answer heading\n\n- answer item one\n- answer item two\n\n"
    "```python\nanswer = 1 < 2\n```\n\n"
    f"{INJECTED}\n"
    "![a picture](https://example.invalid/p.png)\n\n"
    "| file | issue |\n|---|---|\n| a.py | slow |\n"
)
CLAIM = f"`count_words` splits on one space; {INJECTED}"
EVIDENCE = "- wc.py:4\n- wc.py:9\n\n```\nreturn len(text.split(' '))\n```"
SUMMARY = f"## Summary heading\n\nLooked at **wc.py**. {INJECTED}"
TITLE = "orchmode run md-session"


def markdown_history() -> Any:
    usage = {"input_tokens": 1, "output_tokens": 1, "cache_read_tokens": 0, "cache_write_tokens": 0}
    result = {
        "summary": SUMMARY,
        "findings": [{"claim": CLAIM, "evidence": EVIDENCE, "severity": "high"}],
    }
    worker = {"call": 1, "index": 1, "role": "worker"}
    rows = [
        ("TurnStarted", {"text": "review this", "notices": []}),
        ("FanoutStarted", {"call": 1, "subtasks": 1, "not_run": 0}),
        ("SubagentStarted", {**worker, "title": "Check wc.py", "prompt": "Check wc.py"}),
        (
            "SubagentDone",
            {
                **worker,
                "status": "finished",
                "turns": 1,
                "usage": usage,
                "duration": 1.0,
                "result": json.dumps(result),
            },
        ),
        ("FanoutDone", {"call": 1, "duration": 1.0}),
        ("TurnDone", {"stop": "end_turn", "model_calls": 1}),
    ]
    events = [EventRow(i, 100.0 + i, kind, json.dumps(d)) for i, (kind, d) in enumerate(rows)]
    state = json.dumps(
        {
            "history": [
                {"role": "user", "content": "review this"},
                {"role": "assistant", "content": REPORT_ANSWER},
            ]
        }
    )
    return read_session(events, session="md-session", state=state)


def assert_report_markdown(html: str) -> Tree:
    """The report's Markdown is structure and text, and nothing live but safe links."""
    tree = Tree(html)
    assert [t for t, _, _ in tree.elements].count("script") == 1  # the page's own
    assert [t for t, _, _ in tree.elements if t == "img"] == []
    for tag, attrs, _ in tree.elements:
        assert not [name for name in attrs if name.lower().startswith("on")], (tag, attrs)
        href = browser_url(attrs.get("href", "")).lower()
        assert not href.startswith(("javascript:", "data:", "vbscript:")), (tag, attrs)

    answer = tree.inside("div.answer.md")
    tags = [t for t, _ in answer]
    assert {"h1", "ul", "li", "pre", "code", "table", "th", "td"} <= set(tags), tags
    shown = tree.text_inside("div.answer.md")
    assert "<script>document.title='pwned'</script>" in shown  # the tag, as text
    assert "<img src=x onerror=\"document.title='img'\">" in shown
    assert "answer = 1 < 2" in shown and "# Answer heading" not in shown
    assert "[bad link](javascript:document.title='js')" in shown  # literal, not a link
    assert "[image: a picture https://example.invalid/p.png]" in shown
    assert [a["href"] for t, a in answer if t == "a"] == [
        "https://example.com",
        "https://example.invalid/p.png",
    ]
    for container in ("span.claim.md", "div.claim.md"):
        for tag, attrs in tree.inside(container):
            assert tag != "a" or attrs["href"] == "https://example.com"
    claims = tree.text_inside("claim.md")
    assert claims.count("<script>document.title='pwned'</script>") == 2  # findings, agent
    assert "count_words" in claims and "`count_words`" not in claims
    evidence = tree.inside("div.evidence.md")
    assert [t for t, _ in evidence].count("li") == 4 and ("pre", {}) in evidence
    summary = tree.inside("div.summary.md")
    assert [t for t, _ in summary][:1] == ["h2"] and ("strong", {}) in summary
    assert "<script>document.title='pwned'</script>" in tree.text_inside("div.summary.md")
    return tree


def test_the_report_renders_answers_and_findings_as_sanitised_markdown() -> None:
    html = render_report(markdown_history())
    assert_report_markdown(html)
    assert f"<title>{TITLE}</title>" in html


def title_of(dom: str) -> str:
    found = re.search(r"<title>(.*?)</title>", dom, flags=re.S)
    assert found is not None, dom[:2000]
    return found[1]


def test_the_report_s_markdown_in_chromium_runs_nothing_with_or_without_its_policy(
    chromium: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    html = render_report(markdown_history())
    page = tmp_path / "report.html"
    page.write_text(html, encoding="utf-8")
    loaded = browse(chromium, page, tmp_path / "profile", "--dump-dom")
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert title_of(loaded.stdout) == TITLE  # no script ran: the title is the page's own
    tree = assert_report_markdown(loaded.stdout)
    (body,) = [a for t, a, _ in tree.elements if t == "body"]
    assert body.get("data-ready") == "yes"  # the page's own script did run
    assert page_requests(tmp_path / "profile" / "net.json") == []  # the image loaded nothing

    # The sanitiser alone holds: the same page without its Content-Security-Policy, where
    # any script or handler that got through would run, still runs nothing it should not.
    policy = re.compile(r'<meta http-equiv="Content-Security-Policy"[^>]*>\n')
    assert policy.search(html)
    open_page = tmp_path / "open.html"
    open_page.write_text(policy.sub("", html), encoding="utf-8")
    loaded = browse(chromium, open_page, tmp_path / "profile-open", "--dump-dom")
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert title_of(loaded.stdout) == TITLE
    assert_report_markdown(loaded.stdout)

    # The control: on such a page, the same script and handler given as raw HTML do run.
    control = tmp_path / "control.html"
    control.write_text(
        f"<!DOCTYPE html><title>{TITLE}</title><body>{INJECTED}</body>", encoding="utf-8"
    )
    loaded = browse(chromium, control, tmp_path / "profile-control", "--dump-dom")
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert title_of(loaded.stdout) in {"pwned", "img"}
