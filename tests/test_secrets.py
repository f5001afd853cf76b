"""Secrets never reach the model: secret files withheld in every sandbox, their values and
orchmode's credentials masked in everything that leaves a tool — real bubblewrap, real git,
real HTTP to the scripted model, the real CLI and its SQLite journal."""

from __future__ import annotations

import base64
import dataclasses
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import StartServer
from orchmode.core.errors import ConfigError
from orchmode.core.prompts import RESOLVE_MARKER, VERIFY_MARKER
from orchmode.core.secrets import (
    MASK,
    WITHHELD_NOTE,
    Masker,
    SecretFiles,
    Secrets,
    encodings,
    find_secret_files,
    values_in,
)
from orchmode.core.settings import Settings, load_settings
from orchmode.executors.host import ShellFactory
from orchmode.shell.bwrap import probe
from orchmode.shell.output import _OutputCollector
from orchmode.testing import ScriptedServer
from orchmode.testing.scenario import OrchestrationScenario, keep_both_sides
from orchmode.trees.patches import summarise
from orchmode.trees.refusals import refusals
from orchmode.trees.trees import Trees
from recorded_runs import base_env, orchmode

# gc.auto=0: a commit of 10,000 files would start packing them in the background, under
# the copy each test makes of the repository
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "gc.auto=0"]

#: What the repository's secret files hold: none of these bytes may leave a tool.
DB_PASSWORD = "hunter2-very-secret-9731"
API_KEY_VALUE = "sk-live-4f8a1c2e9b7d6a5f"
PROD_TOKEN = "prod-token-zyx987-QWERTY"
PEM_BODY = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7"
SECRETS = (DB_PASSWORD, API_KEY_VALUE, PROD_TOKEN, PEM_BODY)
#: In orchmode's own environment, under a name that marks a credential.
ENV_TOKEN = "ghp_envtoken0123456789abcdefXYZ"


def make_repo(root: Path, files: int = 10_000) -> Path:
    """A repository of ``files`` ordinary files plus a committed ``.env``, an ignored
    ``config/.env.production`` and an untracked ``deploy/service.pem``."""
    root.mkdir()
    for i in range(files):
        path = root / f"src/pkg{i % 50}/mod{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"VALUE_{i} = {i}\n")
    (root / ".env").write_text(f"DB_PASSWORD={DB_PASSWORD}\nexport API_KEY='{API_KEY_VALUE}'\n")
    (root / ".gitignore").write_text("config/.env.production\n")
    (root / "shared.txt").write_text("head\n")
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=root, check=True)
    subprocess.run([*GIT, "add", "-A"], cwd=root, check=True)
    subprocess.run([*GIT, "commit", "-qm", "start"], cwd=root, check=True)
    (root / "config").mkdir()
    (root / "config" / ".env.production").write_text(f"SECRET_TOKEN={PROD_TOKEN}\n")
    (root / "deploy").mkdir()
    (root / "deploy" / "service.pem").write_text(
        f"-----BEGIN PRIVATE KEY-----\n{PEM_BODY}\n-----END PRIVATE KEY-----\n"
    )
    return root


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repo(tmp_path_factory.mktemp("secrets") / "repo")


@pytest.fixture
def repo(template: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "work"
    shutil.copytree(template, copy, symlinks=True)
    return copy


@pytest.fixture
def bubblewrap() -> None:
    problem = probe().problem
    if problem is not None:
        pytest.fail(problem)


def leaks(data: bytes | str) -> list[str]:
    raw = data.encode(errors="surrogateescape") if isinstance(data, str) else data
    return [s for s in (*SECRETS, ENV_TOKEN) if s.encode() in raw]


# ------------------------------------------------------------------------ pure logic


def test_a_name_pattern_matches_at_any_depth_and_a_path_pattern_from_the_root() -> None:
    secret = SecretFiles((".env", ".env.*", "*.pem", "deploy/*.json", "id_rsa*"))
    assert secret.matches(".env") and secret.matches("config/.env.production")
    assert secret.matches("a/b/c/service.pem") and secret.matches("deploy/gcp.json")
    assert secret.matches("home/id_rsa.pub")
    assert not secret.matches(".envrc") and not secret.matches("env/main.py")
    assert not secret.matches("sub/deploy/gcp.json")  # anchored at the root
    assert not secret.matches("deploy/keys/gcp.json")  # `*` stays in one directory
    assert SecretFiles(("deploy/**/*.json",)).matches("deploy/keys/gcp.json")
    assert not SecretFiles(()).matches(".env")


@given(st.lists(st.sampled_from(["src", "config", ".env", "a.pem", "x", "deploy"]), max_size=5))
def test_a_path_is_secret_exactly_when_its_name_is(parts: list[str]) -> None:
    secret = SecretFiles()
    path = "/".join([*parts, "main.py"])
    assert not secret.matches(path)
    for name in (".env", "key.pem", "id_ed25519"):
        assert secret.matches("/".join([*parts, name]))


def test_values_are_read_from_key_value_files_and_from_the_lines_of_others() -> None:
    env = values_in(b"# comment\nexport DB_PASSWORD='s3cr3t-pass'\nDEBUG=1\nTOKEN=abcdefgh # x\n")
    assert env == ["s3cr3t-pass", "abcdefgh"]  # `1` is a setting, too short to mask
    assert "hunter22" in values_in(b"machine example.com login bob password hunter22\n")
    assert "npm_ABCDEF123" in values_in(b"//registry.npmjs.org/:_authToken=npm_ABCDEF123\n")
    pem = values_in(f"-----BEGIN KEY-----\n{PEM_BODY}\nshort\n".encode())
    assert PEM_BODY in pem and "short" not in pem
    assert values_in(b"\x30\x82\xff\xfe binary") == []


@given(
    st.lists(st.text(alphabet="abcdefXYZ0123-_", min_size=6, max_size=30), max_size=5),
    st.text(max_size=200),
)
def test_a_masked_text_holds_no_secret_and_a_text_without_one_is_unchanged(
    secrets: list[str], text: str
) -> None:
    masker = Masker(secrets)
    plain = text.replace("*", "")
    if not any(form in plain for s in secrets for form in (s, *encodings(s))):
        assert masker.mask(plain) == plain
    mixed = "|".join([plain, *secrets, plain])
    masked = masker.mask(mixed)
    assert not any(s in masked for s in secrets if MASK not in s)


@given(
    st.text(min_size=8, max_size=40).filter(lambda v: v.strip() and MASK not in v),
    st.binary(max_size=12),
    st.binary(max_size=12),
)
def test_a_secret_passed_through_base64_hex_or_rev_is_still_masked(
    value: str, before: bytes, after: bytes
) -> None:
    """Wherever the value sits in what is encoded, its encoded form is found."""
    masker = Masker([value])
    raw = value.encode("utf-8", "surrogateescape")
    stream = before + raw + after
    for shown in (
        base64.b64encode(stream).decode(),
        stream.hex(),
        stream.hex().upper(),
        "x" + value[::-1] + "y",
    ):
        assert masker.holds(shown), shown


async def test_the_values_of_secret_files_git_holds_are_masked_even_once_changed_since(
    repo: Path,
) -> None:
    """`.env` is committed; the working copy now holds another value. Agents can read git's
    copy, so its values are masked too, and the start names the file."""
    (repo / ".env").write_text("DB_PASSWORD=a-new-value-after-rotation\n")
    secrets = Secrets.start([".env", "*.pem"], repo, {})
    assert secrets.in_git == (".env",)
    assert (
        secrets.masker.mask(f"was {DB_PASSWORD}, key {API_KEY_VALUE}") == f"was {MASK}, key {MASK}"
    )
    assert MASK in secrets.masker.mask(base64.b64encode(f"x={DB_PASSWORD}".encode()).decode())
    assert secrets.masker.mask("a-new-value-after-rotation") == MASK
    untracked = Secrets.start([".env.production", "*.pem"], repo, {})
    assert untracked.in_git == ()  # ignored and untracked ones are not git's


@given(st.integers(min_value=1, max_value=60), st.integers(min_value=0, max_value=80))
def test_no_part_of_a_secret_survives_the_output_limit(limit: int, at: int) -> None:
    """The collector keeps the longest secret's length past its limit, so a secret that
    the cut would split is whole when masked."""
    secret = "TOPSECRET-0123456789"
    masker = Masker([secret])
    output = ("x" * at + secret + "y" * 40).encode()
    collector = _OutputCollector(b"\nNONCE ", limit, masker.longest)
    collector.feed(output + b"\nNONCE 0\n")
    rendered = collector.render(masker.mask)
    for size in range(4, len(secret) + 1):  # no piece of it either
        assert not any(secret[i : i + size] in rendered for i in range(len(secret) - size + 1))


def test_the_setting_is_a_list_in_the_file_commas_on_the_command_line_and_can_be_emptied(
    tmp_path: Path,
) -> None:
    assert ".env" in Settings().secret_files
    # a file the user names (a project's own counts only once trusted: tests/test_trust.py)
    named = tmp_path / "orchmode.toml"
    named.write_text('secret_files = ["*.secret", "vault/*"]\n')
    assert load_settings({}, env={}, cwd=tmp_path, config_file=named).secret_files == (
        "*.secret",
        "vault/*",
    )
    named.write_text("secret_files = []\n")
    assert load_settings({}, env={}, cwd=tmp_path, config_file=named).secret_files == ()
    flags = {"secret_files": ".env, *.key"}
    assert load_settings(flags, env={}, cwd=tmp_path).secret_files == (".env", "*.key")
    with pytest.raises(ConfigError, match=r"--secret-files: .*'/' is not a file pattern"):
        load_settings({"secret_files": "/"}, env={}, cwd=tmp_path)


def test_secret_files_are_found_tracked_untracked_and_ignored(repo: Path) -> None:
    assert find_secret_files(repo, SecretFiles()) == (
        ".env",
        "config/.env.production",
        "deploy/service.pem",
    )
    assert find_secret_files(repo, SecretFiles(())) == ()


def test_the_search_takes_links_as_files_and_skips_git_orchmode_and_what_links_lead_to(
    tmp_path: Path,
) -> None:
    (tmp_path / "real" / "deep").mkdir(parents=True)
    (tmp_path / "real" / "deep" / "id_rsa").write_text("key\n")
    (tmp_path / "keys").symlink_to(tmp_path / "real")  # a directory behind a link
    (tmp_path / "site.key").symlink_to(tmp_path / "real")  # a secret name, on a link
    (tmp_path / "dangling.pem").symlink_to(tmp_path / "nowhere")
    for skipped in (".git", ".orchmode", "sub/.git"):
        (tmp_path / skipped).mkdir(parents=True)
        (tmp_path / skipped / ".env").write_text("X=1\n")
    (tmp_path / "deploy").mkdir()
    (tmp_path / "deploy" / "gcp.json").write_text("{}\n")
    found = find_secret_files(tmp_path, SecretFiles((*SecretFiles().patterns, "deploy/*.json")))
    assert found == ("dangling.pem", "deploy/gcp.json", "real/deep/id_rsa", "site.key")


def test_a_patch_that_writes_a_secret_file_is_refused() -> None:
    patch = (
        "diff --git a/.env b/.env\nnew file mode 100644\nindex 0000000..e69de29\n"
        "--- /dev/null\n+++ b/.env\n@@ -0,0 +1 @@\n+X=1\n"
    )
    assert refusals(summarise(patch)) == []  # without secret_files it is a file like any
    (reason,) = refusals(summarise(patch), SecretFiles())
    assert reason == "`.env`: writes a secret file (secret_files)"
    renamed = (
        "diff --git a/notes.txt b/deploy/k.pem\nsimilarity index 100%\n"
        "rename from notes.txt\nrename to deploy/k.pem\n"
    )
    assert refusals(summarise(renamed), SecretFiles())


async def test_a_snapshot_never_holds_a_secret_file(repo: Path) -> None:
    (repo / ".env").write_text(f"DB_PASSWORD={DB_PASSWORD}-changed\n")  # tracked, modified
    secrets = Secrets.start(Settings().secret_files, repo, {})
    trees = Trees(repo, secrets=secrets)
    try:
        snapshot = await trees.snapshots.snapshot()
        listing = subprocess.run(
            ["git", "ls-tree", "-r", "--name-only", snapshot.commit],
            env={"GIT_DIR": str(trees.store.git_dir)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    finally:
        trees.close()
    assert "shared.txt" in listing and len(listing) > 10_000
    assert not [p for p in listing if SecretFiles().matches(p)]
    # each is given a place, where the sandbox shows its note
    assert {".env", "config/.env.production", "deploy/service.pem"} <= set(snapshot.ignored)
    assert f"{DB_PASSWORD}-changed" in secrets.masker.secrets  # its value as it is now


# ------------------------------------------------------------------- the real sandbox


@pytest.fixture
def shell_in(bubblewrap: None) -> Callable[..., Any]:
    """A sandboxed shell in a directory, as the main agent's is made (closed by the test)."""

    def make(workdir: Path, **settings: Any) -> Any:
        chosen = Settings(**settings)
        secrets = Secrets.start(chosen.secret_files, workdir, {"GITHUB_TOKEN": ENV_TOKEN})
        return ShellFactory.build(chosen, workdir, (), secrets=secrets)()

    return make


async def test_the_main_agents_shell_reads_a_note_in_place_of_each_secret_file(
    repo: Path, shell_in: Callable[..., Any]
) -> None:
    shell = shell_in(repo)
    try:
        shown = await shell.run("cat .env config/.env.production deploy/service.pem")
        assert shown.output.count(WITHHELD_NOTE.strip()) == 3
        grep = await shell.run(f"grep -r -e hunter2 -e PRIVATE -e {PROD_TOKEN[:10]} . | head")
        committed = await shell.run("git show HEAD:.env")
        copied = await shell.run("cp .env copy.txt && cat copy.txt")
        written = await shell.run("echo X=1 > .env; rm -f deploy/service.pem; ls deploy")
        environment = await shell.run("echo $GITHUB_TOKEN; printenv | grep -c ghp_ || true")
    finally:
        await shell.close()
    for result in (shown, grep, committed, copied, written, environment):
        assert leaks(result.output) == [], result.output
    assert f"DB_PASSWORD={MASK}" in committed.output  # from git's objects: masked
    assert WITHHELD_NOTE.strip() in copied.output
    assert "Read-only file system" in written.output or "Permission denied" in written.output
    assert "service.pem" in written.output  # still there
    assert (repo / ".env").read_text().startswith("DB_PASSWORD=")  # untouched on the host


async def test_an_emptied_setting_withholds_nothing(
    repo: Path, shell_in: Callable[..., Any]
) -> None:
    shell = shell_in(repo, secret_files=())
    try:
        shown = await shell.run("cat .env")
    finally:
        await shell.close()
    assert DB_PASSWORD in shown.output


async def test_a_secret_file_made_between_turns_is_withheld_from_the_main_shell_from_then_on(
    serve: StartServer, tmp_path: Path, bubblewrap: None
) -> None:
    """The main shell outlives a turn; a key the user saves meanwhile is looked for when
    the next turn starts, and the shell that still shows it is replaced before it can."""
    from conftest import API_KEY, settings_for
    from orchmode.model.providers import Credentials
    from orchmode.session.agent import open_conversation
    from orchmode.testing import Reply, ScriptedRequest

    work = tmp_path / "work"
    (work / "deploy").mkdir(parents=True)
    (work / "notes.txt").write_text("plain\n")
    key = work / "deploy" / "service.key"
    commands = ["cd deploy && export KEPT=1 && ls", f"cat {key}; echo kept=${{KEPT:-no}}"]

    def respond(request: ScriptedRequest) -> Reply:
        if request.index % 2 == 0:
            return Reply.tool_use("bash", {"command": commands[request.index // 2]})
        return Reply.text("ok")

    server = await serve(respond)
    settings = settings_for(server, tmp_path, workdir=work)
    async with open_conversation(settings, Credentials(api_key=API_KEY)) as session:
        await session.turn("look around")
        key.write_text(f"{PEM_BODY}\n")  # saved meanwhile
        await session.turn("read the key")
    (result,) = server.log[3].body["messages"][-1]["content"]
    text = json.dumps(result)
    assert PEM_BODY not in json.dumps([e.body for e in server.log])
    assert WITHHELD_NOTE.strip()[:40] in text, text
    assert "found secret files since the shell started (deploy/service.key)" in text
    assert "kept=no" in text  # a fresh shell, and the model is told so


# ---------------------------------------------------------------- a whole run, by the CLI


def command_of(subtask: str) -> str | None:
    return subtask.split("$ ", 1)[1] if "$ " in subtask else None


WORKERS = [
    "Read the config $ cat .env config/.env.production deploy/service.pem",
    "Search the tree $ grep -r -e PASSWORD -e TOKEN -e PRIVATE . | head -20",
    f"Copy them $ cp config/.env.production leaked.txt && cp .env leaked2.txt && "
    f"echo {'x' * 6} >> shared.txt",
    "Add a secret file $ mkdir -p new && echo X=y > new/.env && echo ok",
    "Dig in git $ git cat-file --batch-all-objects --batch | grep -a PASSWORD > dump.txt; "
    "wc -c dump.txt",
    f"Append too $ echo {'y' * 6} >> shared.txt",
]


def resolve_and_look(prompt: str) -> str | None:
    """A resolver that keeps both sides, and reads the secret files on its way."""
    command = keep_both_sides(prompt)
    return None if command is None else f"cat .env config/.env.production; {command}"


@pytest.mark.slow
def test_no_byte_of_a_secret_reaches_the_model_the_journal_the_events_or_the_report(
    repo: Path,
    bubblewrap: None,
    scripted: Callable[..., ScriptedServer],
    tmp_path: Path,
) -> None:
    """Workers in overlays and the main agent in the working directory read the secret
    files, grep the tree, read git's history and copy the files elsewhere; orchmode's
    environment holds a token. None of those bytes is in any request the model received,
    in the journal, the events, the results, the report or the working directory's new
    files; the change that adds a secret file is refused, and the one that dug a secret
    out of git's objects is dropped."""
    scenario = OrchestrationScenario(
        subtasks=WORKERS,
        scout_command="git show HEAD:.env; cat config/.env.production; echo $GITHUB_TOKEN",
        worker_command=command_of,
        # verifiers look too, in a read-only view of their worker's layer
        verifier_command=lambda _prompt: "cat .env deploy/service.pem; ls -a config",
        resolver_command=resolve_and_look,
        workflow_input={"isolation": "worktree"},
    )
    server = scripted(scenario)
    env = base_env(GITHUB_TOKEN=ENV_TOKEN)
    done = orchmode(
        "run", "look at the config", "--base-url", server.url, "--json", cwd=repo, env=env
    )
    assert done.returncode == 0, done.stderr
    assert "git holds secret files (.env): agents are shown a note" in done.stderr
    report = orchmode("report", "-o", str(tmp_path / "report.html"), cwd=repo, env=env)
    assert report.returncode == 0, report.stderr
    shown = orchmode("show", cwd=repo, env=env)

    sent = json.dumps([e.body for e in server.log])
    assert leaks(sent) == []
    verifiers = [
        e.body
        for e in server.log
        if str(e.body.get("messages", [{}])[0].get("content", "")).startswith(VERIFY_MARKER)
    ]
    assert WITHHELD_NOTE.strip() in sent  # the workers did read the files
    assert sum(WITHHELD_NOTE.strip() in json.dumps(b) for b in verifiers) >= 4
    assert f"DB_PASSWORD={MASK}" in sent  # and the main agent the committed one, masked
    for output in (done.stdout, done.stderr, report.stdout, shown.stdout, shown.stderr):
        assert leaks(output) == []
    assert leaks((tmp_path / "report.html").read_bytes()) == []
    state = repo / ".orchmode"
    scanned = 0
    for path in state.rglob("*"):
        if path.is_file() and not path.is_symlink() and "objects" not in path.parts:
            assert leaks(path.read_bytes()) == [], path
            scanned += 1
    assert (state / "journal.db").is_file() and scanned > 3
    records = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    settled = [r for r in records if r.get("kind") == "ChangeSettled"]
    fates = {r.get("fate"): r.get("detail", "") for r in settled}
    # what was merged: the copies hold the note, the secret file and the dump did not land
    assert (repo / "leaked.txt").read_text() == WITHHELD_NOTE
    assert (repo / "leaked2.txt").read_text() == WITHHELD_NOTE
    # the two appends conflicted: a resolver, in a view of the tree as merged, kept both
    shared = (repo / "shared.txt").read_text()
    assert shared == "head\n" + "x" * 6 + "\n" + "y" * 6 + "\n", [r.get("detail") for r in settled]
    resolvers = [
        e.body
        for e in server.log
        if str(e.body.get("messages", [{}])[0].get("content", "")).startswith(RESOLVE_MARKER)
    ]
    assert any(WITHHELD_NOTE.strip() in json.dumps(b) for b in resolvers)
    assert not (repo / "new").exists() and not (repo / "dump.txt").exists()
    assert "secret file" in str(fates.get("refused")), fates
    assert "writes the value of a secret" in sent + done.stderr
    assert (repo / ".env").read_text().startswith(f"DB_PASSWORD={DB_PASSWORD}")


async def test_an_api_token_in_orchmodes_environment_printed_by_an_mcp_server_is_masked(
    serve: StartServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mcp_servers import http_server
    from test_mcp import run_session

    monkeypatch.setenv("DEMO_TOKEN", ENV_TOKEN)  # the server, in this process, reads it
    scenario = OrchestrationScenario(
        subtasks=["whoami"],
        scout_call=("mcp__web__whoami", {}),
        worker_call=lambda s: (f"mcp__web__{s}", {}),
    )
    with http_server("web") as url:
        server, events, _ = await run_session(
            serve, tmp_path, scenario, {"web": {"type": "http", "url": url}}
        )
    sent = json.dumps([e.body for e in server.log])
    assert "my token is ***" in sent
    assert ENV_TOKEN not in sent and ENV_TOKEN not in repr(events)
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert ENV_TOKEN.encode() not in path.read_bytes(), path


def test_the_event_bus_masks_every_event_before_any_subscriber_sees_it() -> None:
    from orchmode.core.events import BashDone, EventBus

    masker = Masker([DB_PASSWORD])
    bus = EventBus(mask=masker.mask_event)
    seen: list[object] = []
    bus.subscribe(seen.append)
    event = BashDone(
        agent="main",
        command=f"echo {DB_PASSWORD}",
        exit_code=0,
        timed_out=False,
        duration=0.1,
        sandbox="off",
    )
    bus.emit(event)
    assert DB_PASSWORD not in repr(seen) and f"echo {MASK}" in repr(seen)


@dataclasses.dataclass(frozen=True)
class _Carrier:
    """An event of any shape: a text, a number and nested data."""

    text: str
    count: int
    data: object


_SECRETS = ("hunter2-secret", "AKIAEXAMPLEKEY99")
_pieces = st.sampled_from(["", "plain", "x\0y", *_SECRETS, "hunter2-", "secret", "AKIA"])
_texts = st.lists(_pieces, max_size=4).map("".join)
_nested = st.recursive(
    _texts | st.integers() | st.none(),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=12,
)


def _masked_by_hand(data: object) -> object:
    """Every string with each secret replaced: what an event's fields must become."""
    if isinstance(data, str):
        for secret in sorted(_SECRETS, key=len, reverse=True):
            data = data.replace(secret, MASK)
        return data
    if isinstance(data, dict):
        return {k: _masked_by_hand(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_masked_by_hand(v) for v in data]
    if isinstance(data, tuple):
        return tuple(_masked_by_hand(v) for v in data)
    return data


@given(_texts, st.integers(), _nested)
def test_an_event_is_masked_wherever_its_texts_hold_a_secret_and_kept_where_none_do(
    text: str, count: int, data: object
) -> None:
    masker = Masker(_SECRETS)
    event = _Carrier(text, count, data)
    masked = masker.mask_event(event)
    assert masked == _Carrier(_masked_by_hand(text), count, _masked_by_hand(data))  # type: ignore[arg-type]
    if masked == event:
        assert masked is event  # nothing secret: the event itself, not a copy
