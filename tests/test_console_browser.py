"""The console in Chromium (Playwright) against real runs on the scripted server: runs
listed, a run's page following it live, an approval answered and a run stopped by buttons,
hostile model text shown as text, and strangers and other sites refused."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from orchmode.testing.scenario import OrchestrationScenario
from recorded_runs import base_env, item_number, orchmode, scripted_server
from test_console import HOSTILE, Served, finished_run, serving  # noqa: F401 (a fixture)

pytestmark = pytest.mark.browser

ASK_RULE = "Bash(echo deploy:*)"
LEASE = ("--claim-lease", "2")
AGENTS = "#agents details.agent"
WAIT_MS = 60_000
CHROMIUM = "/usr/bin/chromium"


@pytest.fixture
def browser() -> Iterator[Browser]:
    """Chromium for one test: Playwright's sync API runs an event loop of its own, which
    must not be running while pytest-asyncio sets up another test's fixtures."""
    if not Path(CHROMIUM).exists():
        if os.environ.get("ORCHMODE_TEST_BROWSER") == "required":
            pytest.fail(f"{CHROMIUM} is not installed (ORCHMODE_TEST_BROWSER=required)")
        pytest.skip(f"{CHROMIUM} is not installed")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update"],
        )  # fmt: skip
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context()
    context.set_default_timeout(WAIT_MS)
    yield context.new_page()
    context.close()


def asking_scenario(subtasks: int, asking: int) -> OrchestrationScenario:
    """Workers echo their item; worker ``asking`` runs the command the rule asks about."""

    def command(prompt: str) -> str:
        n = item_number(prompt)
        return f"echo deploy {n}" if n == asking else f"echo item {n}"

    return OrchestrationScenario(subtasks=subtasks, worker_command=command)


def pending(cwd: Path) -> list[dict[str, Any]]:
    result = orchmode("approvals", "--json", cwd=cwd, timeout=60)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def wait_for(
    condition: Callable[[], bool], what: str, process: subprocess.Popen[str] | None = None
) -> None:
    """Poll the store another process writes until ``condition`` holds."""
    deadline = time.monotonic() + 90
    while not condition():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the run ended before {what}: {process.communicate()[1]}")
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)  # polling a store another process writes


def row(page: Page, session: str) -> Any:
    return page.locator(f'tr[data-session="{session}"]')


def test_runs_listed_a_live_page_gains_agents_and_an_approval_button_finishes_the_run(
    page: Page, tmp_path: Path
) -> None:
    flags = ("--sandbox", "off", "--permissions-ask", ASK_RULE)
    first = asking_scenario(subtasks=2, asking=0)
    first.subtask_prefix = "Look at item"  # not served from the journal to the second run
    with scripted_server(first) as server:
        done = orchmode("run", "the finished one", "--base-url", server.url, *flags, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    with scripted_server(asking_scenario(subtasks=4, asking=2)) as server:
        common = ("--base-url", server.url, *flags)
        running = subprocess.Popen(
            [sys.executable, "-m", "orchmode", "run", "the running one", *common, *LEASE,
             "--max-concurrent", "1"],
            cwd=tmp_path, env=base_env(), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            wait_for(lambda: bool(pending(tmp_path)), "the run asked", running)
            (asked,) = pending(tmp_path)
            session = asked["session"]
            with serving(tmp_path) as served:
                page.goto(served.url)
                assert page.locator("#runs tbody tr").count() == 2
                assert row(page, session).get_attribute("data-state") == "waiting for approval"
                assert row(page, session).locator("button.stop").count() == 1
                finished = page.locator('tr[data-state="finished"]')
                assert "the finished one" in finished.inner_text()
                row(page, session).locator("a").click()
                page.wait_for_selector("body[data-live=yes]")
                before = page.locator(AGENTS).count()
                answering = page.context.new_page()
                answering.goto(f"{served.base}/approvals")
                answer_row = answering.locator(f'tr[data-approval="{asked["id"]}"]')
                assert "echo deploy 2" in answer_row.inner_text()
                answer_row.get_by_role("button", name="approve", exact=True).click()
                answering.wait_for_selector(f"text=approved {asked['id']}")
                page.wait_for_function(
                    "n => document.querySelectorAll('#agents details.agent').length > n", arg=before
                )  # fmt: skip
                page.wait_for_selector("#run-state:text-is('finished')")
                _, err = running.communicate(timeout=120)
                assert running.returncode == 0, err
        finally:
            if running.poll() is None:
                running.kill()
                running.wait()


def test_a_run_started_from_the_task_box_stops_with_its_button_and_resumes(
    page: Page, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    with scripted_server(asking_scenario(subtasks=2, asking=1)) as server:
        run_env = {"ORCHMODE_BASE_URL": server.url, "ORCHMODE_SANDBOX": "off",
                   "ORCHMODE_PERMISSIONS_ASK": ASK_RULE, "ORCHMODE_CLAIM_LEASE": "2"}  # fmt: skip
        with serving(tmp_path, **run_env) as served:
            page.goto(served.url)
            page.fill("textarea[name=task]", "started from the browser")
            page.fill("input[name=directory]", str(tmp_path / "missing"))
            page.click("form.console-start button")
            page.wait_for_selector(".console-message.error:has-text('no directory')")
            page.fill("textarea[name=task]", "started from the browser")
            page.fill("input[name=directory]", str(project))
            page.click("form.console-start button")
            page.wait_for_selector(".console-message:has-text('started `orchmode run`')")
            wait_for(lambda: bool(pending(tmp_path)), "the started run asked")
            (asked,) = pending(tmp_path)
            session = asked["session"]
            page.goto(served.base + "/")
            row(page, session).locator("button.stop").click()
            page.wait_for_selector(".console-message:has-text('orchmode resume')")

            def interrupted() -> bool:
                page.goto(served.base + "/")
                return row(page, session).get_attribute("data-state") == "interrupted"

            wait_for(interrupted, "the stopped run was interrupted")
            assert row(page, session).locator("button.stop").count() == 0
            resumed = orchmode(
                "resume", session, "--store", f"sqlite://{tmp_path / '.orchmode' / 'journal.db'}",
                "--approvals", "allow", cwd=project, env=base_env(**run_env),
            )  # fmt: skip
            assert resumed.returncode == 0, resumed.stderr
            page.goto(served.base + "/")
            assert row(page, session).get_attribute("data-state") == "finished"


def test_a_reply_with_markup_shows_as_text_and_runs_nothing(
    page: Page,
    finished_run: tuple[Path, str],  # noqa: F811
) -> None:
    workdir, session = finished_run
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    with serving(workdir) as served:
        page.goto(served.url)
        assert HOSTILE.split("<img")[0] in page.locator("#runs").inner_text()
        page.goto(f"{served.base}/runs/{session}")
        page.wait_for_selector("body[data-ready=yes]")
        page.locator(AGENTS).first.evaluate("d => d.open = true")
        loaded = page.locator(f"{AGENTS} [data-transcript][data-loaded=yes]")
        loaded.first.wait_for()  # its transcript, fetched as it opened
        assert "onerror=" in loaded.first.inner_text()
        assert page.evaluate("typeof window.pwned") == "undefined"
        assert page.locator("img[src=x]").count() == 0 and not dialogs
        assert "onerror=" in page.locator("#agents").inner_text()


def test_a_stranger_gets_401_and_another_site_s_form_is_refused(page: Page, tmp_path: Path) -> None:
    with serving(tmp_path) as served:
        refused = page.goto(served.base + "/")
        assert refused is not None and refused.status == 401
        page.goto(served.url)  # the cookie, as the owner of the browser has it
        with other_site(served) as attacker:
            page.goto(attacker)
            with page.expect_response(lambda r: r.url.endswith("/start")) as posted:
                page.click("button")
            assert posted.value.status == 403
        page.goto(served.base + "/")
        assert page.locator("#runs tbody tr[data-session]").count() == 0


class _Attacker(http.server.BaseHTTPRequestHandler):
    """A page of another origin (same host, another port) whose form posts to the console."""

    def __init__(self, target: str, *args: Any) -> None:
        self.target = target
        super().__init__(*args)

    def do_GET(self) -> None:
        page = (
            f'<form method="post" action="{self.target}/start">'
            '<input name="task" value="rm -rf /"><input name="directory" value="/">'
            '<input name="csrf" value="guessed"><button>go</button></form>'
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

    def log_message(self, *_: Any) -> None:
        pass


@contextmanager
def other_site(served: Served) -> Iterator[str]:
    """The address of a page on another origin whose form posts to ``served``."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(_Attacker, served.base))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
