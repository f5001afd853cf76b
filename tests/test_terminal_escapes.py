"""No control character from an agent reaches the user's terminal raw: one test per surface.

A worker's command, its output, a file it creates, the subtask the model wrote, the model's
answer, the session's name, the worker model's name and an MCP server's stderr all hold
escape sequences that set the clipboard (OSC 52), the window title (OSC 0), clear the screen,
colour text, the 8-bit CSI, a carriage return and a right-to-left override. Each surface is
driven by real `orchmode` processes against the scripted server (or, for the live view, a real
session in this process), read as bytes (a text-mode pipe would turn \\r into \\n), and must
show those characters as their escapes, never as themselves.
"""

from __future__ import annotations

import html
import io
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from conftest import StartServer, settings_for
from network_runs import (
    APPROVAL_ID,
    ASK_WHY,
    ASKED,
    DENY_RULE,
    REFUSED,
    Splicer,
    networked_turn,
)
from orchmode.core.events import (
    ApprovalRequested,
    BashDone,
    Event,
    McpCallDone,
    ScriptDone,
    ScriptStarted,
    SubagentStarted,
)
from orchmode.records.totals import SessionTotals
from orchmode.testing.scenario import OrchestrationScenario
from orchmode.views.display import JsonDisplay, PlainDisplay
from orchmode.views.escape import json_visible, visible
from orchmode.views.live import LiveView
from recorded_runs import base_env, scripted_server, spawn_on_a_terminal
from test_live import record_turn

#: What an agent's text holds: clipboard, title, clear screen, colour, 8-bit CSI, a right-to-
#: left override and a carriage return that would write over the start of the line.
HOSTILE = "\x1b]52;c;aGFja2Vk\x07 \x1b]0;pwned\x07 \x1b[2J \x1b[31mred \x9b1m \u202eevil\rX"
#: The same, as every surface must show it.
SHOWN = r"\x1b]52;c;aGFja2Vk\x07 \x1b]0;pwned\x07 \x1b[2J \x1b[31mred \x9b1m \u202eevil\rX"
#: A file a worker creates, and the session's and the worker model's names.
FILE = "f\x1b[31mname.txt"
SESSION = "s\x1b]0;t\x07\u202e1"
WORKER_MODEL = "claude-w\x1b]0;m\x07"
BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"

#: Any character a terminal acts on, or that reorders what it shows (\n and \t are allowed).
RAW = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{BIDI}]")
#: The sequences a terminal's own drawing uses (Rich's colours and cursor moves): a pty's
#: output is checked for the hostile ones first, then these are taken away.
DRAWING = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")
#: A terminal wide enough that no line of the network's views wraps.
WIDE = 600
HOSTILE_SEQUENCES = ("\x1b]", "\x07", "\x1b[2J", "\x1b[31mred", "\x1b[31mname", "\x9b", "\u202e")


def assert_no_raw(text: str, *, drawn: bool = False) -> None:
    """Nothing in ``text`` a terminal would obey; ``drawn``: it was written for a terminal,
    so its own colour and cursor sequences are allowed, but none of the hostile ones."""
    if drawn:
        for sequence in HOSTILE_SEQUENCES:
            assert sequence not in text, (sequence, text)
        text = DRAWING.sub("", text)
    found = RAW.search(text)
    assert found is None, (found[0] if found else "", text)


def worker_command(_subtask: str) -> str:
    return f"printf '%s\\n' '{HOSTILE}'; touch '{FILE}'"


def scenario(**extra: Any) -> OrchestrationScenario:
    values: dict[str, Any] = {
        "subtasks": [f"Check {HOSTILE}"],
        "scout_command": f"echo '{HOSTILE}'",
        "worker_command": worker_command,
        "summary": f"In brief {HOSTILE}",
    }
    values.update(extra)
    return OrchestrationScenario(**values)


@dataclass
class Output:
    code: int
    stdout: str
    stderr: str


def orchmode(*args: str, cwd: Path, **env: str) -> Output:
    """A real `orchmode` process, its output read as bytes and decoded strictly."""
    done = subprocess.run(
        [sys.executable, "-m", "orchmode", *args],
        cwd=cwd,
        env=base_env(**env),
        capture_output=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    return Output(done.returncode, done.stdout.decode(), done.stderr.decode())


def on_a_terminal(*args: str, cwd: Path, send: tuple[str, ...] = ()) -> str:
    """``orchmode ARGS`` in a pseudo-terminal (stdout and stderr alike): all it wrote there.
    ``send``: lines typed, each once the prompt is shown."""
    import pexpect

    child = spawn_on_a_terminal(*args, cwd=cwd, width=250)
    seen = ""
    try:
        for line in send:
            child.expect_exact("you>")
            seen += child.before + child.after
            child.send(line + "\r")
        child.expect(pexpect.EOF)
        seen += child.before
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, seen
    return str(seen)


def flat(text: str) -> str:
    """``text`` with a terminal's drawing taken away and its lines joined: what it reads as."""
    return " ".join(DRAWING.sub("", text).split())


# --- the one function -----------------------------------------------------------------------

_UNSAFE = st.characters(codec=None, categories=("Cc", "Cs")) | st.sampled_from(BIDI)
_PRINTABLE = st.characters(exclude_categories=("Cc", "Cs"), exclude_characters=BIDI)


@given(st.lists(_UNSAFE | _PRINTABLE | st.sampled_from("\n\t\r\x1b\x9b"), max_size=60))
def test_visible_text_holds_no_control_character_but_newline_and_tab(chars: list[str]) -> None:
    text = "".join(chars)
    shown = visible(text)
    assert re.search(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{BIDI}\ud800-\udfff]", shown) is None
    assert shown.count("\n") == text.count("\n") and shown.count("\t") == text.count("\t")
    assert visible(shown) == shown  # once is enough: escaping twice changes nothing
    shown.encode()  # whatever it held, it can be written to a UTF-8 terminal


@given(st.text(_PRINTABLE | st.sampled_from("\n\t")))
def test_printable_text_of_any_script_comes_back_unchanged(text: str) -> None:
    assert visible(text) is text


def test_each_control_character_is_shown_as_python_writes_it() -> None:
    assert visible(HOSTILE) == SHOWN
    assert visible("naïve 日本語 🎉 مرحبا\n\tok") == "naïve 日本語 🎉 مرحبا\n\tok"
    assert visible("\x00\x7f\x85\u2066\udcff") == r"\x00\x7f\x85\u2066\udcff"


@given(st.text(_UNSAFE | _PRINTABLE))
def test_json_lines_keep_the_data_and_leave_nothing_raw(text: str) -> None:
    line = json_visible(json.dumps({"text": text}, ensure_ascii=False))
    assert json.loads(line) == {"text": text}
    assert RAW.search(line) is None and re.search("[\ud800-\udfff]", line) is None


# --- one recorded hostile run: plain lines, answers in a pipe, show, runs, budget, report ---


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Output]]:
    """A run in which everything an agent can say holds escape sequences, recorded."""
    workdir = tmp_path_factory.mktemp("hostile")
    (workdir / "a.txt").write_text("a\n")
    with scripted_server(scenario()) as server:
        flags = ["--base-url", server.url, "--plain", "--merge", "all", "--session", SESSION]
        flags += ["--worker-model", WORKER_MODEL]
        result = orchmode("run", f"task {HOSTILE}", *flags, cwd=workdir)
    assert result.code == 0, result.stderr
    yield workdir, result


def test_plain_progress_lines_show_the_escapes(hostile: tuple[Path, Output]) -> None:
    _, result = hostile
    assert_no_raw(result.stderr)
    lines = result.stderr.splitlines()
    scout = next(line for line in lines if line.startswith("[main] $ echo"))
    assert scout.startswith(f"[main] $ echo '{SHOWN}'")  # the \r shown, not a line break
    assert any(line.startswith(r"[worker 1.1] $ printf '%s\n' '\x1b]52;c;") for line in lines)
    assert rf"recorded as {visible(SESSION)};" in result.stderr


def test_answers_into_a_pipe_are_kept_as_the_model_wrote_them(
    hostile: tuple[Path, Output],
) -> None:
    """The one place raw text is written: stdout that is not a terminal (a file, a program)
    gets the model's answer byte for byte; on a terminal it is escaped (tested below)."""
    _, result = hostile
    assert result.stdout.endswith(f"\n---\n\nIn brief {HOSTILE}\n")


def test_show_in_a_pipe_shows_the_escapes(hostile: tuple[Path, Output]) -> None:
    workdir, _ = hostile
    shown = orchmode("show", cwd=workdir)
    assert shown.code == 0, shown.stderr
    assert_no_raw(shown.stdout)
    out = shown.stdout
    assert f"user    task {SHOWN}" in out
    assert f"$ echo '{SHOWN}'" in out  # the command
    assert f"evidence {SHOWN}" in out  # the command's output, quoted by the worker
    assert f"summary Finished: Check {SHOWN}" in out  # the model's words
    assert r"f\x1b[31mname.txt" in out  # the file the worker made
    assert f"answer  In brief {SHOWN}" in out
    assert f"session {visible(SESSION)} " in out
    assert visible(WORKER_MODEL) in out  # the models line


@pytest.mark.slow
def test_show_on_a_terminal_shows_the_escapes(hostile: tuple[Path, Output]) -> None:
    workdir, _ = hostile
    drawn = on_a_terminal("show", cwd=workdir)
    assert_no_raw(drawn, drawn=True)
    text = flat(drawn)
    for expected in (f"$ echo '{SHOWN}'", f"evidence {SHOWN}", r"f\x1b[31mname.txt"):
        assert expected in text


def test_runs_shows_the_escapes_in_a_pipe_and_on_a_terminal(hostile: tuple[Path, Output]) -> None:
    workdir, _ = hostile
    listed = orchmode("runs", cwd=workdir)
    assert listed.code == 0, listed.stderr
    assert_no_raw(listed.stdout)
    assert visible(SESSION) in listed.stdout and r"task \x1b]52;c;aGFja2Vk" in listed.stdout
    drawn = on_a_terminal("runs", cwd=workdir)
    assert_no_raw(drawn, drawn=True)
    assert visible(SESSION) in flat(drawn) and r"task \x1b]52;c;" in flat(drawn)


def test_budget_shows_the_escapes(hostile: tuple[Path, Output]) -> None:
    workdir, _ = hostile
    budget = orchmode("budget", cwd=workdir)
    assert budget.code == 0, budget.stderr
    assert_no_raw(budget.stdout)
    assert f"session    {visible(SESSION)}\n" in budget.stdout
    assert visible(WORKER_MODEL) in budget.stdout  # the models line


def test_the_report_escapes_them_as_html_and_shows_them(hostile: tuple[Path, Output]) -> None:
    workdir, _ = hostile
    page = orchmode("report", "-o", "-", cwd=workdir)
    assert page.code == 0, page.stderr
    assert_no_raw(page.stdout)  # nor could `report -o -` on a terminal set its title
    assert r"\x1b]52;c;aGFja2Vk\x07" in page.stdout and r"\u202eevil\rX" in page.stdout
    assert r"f\x1b[31mname.txt" in page.stdout


# --- the other surfaces: JSON lines, the live view, answers on a terminal, chat, errors ------


def test_json_lines_hold_the_exact_data_and_no_raw_character(scripted: Any, tmp_path: Path) -> None:
    server = scripted(scenario())
    result = orchmode("run", "go", "--base-url", server.url, "--json", cwd=tmp_path)
    assert result.code == 0, result.stderr
    assert_no_raw(result.stderr)
    records = [json.loads(line) for line in result.stderr.splitlines()]
    commands = {r["command"] for r in records if r["kind"] == "BashDone"}
    assert f"echo '{HOSTILE}'" in commands  # a program reading them gets the very bytes
    assert worker_command("") in commands


async def test_the_live_view_of_a_real_run_shows_the_escapes(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(scenario())
    stream = io.StringIO()
    console = Console(file=stream, width=250, force_terminal=True, color_system=None)
    totals = SessionTotals()
    view = LiveView(totals, console)
    settings = settings_for(server, tmp_path, worker_model=WORKER_MODEL)
    await record_turn(settings, tmp_path, totals, view)
    view.notice(f"orchmode: warning: {HOSTILE}")
    # A failed MCP call whose error quotes its server: in the commands table as it arrives.
    view(McpCallDone("main", "srv", "tool", 0.1, False, HOSTILE))
    drawn = stream.getvalue()  # every frame the live region drew, and the notice
    final = Console(file=io.StringIO(), width=250, force_terminal=True, color_system=None)
    final.print(view.renderable())
    for text in (drawn, final.file.getvalue()):  # type: ignore[attr-defined]
        assert_no_raw(text, drawn=True)
    text = flat(drawn) + flat(final.file.getvalue())  # type: ignore[attr-defined]
    assert f"$ echo '{SHOWN}'" in text  # the commands table
    assert r"Check \x1b]52;c;aGFja2Vk\x07" in text  # the subtask column
    assert f"orchmode: warning: {SHOWN}" in text
    assert r"error: \x1b]52;c;aGFja2Vk" in text
    assert visible(WORKER_MODEL) in text  # the footer's models line


def test_the_live_view_reads_no_agent_text_as_rich_markup() -> None:
    """A script's error quotes the model's words, a title is the model's: [brackets] and all
    are shown as written, never taken for Rich's styles."""
    view = LiveView(SessionTotals())
    view(ScriptStarted(1, 3))
    view(SubagentStarted(1, 1, "worker", "[bold]title[/bold]"))
    view(ScriptDone(1, 0.5, 1, f"[red]boom[/red] {HOSTILE}"))
    console = Console(file=io.StringIO(), width=250, force_terminal=True, color_system=None)
    console.print(view.renderable())
    drawn = console.file.getvalue()  # type: ignore[attr-defined]
    assert_no_raw(drawn, drawn=True)
    assert "failed: [red]boom[/red] \\x1b]52;c;" in flat(drawn)
    assert "[bold]title[/bold]" in drawn


def test_plain_lines_and_notices_show_the_escapes_of_an_mcp_error() -> None:
    stream = io.StringIO()
    display = PlainDisplay(stream)
    display(McpCallDone("worker 1.1", "srv", "tool", 0.1, False, HOSTILE))
    display(BashDone("worker 1.1", HOSTILE, 0, False, 0.1, "off"))
    display.notice(HOSTILE)
    assert_no_raw(stream.getvalue())
    assert rf"[worker 1.1] mcp srv/tool  (0.1 s, error: {SHOWN})" in stream.getvalue()
    assert rf"[worker 1.1] $ {SHOWN}  (0.1 s, exit 0)" in stream.getvalue()
    assert stream.getvalue().endswith(SHOWN + "\n")


@pytest.mark.slow
def test_a_run_on_a_terminal_draws_no_raw_character(scripted: Any, tmp_path: Path) -> None:
    """The live view (the default on a terminal) and both answers, drawn as Markdown."""
    server = scripted(scenario())
    drawn = on_a_terminal("run", "go", "--base-url", server.url, cwd=tmp_path)
    assert_no_raw(drawn, drawn=True)
    text = flat(drawn)
    assert f"In brief {SHOWN}" in text  # the model's answer
    assert r"$ echo '\x1b]52;c;aGFja2Vk\x07" in text  # the live view's commands


def test_chat_s_lines_and_progress_show_the_escapes(scripted: Any, tmp_path: Path) -> None:
    server = scripted(scenario())
    script = f"/frob{HOSTILE}\nreview this\n/exit\n"
    done = subprocess.run(
        [sys.executable, "-m", "orchmode", "chat", "--base-url", server.url, "--plain"],
        cwd=tmp_path,
        env=base_env(),
        input=script.encode(),
        capture_output=True,
        timeout=120,
    )
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, err
    assert_no_raw(err)
    assert f"$ echo '{SHOWN}'" in err
    assert f"[chat] unknown command /frob{SHOWN.split(' ')[0]}" in out
    assert_no_raw(out)


@pytest.mark.slow
def test_chat_on_a_terminal_draws_the_answer_with_the_escapes(
    scripted: Any, tmp_path: Path
) -> None:
    server = scripted(scenario())
    flags = ("--base-url", server.url, "--no-mode", "--plain", "--session", "t1")
    drawn = on_a_terminal("chat", *flags, cwd=tmp_path, send=("hello", "/exit"))
    assert_no_raw(drawn, drawn=True)
    assert f"In brief {SHOWN}" in flat(drawn)


def test_an_error_line_shows_the_escapes(tmp_path: Path) -> None:
    failed = orchmode("run", "go", "--workdir", str(tmp_path / f"gone{HOSTILE}"), cwd=tmp_path)
    assert failed.code != 0
    assert_no_raw(failed.stderr)
    assert failed.stderr.startswith("orchmode: ") and f"gone{SHOWN}" in failed.stderr


def test_an_mcp_server_s_stderr_in_its_warning_shows_the_escapes(
    scripted: Any, tmp_path: Path
) -> None:
    server = scripted(OrchestrationScenario(subtasks=1))
    config = tmp_path / "servers.json"
    said = HOSTILE.split("\r")[0]  # its last line is quoted: a \r would end it
    start = f"printf '%s\\n' 'broken {said}' >&2; exit 1"
    config.write_text(json.dumps({"mcpServers": {"bad": {"command": "sh", "args": ["-c", start]}}}))
    flags = ("--base-url", server.url, "--plain", "--mcp-config", str(config))
    result = orchmode("run", "go", *flags, cwd=tmp_path)
    assert result.code == 0, result.stderr
    assert_no_raw(result.stderr)
    warnings = [line for line in result.stderr.splitlines() if "'bad'" in line]
    assert warnings and all(f"broken {visible(said)}" in line for line in warnings), result.stderr


async def test_a_hostile_domain_rule_and_question_reach_no_surface_raw(
    serve: StartServer, tmp_path: Path
) -> None:
    """The proxy's and the broker's events hold what a command named: a domain, a command
    to approve, a rule from a repository's file. Live view (the question waiting and the
    answer's notice), plain lines, JSON lines, ``show`` and the report all show the escapes."""
    server = await serve(OrchestrationScenario(subtasks=2))
    stream = io.StringIO()
    console = Console(file=stream, width=WIDE, force_terminal=True, color_system=None)
    view = LiveView(SessionTotals(), console)
    plain, lines = io.StringIO(), io.StringIO()
    frames: list[str] = []

    def draw(event: Event) -> None:
        if isinstance(event, ApprovalRequested):  # the question, while it waits
            frame = Console(file=io.StringIO(), width=WIDE, force_terminal=True, color_system=None)
            frame.print(view.renderable())
            frames.append(frame.file.getvalue())  # type: ignore[attr-defined]

    _, session = await networked_turn(
        server, tmp_path, view, PlainDisplay(plain), JsonDisplay(lines), draw,
        splicer=Splicer(hostile=HOSTILE), sandbox="off",
    )  # fmt: skip
    final = Console(file=io.StringIO(), width=WIDE, force_terminal=True, color_system=None)
    final.print(view.renderable())
    (waiting,) = frames
    for text in (stream.getvalue(), waiting, final.file.getvalue()):  # type: ignore[attr-defined]
        assert_no_raw(text, drawn=True)
    live = flat(stream.getvalue() + waiting + final.file.getvalue())  # type: ignore[attr-defined]
    question = f"domain {ASKED}{SHOWN} ({ASK_WHY}{SHOWN})"
    assert f"approval {APPROVAL_ID} · waiting 0 s │ │ {question}" in live
    assert f"denied {REFUSED}{SHOWN}:443 ({DENY_RULE}{SHOWN}) ×3" in live
    assert f"the user said so{SHOWN}" in live  # the answer's notice

    assert_no_raw(plain.getvalue())
    assert f"network: denied {REFUSED}{SHOWN}:443 ({DENY_RULE}{SHOWN})" in plain.getvalue()
    assert f"domain {ASKED}{SHOWN} ({ASK_WHY}{SHOWN})" in plain.getvalue()

    assert_no_raw(lines.getvalue())
    records = [json.loads(line) for line in lines.getvalue().splitlines()]
    (asked,) = [r for r in records if r["kind"] == "ApprovalRequested"]
    assert asked["what"] == ASKED + HOSTILE  # a program reading them gets the very text

    shown = orchmode("show", session, cwd=tmp_path)
    assert shown.code == 0, shown.stderr
    assert_no_raw(shown.stdout)
    assert f"denied {REFUSED}{SHOWN}:443" in shown.stdout
    assert f"domain {ASKED}{SHOWN}" in flat(shown.stdout)
    report = orchmode("report", session, "-o", "-", cwd=tmp_path)
    assert report.code == 0, report.stderr
    assert_no_raw(report.stdout)
    assert html.escape(f"{REFUSED}{SHOWN}") in report.stdout
