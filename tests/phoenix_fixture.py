"""Pytest plugin: one real Arize Phoenix (an OpenTelemetry trace backend) per test session.

Phoenix pins packages orchmode cannot share (``anthropic<2``), so it lives in a virtualenv
of its own, ``.venv-phoenix`` (``scripts/test`` makes it), and runs as a process: spans go
to it over OTLP/HTTP and are read back through its REST API. Each test sends its spans to a
project of its own (the ``x-project-name`` header).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: Phoenix's interpreter: ORCHMODE_TEST_PHOENIX_PYTHON, else the one scripts/test installs.
PYTHON = Path(os.environ.get("ORCHMODE_TEST_PHOENIX_PYTHON", ROOT / ".venv-phoenix/bin/python"))
#: Seconds Phoenix may take to start (mostly its imports; migrations on a new database).
START_TIMEOUT = 240.0


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, None


@dataclass
class Phoenix:
    """A running Phoenix: where to send spans, and how to read them back."""

    url: str

    def project(self) -> str:
        """A new project's name, for one test's spans."""
        return f"test-{uuid.uuid4().hex[:12]}"

    def exporter_env(self, project: str) -> dict[str, str]:
        """The standard variables that send a process's spans here, into ``project``."""
        return {
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.url,
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS": f"x-project-name={project}",
        }

    def spans(self, project: str) -> list[dict[str, Any]]:
        """Every span of ``project`` stored so far (none before its first is stored)."""
        found: list[dict[str, Any]] = []
        cursor = None
        while True:
            query = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
            name = urllib.parse.quote(project)
            status, body = _get(
                f"{self.url}/v1/projects/{name}/spans?{urllib.parse.urlencode(query)}"
            )
            if status == 404:
                return []
            assert status == 200, status
            found.extend(body["data"])
            cursor = body.get("next_cursor")
            if not cursor:
                return found

    def wait_for(
        self, project: str, done: Callable[[list[dict[str, Any]]], bool], timeout: float = 60.0
    ) -> list[dict[str, Any]]:
        """The project's spans once ``done`` says they are all there: Phoenix answers an
        export before it stores the spans, so they are polled for."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.spans(project)
            if done(spans) or time.monotonic() > deadline:
                return spans
            time.sleep(0.2)


@pytest.fixture(scope="session")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phoenix]:
    """Phoenix started once for the session; skipped (or failed in CI) without it."""
    if not PYTHON.exists():
        message = f"Arize Phoenix is not installed at {PYTHON} (scripts/test installs it)"
        if os.environ.get("ORCHMODE_TEST_PHOENIX") == "required":
            pytest.fail(f"{message} (ORCHMODE_TEST_PHOENIX=required)")
        pytest.skip(message)
    home = tmp_path_factory.mktemp("phoenix")
    port, grpc = _free_ports(2)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PHOENIX_"))}
    env.update(
        PHOENIX_WORKING_DIR=str(home),  # its database, not ~/.phoenix
        PHOENIX_HOST="127.0.0.1",
        PHOENIX_PORT=str(port),  # the UI, REST and OTLP/HTTP
        PHOENIX_GRPC_PORT=str(grpc),  # OTLP/gRPC cannot be turned off: a free port of its own
        PHOENIX_TELEMETRY_ENABLED="false",
        PHOENIX_LOG_MIGRATIONS="false",
    )
    log = (home / "phoenix.log").open("wb")
    process = subprocess.Popen(
        [str(PYTHON), "-m", "phoenix.server.main", "serve"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"Phoenix exited ({process.returncode}): see {log.name}")
            try:
                if _get(f"{url}/readyz")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"Phoenix was not ready in {START_TIMEOUT:g} s: see {log.name}")
            time.sleep(0.2)
        yield Phoenix(url)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        log.close()
