"""Commands never see credentials: not by name, not by value."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from orchmode.shell.environment import command_environment, is_secret_name


def test_credentials_are_removed_and_ordinary_variables_kept() -> None:
    env = {
        "ANTHROPIC_API_KEY": "sk-1",
        "ANTHROPIC_AUTH_TOKEN": "t",
        "GITHUB_TOKEN": "g",
        "AWS_SECRET_ACCESS_KEY": "a",
        "AWS_SESSION_TOKEN": "s",
        "PGPASSWORD": "p",
        "DB_PASSWORD": "p2",
        "SSH_AUTH_SOCK": "/tmp/agent",
        "PATH": "/usr/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "KEYBOARD_LAYOUT_NAME": "us",
        "TOKENIZERS_PARALLELISM": "false",
    }
    kept = command_environment(env)
    assert set(kept) == {"PATH", "HOME", "LANG", "KEYBOARD_LAYOUT_NAME", "TOKENIZERS_PARALLELISM"}


def test_a_known_secret_is_removed_under_any_name() -> None:
    env = {"INNOCENT": "sk-live", "OTHER": "x"}
    assert command_environment(env, ("sk-live",)) == {"OTHER": "x"}


@given(st.from_regex(r"[A-Z]{1,8}_(API_KEY|TOKEN|SECRET|PASSWORD)(_[A-Z]{1,5})?", fullmatch=True))
def test_names_that_say_they_are_secrets_are_secret(name: str) -> None:
    assert is_secret_name(name)
