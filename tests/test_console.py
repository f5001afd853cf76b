"""`orchmode serve` over plain HTTP: the token, the CSRF check, the runs and a run's page,
the live stream, and start refused for a missing directory — a real server process."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx2
import pytest

from orchmode.store import EventRow, open_store
from recorded_runs import FindingsScenario, base_env, run, scripted_server

HOSTILE = '<script>window.pwned=1</script><img src=x onerror="window.pwned=2">'


@dataclass(frozen=True)
class Served:
    """A running `orchmode serve`: the URL it printed, its token, and its process."""

    url: str
    process: subprocess.Popen[str]

    @property
    def base(self) -> str:
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc}"

    @property
    def token(self) -> str:
        found = re.search(r"token=([^&]+)", self.url)
        assert found, self.url
        return found[1]

    @contextmanager
    def client(self) -> Iterator[httpx2.Client]:
        """A client that has visited the printed URL: it holds the cookie."""
        with httpx2.Client(base_url=self.base, timeout=30) as client:
            first = client.get(self.url)
            assert first.status_code == 303, first.text
            yield client


@contextmanager
def serving(cwd: Path, *flags: str, **env: str) -> Iterator[Served]:
    """`orchmode serve --port 0` in ``cwd`` until the block ends; ``env`` reaches the runs
    it starts (``ORCHMODE_BASE_URL`` …)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "orchmode", "serve", "--port", "0", *flags],
        cwd=cwd, env=base_env(**env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        first = process.stdout.readline()  # the first line, flushed at once
        assert first.startswith("http://"), process.communicate(timeout=30)
        yield Served(first.strip(), process)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def same_origin(served: Served) -> dict[str, str]:
    return {"Origin": served.base, "Sec-Fetch-Site": "same-origin"}


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, page
    return found[1]


@pytest.fixture
def finished_run(tmp_path: Path) -> tuple[Path, str]:
    """A real run to the end, whose workers' findings carry hostile markup."""
    scenario = FindingsScenario(subtasks=2)
    scenario.payload = HOSTILE
    with scripted_server(scenario) as server:
        session = run(server, tmp_path, f"review {HOSTILE}")
    return tmp_path, session


def test_every_request_without_the_token_is_refused(tmp_path: Path) -> None:
    with serving(tmp_path) as served:
        assert served.url.startswith("http://127.0.0.1:") and len(served.token) >= 40
        with httpx2.Client(base_url=served.base, timeout=30) as stranger:
            for path in ("/", "/approvals", "/runs/x", "/runs/x/events", "/static/console.js"):
                assert stranger.get(path).status_code == 401, path
            assert stranger.get("/?token=wrong").status_code == 401
            stranger.cookies.set("orchmode_console", "wrong")
            assert stranger.get("/").status_code == 401
            assert stranger.post("/start", data={"task": "x"}).status_code == 401
        with httpx2.Client(base_url=served.base, timeout=30) as visitor:
            entry = visitor.get(served.url)
            assert entry.status_code == 303 and entry.headers["location"] == "/"
            cookie = entry.headers["set-cookie"].lower()
            assert "httponly" in cookie and "samesite=strict" in cookie
            deeper = visitor.get(f"/runs/x?q=a&token={served.token}")
            assert deeper.status_code == 303 and deeper.headers["location"] == "/runs/x?q=a"
            page = visitor.get("/")
            assert page.status_code == 200 and "no runs are recorded yet" in page.text
            policy = page.headers["content-security-policy"]
            assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
            assert "unsafe-inline" not in policy.split("script-src")[1].split(";")[0]
            assert page.headers["x-content-type-options"] == "nosniff"
            assert page.headers["referrer-policy"] == "same-origin"


def test_a_post_needs_the_csrf_token_and_the_console_s_own_origin(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with serving(tmp_path) as served, served.client() as client:
        csrf = csrf_of(client.get("/").text)
        form = {"task": "t", "directory": str(missing), "csrf": csrf}
        refused = {
            "no CSRF token": ({k: v for k, v in form.items() if k != "csrf"}, same_origin(served)),
            "a wrong one": ({**form, "csrf": "x" * len(csrf)}, same_origin(served)),
            "another origin": (form, {"Origin": "http://evil.example"}),
            "another site": (form, {"Sec-Fetch-Site": "cross-site"}),
            "no origin said": (form, {}),
        }
        for why, (data, headers) in refused.items():
            answer = client.post("/start", data=data, headers=headers)
            assert answer.status_code == 403, why
        taken = client.post("/start", data=form, headers=same_origin(served))
        assert taken.status_code == 303
        told = client.get(taken.headers["location"]).text
        assert f"no directory &#39;{missing}&#39; — give one that exists" in told


def test_a_host_other_than_loopback_warns_in_one_line(tmp_path: Path) -> None:
    with serving(tmp_path, "--host", "0.0.0.0") as served:
        assert served.url.startswith("http://0.0.0.0:")
        served.process.send_signal(signal.SIGINT)
        _, err = served.process.communicate(timeout=30)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "serving on 0.0.0.0" in lines[0] and "token" in lines[0]


def test_a_finished_run_is_listed_and_its_page_escapes_what_the_model_said(
    finished_run: tuple[Path, str],
) -> None:
    workdir, session = finished_run
    with serving(workdir) as served, served.client() as client:
        listing = client.get("/").text
        row = listing.split(f'data-session="{session}"')[1].split("</tr>")[0]
        assert 'data-state="finished"' in row and f'href="/runs/{session}"' in row
        assert "&lt;script&gt;window.pwned=1&lt;/script&gt;" in row and "<script>" not in row
        assert client.get("/", params={"q": "no such run"}).text.count("data-session=") == 0
        assert client.get("/", params={"q": "FINISHED"}).text.count("data-session=") == 1
        page = client.get(f"/runs/{session}").text
        assert "&lt;img src=x onerror=" in page
        assert "<script>window" not in page and "<img src=x" not in page
        body = client.get(f"/runs/{session}/body")
        assert body.headers["x-run-state"] == "finished" and "worker 1.1" in body.text
        assert client.get("/runs/nothing-here").status_code == 404
        # each agent's transcript is left out of the page and loaded when it is opened
        agents = re.findall(r'data-transcript="([^"]+)"></div>', page)
        assert len(agents) >= 4 and "</summary>" in page
        transcript = client.get(f"/runs/{session}/agents/{agents[0]}")
        assert transcript.status_code == 200 and "&lt;img src=x onerror=" in transcript.text
        assert "<img src=x" not in transcript.text and "<script>window" not in transcript.text
        assert client.get(f"/runs/{session}/agents/agent-t9-9-9-worker").status_code == 404


async def test_the_stream_tells_each_new_event_of_the_session_within_a_second(
    tmp_path: Path,
) -> None:
    """Events written by another process (here: this test, through its own store) reach
    an SSE client of the console within a second; so does the run's process starting or
    ending."""
    from orchmode.session.api import session_key
    from orchmode.store.claims import holder_name

    store = await open_store(f"sqlite://{tmp_path / '.orchmode' / 'journal.db'}")
    try:
        with serving(tmp_path) as served:
            async with httpx2.AsyncClient(base_url=served.base, timeout=30) as client:
                await client.get(served.url)
                async with client.stream("GET", "/runs/s1/events", params={"since": 1}) as stream:
                    lines = stream.aiter_lines()
                    for seq in (1, 2, 3):
                        written = time.monotonic()
                        row = EventRow(seq, time.time(), "note", "{}")
                        await store.append_events("s1", [row])
                        told = await asyncio.wait_for(_next_change(lines), 5)
                        assert told == str(seq + 1)
                        assert time.monotonic() - written < 1.0
                    # a process taking the session, and letting it go, is told too
                    holder = holder_name()
                    assert await store.claim(session_key("s1"), holder, 60)
                    assert await asyncio.wait_for(_next_change(lines), 5) == "4"
                    await store.release(session_key("s1"), holder)
                    assert await asyncio.wait_for(_next_change(lines), 5) == "4"
    finally:
        await store.close()


async def _next_change(lines: object) -> str:
    async for line in lines:  # type: ignore[attr-defined]
        if line.startswith("data: "):
            return str(line.removeprefix("data: "))
    raise AssertionError("the stream ended")


async def test_runs_of_either_store_are_listed_running_while_a_live_process_holds_them(
    store_url: str, tmp_path: Path
) -> None:
    """The state comes from the session's claim: a live process's holds it (running, and
    this server may signal it); a dead one's does not, and the last turn says."""
    from orchmode.session.api import session_key
    from orchmode.store.claims import holder_name

    with scripted_server(FindingsScenario(subtasks=1)) as server:
        session = run(server, tmp_path, "listed everywhere", "--store", store_url)
    store = await open_store(store_url)
    gone = subprocess.Popen(["true"])
    gone.wait()
    try:
        with serving(tmp_path, "--store", store_url) as served, served.client() as client:

            def state() -> tuple[str | None, bool]:
                listing = client.get("/").text
                found = re.search(rf'data-session="{session}" data-state="([^"]+)"', listing)
                row = listing.split(f'data-session="{session}"')[1].split("</tr>")[0]
                return (found[1] if found else None), "button" in row

            assert state() == ("finished", False)
            alive = holder_name()
            assert await store.claim(session_key(session), alive, 60)
            assert state() == ("running", True)
            await store.release(session_key(session), alive)
            dead = alive.replace(f":{os.getpid()}:", f":{gone.pid}:")
            assert await store.claim(session_key(session), dead, 60)
            assert state() == ("finished", False)
    finally:
        await store.close()
