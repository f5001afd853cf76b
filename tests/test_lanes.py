"""The quick lane (``scripts/test --quick``) leaves out exactly what needs a service."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LANES = {"postgres", "ray", "browser", "phoenix", "slow", "faults"}

# One collection of the whole suite, in a process of its own, printing each test's marks
# as conftest.py left them.
COLLECT = """
import json, sys, pytest

class Marks:
    found = {}

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items):
        for item in items:
            Marks.found[item.nodeid] = sorted({m.name for m in item.iter_markers()})

code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "tests"], plugins=[Marks()])
sys.stdout.write("\\nMARKS " + json.dumps(Marks.found))
sys.exit(code)
"""


def test_each_test_is_marked_with_the_services_it_needs() -> None:
    out = subprocess.run(
        [sys.executable, "-c", COLLECT], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    marks: dict[str, set[str]] = {
        test: set(names) & LANES for test, names in json.loads(out.rsplit("MARKS ", 1)[1]).items()
    }
    quick = {test for test, names in marks.items() if not names}
    assert "tests/test_lanes.py::test_each_test_is_marked_with_the_services_it_needs" in quick
    # Ray: every test of the Ray files, and nothing else
    assert {t for t, m in marks.items() if "ray" in m} == {
        t for t in marks if t.startswith("tests/test_ray")
    }
    # PostgreSQL: by fixture, and the PostgreSQL half of each store test (not its SQLite half)
    postgres = {t for t, m in marks.items() if "postgres" in m}
    assert "tests/test_postgres_store.py::test_migrations_are_applied_once_and_recorded" in postgres
    assert "tests/test_postgres_store.py::test_a_malformed_url_is_not_echoed" in quick
    store_tests = [t for t in marks if t.endswith(("[postgres]", "[sqlite]"))]
    assert store_tests
    for test in store_tests:
        assert ("postgres" in marks[test]) == test.endswith("[postgres]"), test
    # the browser: every test that takes the chromium fixture
    assert (
        "browser"
        in marks["tests/test_report.py::test_the_net_log_check_does_see_a_page_that_reaches_out"]
    )
    # Phoenix: every test that takes the phoenix fixture, both halves of the parametrised one
    phoenix = {t for t, m in marks.items() if "phoenix" in m}
    assert all(t.startswith(("tests/test_traces.py::", "tests/test_ray.py::")) for t in phoenix)
    assert phoenix >= {
        "tests/test_traces.py::test_a_run_arrives_in_a_real_trace_backend_as_a_tree[variable]",
        "tests/test_traces.py::test_a_run_arrives_in_a_real_trace_backend_as_a_tree[flag]",
        "tests/test_traces.py::test_an_http_mcp_server_is_sent_the_traceparent_of_the_call",
        "tests/test_ray.py::test_agents_on_the_nodes_share_the_drivers_trace",
    }
    assert (
        "tests/test_traces.py::test_with_tracing_off_the_opentelemetry_sdk_is_not_loaded" in quick
    )
