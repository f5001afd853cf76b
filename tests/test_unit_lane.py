"""The unit lane (``scripts/test --unit``) holds its tests to pure logic."""

from __future__ import annotations

import socket
import subprocess

import pytest

from conftest import UNIT_MODULES, NotPureLogic


def test_this_module_is_in_the_unit_lane(request: pytest.FixtureRequest) -> None:
    assert "test_unit_lane.py" in UNIT_MODULES
    assert request.node.get_closest_marker("unit") is not None


def test_a_unit_test_cannot_start_a_process() -> None:
    with pytest.raises(NotPureLogic, match=r"subprocess\.Popen"):
        subprocess.run(["true"], check=False)


def test_a_unit_test_cannot_listen_or_connect() -> None:
    with socket.socket() as sock, pytest.raises(NotPureLogic, match=r"socket\.bind"):
        sock.bind(("127.0.0.1", 0))
    with socket.socket() as sock, pytest.raises(NotPureLogic, match=r"socket\.connect"):
        sock.connect(("127.0.0.1", 9))
