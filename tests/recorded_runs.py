"""Real recorded runs for the history tests: `orchmode` processes against the scripted server.

Shared by ``test_history.py`` and ``test_report.py``: start the server, run the CLI, and read
the store it left with plain ``sqlite3``, independently of orchmode's own reading code.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from orchmode.testing import Reply, Responder, ScriptedRequest, ScriptedServer
from orchmode.testing.scenario import OrchestrationScenario, first_user_text, report, tool_call

API_KEY = "test-key"
SEVERITY_OF_ITEM = {1: "high", 2: "medium", 3: "low", 4: "info"}


def orchmode(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchmode", *args],
        cwd=cwd,
        env=env if env is not None else base_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def worker_prompts(journal: Path) -> list[str]:
    """The prompts of the workers recorded in a SQLite journal so far (none before it exists)."""
    if not journal.exists():
        return []
    try:
        db = sqlite3.connect(f"file:{journal}?mode=ro", uri=True, timeout=5)
        try:
            return [r[0] for r in db.execute("SELECT prompt FROM results WHERE role = 'worker'")]
        finally:
            db.close()
    except sqlite3.OperationalError:  # not created yet
        return []


def kill_run_when(ready: Callable[[], bool], *args: str, cwd: Path, command: str = "run") -> None:
    """Start ``orchmode run ARGS`` (or another ``command``) and SIGKILL it as soon as
    ``ready()`` holds."""
    process = subprocess.Popen(
        [sys.executable, "-m", "orchmode", command, *args],
        cwd=cwd,
        env=base_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60

    def holds() -> bool:
        # The probe reads files the run is writing: git replaces a file by deleting it and
        # writing it anew, so one can be missing for a moment. Missing is "not yet".
        try:
            return ready()
        except FileNotFoundError:
            return False

    def holds_frozen() -> bool:
        # Checked again with the run stopped: what is killed is exactly what was checked
        # (an agent finishing between the check and the kill would change it).
        if not holds():
            return False
        process.send_signal(signal.SIGSTOP)
        if holds():
            return True
        process.send_signal(signal.SIGCONT)
        return False

    try:
        while not holds_frozen():
            assert process.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "the run never got there"
            time.sleep(0.01)  # polling the journal another process writes
    finally:
        process.kill()
        process.wait()


#: An empty user configuration directory, so the tester's own ~/.config/orchmode (settings,
#: trusted directories) never changes what a test's orchmode does.
_NO_USER_CONFIG = tempfile.mkdtemp(prefix="orchmode-test-config-")


def base_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ANTHROPIC_", "ORCHMODE_", "ORCH_"))
    }
    env["ANTHROPIC_API_KEY"] = API_KEY
    env["XDG_CONFIG_HOME"] = _NO_USER_CONFIG
    env.update(extra)
    return env


def spawn_on_a_terminal(*args: str, cwd: Path, width: int) -> Any:
    """``orchmode ARGS`` in a pseudo-terminal of 60 lines by ``width`` columns (pexpect)."""
    import pexpect

    env = base_env(PROMPT_TOOLKIT_NO_CPR="1", TERM="xterm")
    for name in ("COLUMNS", "LINES"):  # the terminal's own size, not an inherited one
        env.pop(name, None)
    return pexpect.spawn(
        sys.executable,
        ["-m", "orchmode", *args],
        cwd=str(cwd),
        env=env,
        encoding="utf-8",
        timeout=90,
        dimensions=(60, width),
    )


@contextmanager
def scripted_server(responder: Responder) -> Iterator[ScriptedServer]:
    server = ScriptedServer(responder, api_key=API_KEY)
    server.start_in_thread()
    try:
        yield server
    finally:
        server.stop_thread()


def run(server: ScriptedServer, cwd: Path, task: str, *flags: str) -> str:
    """Run a session to the end and return its id."""
    result = orchmode("run", task, "--base-url", server.url, "--sandbox", "off", *flags, cwd=cwd)
    assert result.returncode == 0, result.stderr
    found = re.search(r"recorded as (\S+);", result.stderr)
    assert found, result.stderr
    return found[1]


def item_number(subtask: str) -> int:
    tail = subtask.rsplit(" ", 1)[-1]
    return int(tail) if tail.isdigit() else 0


class FindingsScenario(OrchestrationScenario):
    """Workers report a finding whose severity depends on the item; ``payload`` goes in each."""

    payload: str = ""

    def worker(self, request: ScriptedRequest) -> Reply:
        subtask = first_user_text(request)
        if not any(m.get("role") == "assistant" for m in request.messages) and self.worker_command:
            return tool_call("bash", {"command": self.worker_command})
        n = item_number(subtask)
        severity = SEVERITY_OF_ITEM.get(n, "info")
        return report(
            f"Looked at {subtask}.{self.payload}",
            [
                {
                    "claim": f"item {n} has a {severity} issue{self.payload}",
                    "evidence": f"file{n}.py:{n}{self.payload}",
                    "severity": severity,
                }
            ],
        )


def refute_item_two(prompt: str) -> str:
    return "refuted" if "Check item 2\n" in prompt else "confirmed"


# --- reading the store behind orchmode's back ---------------------------------------------


def store_path(workdir: Path) -> Path:
    return workdir / ".orchmode" / "journal.db"


def events(workdir: Path, session: str) -> list[tuple[int, str, dict[str, Any]]]:
    db = sqlite3.connect(store_path(workdir))
    try:
        rows = db.execute(
            "SELECT seq, kind, data FROM events WHERE session = ? ORDER BY seq", (session,)
        ).fetchall()
    finally:
        db.close()
    return [(seq, kind, json.loads(data)) for seq, kind, data in rows]


def turn_costs(workdir: Path, session: str) -> list[float]:
    """Dollars of the recorded model requests, turn by turn."""
    costs: list[float] = []
    for _, kind, data in events(workdir, session):
        if kind == "TurnStarted":
            costs.append(0.0)
        elif kind == "ModelRequestDone" and costs:
            costs[-1] += data["cost"]
    return costs


def agents_done(workdir: Path, session: str) -> list[dict[str, Any]]:
    return [data for _, kind, data in events(workdir, session) if kind == "SubagentDone"]
