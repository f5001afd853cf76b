"""Settings: flags > ORCHMODE_* > orchmode.toml > defaults; a bad value names its source."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchmode.core.errors import ConfigError
from orchmode.core.settings import Settings, load_settings, settings_table

ROOT = Path(__file__).resolve().parents[1]


def test_defaults_are_the_specs() -> None:
    s = load_settings({}, env={}, cwd=Path("/nonexistent"))
    assert (s.model, s.effort, s.max_tokens) == ("claude-opus-5-5", "xhigh", 64000)
    assert (s.request_timeout, s.bash_timeout, s.output_limit) == (600, 60, 8000)
    assert (s.max_concurrent, s.max_subtasks, s.subagent_turns, s.main_turns) == (10, 1000, 15, 30)
    assert s.refresh_every == 10 and s.mode is True


def test_flags_beat_env_beat_toml(tmp_path: Path) -> None:
    (tmp_path / "orchmode.toml").write_text(
        "max_concurrent = 3\nmain_turns = 4\nbash_timeout = 5\n"
    )
    env = {"ORCHMODE_MAX_CONCURRENT": "7", "ORCHMODE_MAIN_TURNS": "8"}
    s = load_settings({"max_concurrent": "9"}, env=env, cwd=tmp_path)
    assert (s.max_concurrent, s.main_turns, s.bash_timeout) == (9, 8, 5.0)


def test_orch_journal_is_honoured_and_orchmode_journal_wins(tmp_path: Path) -> None:
    s = load_settings({}, env={"ORCH_JOURNAL": "/tmp/a.db"}, cwd=tmp_path)
    assert s.journal == Path("/tmp/a.db")
    s = load_settings(
        {}, env={"ORCH_JOURNAL": "/tmp/a.db", "ORCHMODE_JOURNAL": "/tmp/b.db"}, cwd=tmp_path
    )
    assert s.journal == Path("/tmp/b.db")
    assert Settings().store_url(tmp_path) == f"sqlite://{tmp_path}/.orchmode/journal.db"
    assert Settings(journal=Path("/x/j.db")).store_url(tmp_path) == "sqlite:///x/j.db"
    assert Settings(store="postgresql://h/db", journal=Path("/x")).store_url(tmp_path) == (
        "postgresql://h/db"
    )


def test_a_bad_value_names_its_source(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="ORCHMODE_MAX_CONCURRENT"):
        load_settings({}, env={"ORCHMODE_MAX_CONCURRENT": "many"}, cwd=tmp_path)
    with pytest.raises(ConfigError, match="--effort"):
        load_settings({"effort": "extreme"}, env={}, cwd=tmp_path)
    with pytest.raises(ConfigError, match="--max-subtasks"):
        load_settings({"max_subtasks": "0"}, env={}, cwd=tmp_path)


def test_bad_toml_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "orchmode.toml").write_text("max_concurrent = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings({}, env={}, cwd=tmp_path)
    (tmp_path / "orchmode.toml").write_text("max_concurent = 3\n")
    with pytest.raises(ConfigError, match="unknown setting 'max_concurent'"):
        load_settings({}, env={}, cwd=tmp_path)


def test_test_mode_has_the_small_limits(tmp_path: Path) -> None:
    s = load_settings({"test_mode": True, "max_subtasks": "50"}, env={}, cwd=tmp_path)
    assert (s.max_subtasks, s.subagent_turns, s.main_turns) == (2, 1, 1)


def test_the_configuration_page_table_is_the_generated_one() -> None:
    assert settings_table() in (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
