"""Settings: one model made of the groups in :mod:`orchmode.core.knobs`, and the layers that set it.

flags > ``ORCHMODE_*`` environment > the project's ``orchmode.toml`` (as far as it is trusted)
> the user's own ``config.toml`` > defaults.

The command-line flags, the ``ORCHMODE_*`` variables, the TOML keys, the settings table of
docs/configuration.md and ``--help`` are all derived from the fields of :class:`Settings`, so
they cannot drift apart. So is how far a project's own ``orchmode.toml`` is believed for each
setting (its ``trust`` marker): a repository under review must not be able to loosen the
sandbox, start programs, send the conversation or a key elsewhere, or spend more, unless the
user trusted its directory (``orchmode trust``, :mod:`orchmode.core.trust`).
"""

from __future__ import annotations

import os
import shlex
import tomllib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, ValidationError, field_validator, model_validator

from .errors import ConfigError
from .events import Role
from .knobs import Effort as Effort
from .knobs import (
    FanoutKnobs,
    ModelRequestKnobs,
    RunKnobs,
    ServiceKnobs,
    ShellKnobs,
    Stricter,
    TrustKind,
)
from .knobs import Isolation as Isolation
from .knobs import MergePolicy as MergePolicy
from .knobs import Provider as Provider
from .knobs import SandboxMode as SandboxMode
from .pricing import ModelPrice, context_window_of, model_id
from .trust import Verdict, digest, fingerprint, read_records, verdict
from .wording import listed

#: A project's own settings file, in the directory orchmode runs in.
CONFIG_FILE = "orchmode.toml"
#: The user's own settings file, in :func:`user_config_dir`.
USER_CONFIG_FILE = "config.toml"
ENV_PREFIX = "ORCHMODE_"
#: Older name for the journal path, honoured for compatibility with the original design.
LEGACY_JOURNAL_ENV = "ORCH_JOURNAL"


class Settings(ServiceKnobs, RunKnobs, FanoutKnobs, ShellKnobs, ModelRequestKnobs):
    """The effective configuration of one orchmode process."""

    # The fields are declared in core/knobs.py, a group per concern: pydantic orders inherited
    # fields from the last base to the first, so they keep that module's order.

    model_config = ConfigDict(frozen=True, extra="forbid")

    @field_validator(
        "network_allow",
        "network_ask",
        "network_deny",
        "network_resolve",
        "permissions_allow",
        "permissions_ask",
        "permissions_deny",
        "main_web_tools",
        mode="before",
    )
    @classmethod
    def _listed(cls, value: Any) -> Any:
        """A flag or variable gives a list as one string, separated by commas."""
        if isinstance(value, str):
            return tuple(p.strip() for p in value.split(",") if p.strip())
        return value

    @field_validator("secret_files", mode="before")
    @classmethod
    def _patterns(cls, value: Any) -> Any:
        """A flag or variable gives the patterns as one string, separated by commas."""
        if isinstance(value, str):
            return tuple(p.strip() for p in value.split(",") if p.strip())
        return value

    @field_validator("sandbox_unix_sockets", mode="before")
    @classmethod
    def _socket_paths(cls, value: Any) -> Any:
        """A flag or variable gives the paths as one string, separated by commas."""
        if isinstance(value, str) and value.strip() != "all":
            return tuple(p.strip() for p in value.split(",") if p.strip())
        if isinstance(value, str):
            return "all"
        return value

    @field_validator("sandbox_unix_sockets")
    @classmethod
    def _absolute_sockets(cls, value: tuple[str, ...] | str) -> tuple[str, ...] | str:
        if isinstance(value, str):
            return value
        for path in value:
            if not path.startswith("/") or "\0" in path:
                raise ValueError(f"{path!r} is not an absolute path (or `all`)")
        return value

    @field_validator("secret_files")
    @classmethod
    def _valid_patterns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in value:
            if not pattern.strip("/") or "\0" in pattern:
                raise ValueError(f"{pattern!r} is not a file pattern")
        return value

    @field_validator("model", "worker_model", "verifier_model", "resolver_model")
    @classmethod
    def _model_ids(cls, value: str | None) -> str | None:
        """An alias (``opus``, ``sonnet``, ``haiku``) becomes the model ID it stands for."""
        if value is None:
            return None
        if not value.strip():
            raise ValueError("a model name cannot be empty")
        return model_id(value)

    @model_validator(mode="after")
    def _compaction_goes_down(self) -> Settings:
        if self.compact_to >= self.compact_at:
            raise ValueError(
                f"compact_to ({self.compact_to:g}) must be below compact_at ({self.compact_at:g})"
            )
        return self

    def model_for(self, role: Role) -> str:
        """The model an agent of ``role`` runs on: its role's setting, else ``model``."""
        own = {
            "worker": self.worker_model,
            "verifier": self.verifier_model,
            "resolver": self.resolver_model,
        }.get(role)
        return own or self.model

    def effort_for(self, role: Role) -> Effort:
        """The effort an agent of ``role`` asks for: its role's setting, else ``effort``."""
        own = {"worker": self.worker_effort, "verifier": self.verifier_effort}.get(role)
        return own or self.effort

    def batched(self, role: Role) -> bool:
        """Whether an agent of ``role`` sends its requests through the Message Batches API."""
        if role == "verifier":
            return self.batch != "off"
        return self.batch == "subagents" and role != "main"

    def models(self) -> list[str]:
        """Every model the session's agents may run on, the main agent's first."""
        found = [self.model]
        for role in ("worker", "verifier", "resolver"):
            if (chosen := self.model_for(role)) not in found:
                found.append(chosen)
        return found

    def unpriced(self) -> str | None:
        """The first model the agents may run on that has no price, if any."""
        return next((m for m in self.models() if m not in self.prices), None)

    def price(self, model: str | None = None, *, batched: bool = False) -> ModelPrice | None:
        """The price of ``model`` (default: the main agent's), or None if it has none; a
        batched request's is half of it."""
        price = self.prices.get(model or self.model)
        return price.batched() if price is not None and batched else price

    @property
    def window(self) -> int:
        """The main agent's context window in tokens: the setting, else the model's."""
        return self.window_of(self.model)

    def window_of(self, model: str) -> int:
        """A model's context window in tokens: the setting, else the model's own."""
        return self.context_window or context_window_of(model)

    def with_test_limits(self) -> Settings:
        """The spec's small-limits mode: it wins over every other source."""
        return self.model_copy(update={"max_subtasks": 2, "subagent_turns": 1, "main_turns": 1})

    def store_url(self, workdir: Path) -> str:
        """The store to open: ``store``, else the SQLite journal file."""
        if self.store:
            return self.store
        return "sqlite://" + str(self.journal or workdir / ".orchmode" / "journal.db")


def setting_names() -> list[str]:
    return list(Settings.model_fields)


def flag_names() -> list[str]:
    """Settings that have a flag and an environment variable (a table has neither)."""
    return [
        name
        for name, field in Settings.model_fields.items()
        if not (
            isinstance(field.json_schema_extra, dict)
            and field.json_schema_extra.get("flag") is False
        )
    ]


def env_var(name: str) -> str:
    return ENV_PREFIX + name.upper()


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _from_env(env: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    found: dict[str, tuple[str, str]] = {}
    if env.get(LEGACY_JOURNAL_ENV):
        found["journal"] = (env[LEGACY_JOURNAL_ENV], LEGACY_JOURNAL_ENV)
    for name in flag_names():
        value = env.get(env_var(name))
        if value is not None and value != "":
            found[name] = (value, env_var(name))
    return found


def _from_toml(path: Path) -> dict[str, tuple[Any, str]]:
    return _parsed(_read(path), path)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc


def _parsed(content: bytes, path: Path) -> dict[str, tuple[Any, str]]:
    try:
        data = tomllib.loads(content.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    found: dict[str, tuple[Any, str]] = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name not in Settings.model_fields:
            raise ConfigError(
                f"unknown setting {key!r} in {path} — known settings: {', '.join(setting_names())}"
            )
        found[name] = (value, f"{path} key {key!r}")
    return found


def user_config_dir(env: Mapping[str, str]) -> Path:
    """The user's own orchmode configuration directory: ``$XDG_CONFIG_HOME/orchmode``, else
    ``~/.config/orchmode`` (an empty or relative ``XDG_CONFIG_HOME`` is ignored, as the XDG
    specification says)."""
    xdg = env.get("XDG_CONFIG_HOME", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "orchmode"
    home = Path(env["HOME"]) if env.get("HOME") else Path.home()
    return home / ".config" / "orchmode"


def trust_of(name: str) -> tuple[TrustKind, Stricter]:
    """How far an untrusted project is believed for setting ``name`` (and which way its cap is
    stricter)."""
    return trust_marks(Settings.model_fields[name].json_schema_extra)


def trust_marks(extra: object) -> tuple[TrustKind, Stricter]:
    """A field's trust marker read; a field without one (or with a wrong one) counts as
    protected, so forgetting to mark a new setting errs on the safe side."""
    marks = extra if isinstance(extra, dict) else {}
    kind, stricter = marks.get("trust"), marks.get("stricter", "lower")
    if kind == "safe":
        return "safe", "lower"
    if kind == "cap" and stricter == "higher":
        return "cap", "higher"
    if kind == "cap" and stricter == "more":
        return "cap", "more"
    if kind == "cap":
        return "cap", "lower"
    return "protected", "lower"


def needs_trust(name: str) -> bool:
    """Whether a project may set ``name`` only when trusted (caps may still restrict)."""
    return trust_of(name)[0] != "safe"


def stricter_or_same(stricter: Stricter, value: Any, baseline: Any) -> bool:
    """Whether a cap's ``value`` holds a run at least as tightly as ``baseline`` does."""
    if stricter == "more":
        return set(value or ()) >= set(baseline or ())
    if value is None:  # no limit: the loosest there is
        return baseline is None
    if baseline is None:
        return True
    return bool(value <= baseline if stricter == "lower" else value >= baseline)


def admitted(name: str, value: Any, baseline: Settings) -> bool:
    """Whether an untrusted project's ``value`` for ``name`` counts, over ``baseline`` (what
    the user's own configuration and the defaults give). The value the user has anyway
    counts: it changes nothing, so it is not worth a word."""
    kind, stricter = trust_of(name)
    if kind == "safe" or value == getattr(baseline, name):
        return True
    if kind == "protected":
        return False
    return stricter_or_same(stricter, value, getattr(baseline, name))


def named_files(values: Mapping[str, Any]) -> dict[str, Path]:
    """The files a project's settings name that orchmode reads or runs, by setting, hashed
    with its settings files when the directory is trusted: the MCP config (its servers are
    programs run as you) and a bubblewrap given as a path."""
    named: dict[str, Path] = {}
    if isinstance(mcp := values.get("mcp_config"), str | Path):
        named["mcp_config"] = Path(mcp)
    if isinstance(bwrap := values.get("sandbox_bwrap"), str) and "/" in bwrap:
        named["sandbox_bwrap"] = Path(bwrap)
    return named


def project_settings(directory: Path) -> dict[str, Any]:
    """The settings a directory's own ``orchmode.toml`` sets, as written (none without one)."""
    path = directory / CONFIG_FILE
    if not path.is_file():
        return {}
    return {name: value for name, (value, _source) in _from_toml(path).items()}


def project_verdict(
    directory: Path, values: Mapping[str, Any], config_dir: Path, read: bytes | None = None
) -> Verdict:
    """Whether the user trusts ``directory``'s settings files as they are now; ``read``: the
    ``orchmode.toml`` the settings were parsed from, so what is checked is what was read."""
    seen = {CONFIG_FILE: digest(read)} if read is not None else {}
    now = fingerprint(directory, named_files(values).values(), seen=seen)
    return verdict(read_records(config_dir), directory, now)


def ignored_line(ignored: list[str], found: Verdict) -> str:
    """The one line that says which of a project's settings were ignored, and how to trust it."""
    command = f"`orchmode trust {shlex.quote(str(found.directory))}`"
    names = ", ".join(ignored)
    if found.known:
        return (
            f"ignoring {CONFIG_FILE}'s {names}: its settings files changed since you trusted "
            f"this directory ({listed(list(found.changed))}) — review them and run {command} "
            "again if you trust them"
        )
    return (
        f"ignoring {CONFIG_FILE}'s {names}: this directory is not trusted — run {command} if "
        "you trust its settings"
    )


def _validated(layers: Mapping[str, tuple[Any, str]]) -> Settings:
    """The settings the layers make, validated once, naming the source of any bad value."""
    values = {name: value for name, (value, _source) in layers.items()}
    try:
        return Settings(**values)
    except ValidationError as exc:
        error = exc.errors()[0]
        name = str(error["loc"][0]) if error["loc"] else "?"
        source = layers.get(name, (None, name))[1]
        raise ConfigError(f"{source}: {error['msg']} (got {error.get('input')!r})") from exc


_INVALID = object()


def _as_setting(name: str, value: Any, below: Mapping[str, tuple[Any, str]]) -> Any:
    """``value`` as setting ``name`` holds it (``_INVALID`` when it is not a valid one)."""
    values = {k: v for k, (v, _source) in below.items()}
    try:
        return getattr(Settings(**{**values, name: value}), name)
    except ValidationError:
        return _INVALID


def _project_layer(
    cwd: Path,
    below: Mapping[str, tuple[Any, str]],
    config_dir: Path,
    warn: Callable[[str], object] | None,
    overridden: Iterable[str] = (),
) -> dict[str, tuple[Any, str]]:
    """The project's ``orchmode.toml``, less what it may not set unless trusted.

    Settings the environment or a flag sets (``overridden``) are not the project's to give
    either way, so they are not named as ignored.
    """
    content = _read(cwd / CONFIG_FILE)
    project = _parsed(content, cwd / CONFIG_FILE)
    theirs = set(overridden)
    ruled = [name for name in project if needs_trust(name) and name not in theirs]
    if not ruled:
        return project
    raw = {name: value for name, (value, _source) in project.items()}
    found = project_verdict(cwd, raw, config_dir, read=content)
    if found.trusted:
        return project
    baseline = _validated(below)
    ignored = []
    for name in ruled:
        value = _as_setting(name, raw[name], below)
        # a value that is no valid setting is kept, so the error names this file
        if value is not _INVALID and not admitted(name, value, baseline):
            ignored.append(name)
    if ignored and warn is not None:
        warn(ignored_line(ignored, found))
    return {name: source for name, source in project.items() if name not in ignored}


def load_settings(
    flags: Mapping[str, Any],
    *,
    env: Mapping[str, str],
    cwd: Path,
    config_file: Path | None = None,
    config_dir: Path | None = None,
    warn: Callable[[str], object] | None = None,
) -> Settings:
    """Layer the sources and validate once, naming the source of any bad value.

    flags > ``env`` > the project's ``orchmode.toml`` in ``cwd`` (what needs trust only when
    the user trusts the directory; each ignored key named in one line to ``warn``) > the
    user's ``config.toml`` in ``config_dir`` (default :func:`user_config_dir`) > defaults.
    A ``config_file`` the user names takes the project file's place and is believed in full:
    the user chose it.
    """
    config_dir = config_dir or user_config_dir(env)
    above: dict[str, tuple[Any, str]] = dict(_from_env(env))
    above.update({k: (v, flag(k)) for k, v in flags.items() if v is not None})
    layers: dict[str, tuple[Any, str]] = {}
    if (user_file := config_dir / USER_CONFIG_FILE).is_file():
        layers.update(_from_toml(user_file))
    if config_file is not None:
        layers.update(_from_toml(config_file))
    elif (cwd / CONFIG_FILE).is_file():
        layers.update(_project_layer(cwd, layers, config_dir, warn, overridden=above))
    layers.update(above)
    settings = _validated(layers)
    return settings.with_test_limits() if settings.test_mode else settings


def settings_table() -> str:
    """The settings table of docs/configuration.md, made so that it always matches the code.

    ``scripts/settings_table.py --write`` puts it into the page; the tests check it is there.
    """
    rows = [
        "| setting | flag | environment | default | untrusted project | meaning |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, field in Settings.model_fields.items():
        default = field.default
        project = untrusted_project(name)
        if name not in flag_names():
            rows.append(f"| `{name}` | — | — | (see below) | {project} | {meaning(name)} |")
            continue
        if default is None:
            shown = "—"
        elif isinstance(default, bool):
            shown = f"`{str(default).lower()}`"
        elif isinstance(default, tuple):
            shown = ", ".join(f"`{item}`" for item in default) or "—"
        else:
            shown = f"`{default}`"
        rows.append(
            f"| `{name}` | `{flag(name)}` | `{env_var(name)}` | {shown} | {project} "
            f"| {meaning(name)} |"
        )
    return "\n".join(rows)


def meaning(name: str) -> str:
    """A setting's help text on one line: its docstring in core/knobs.py, wrapped there."""
    return " ".join((Settings.model_fields[name].description or "").split())


def untrusted_project(name: str) -> str:
    """What the settings table says an untrusted project's ``orchmode.toml`` may do to it."""
    kind, stricter = trust_of(name)
    if kind == "safe":
        return "yes"
    if kind == "protected":
        return "no"
    if stricter == "more":
        return "only add"
    if Settings.model_fields[name].annotation is bool:
        return "only `false`"
    return f"only {stricter}"
