"""The fault suite's scenario: a repository of a few thousand files, and the workers that
rewrite it (some conflicting, one refuted), played by the scripted server."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from orchmode.testing import Reply, ScriptedRequest, ScriptedServer
from orchmode.testing.scenario import OrchestrationScenario, mode_is_on

API_KEY = "test-key"
GIT = ("git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main")

PACKAGES = 20
MODULES = 100
#: The packages whose modules the renaming worker rewrites (6 × 100 = 600 files).
RENAMED = tuple(f"src/app/pkg{p:02d}" for p in range(6))
LEGACY = 200
DOCS = 120
METRICS = 40


def _module(p: int, m: int) -> str:
    lines = [
        f'"""Module {m} of package {p}."""',
        "",
        "from app.util import old_helper",
        "",
        "",
        f"def run_{m}(value: int) -> int:",
        f"    return old_helper(value) + {p * MODULES + m}",
        "",
    ]
    return "\n".join(lines)


def repo_files() -> dict[str, str]:
    """The repository's files: about 2,500, source-like."""
    files = {
        "README.md": "# app\n\nA service.\n",
        "CHANGELOG.md": "# Changelog\n\n## Unreleased\n",
        "config.py": "DEBUG = True\nLIMIT = 10\n",
        "src/app/__init__.py": "",
        "src/app/util.py": "def old_helper(value: int) -> int:\n    return value * 2\n",
        "tmp/scratch.txt": "scratch\n",
        "scripts/build.sh": "#!/bin/sh\necho build\n",
        "scripts/deploy.sh": "#!/bin/sh\necho deploy\n",
    }
    for p in range(PACKAGES):
        files[f"src/app/pkg{p:02d}/__init__.py"] = ""
        for m in range(MODULES):
            files[f"src/app/pkg{p:02d}/mod{m:03d}.py"] = _module(p, m)
    for i in range(LEGACY):
        files[f"legacy/part{i // 50}/old{i:03d}.py"] = f"# legacy {i}\nVALUE = {i}\n"
    for i in range(DOCS):
        files[f"docs/section{i // 30}/page{i:03d}.md"] = f"# Page {i}\n\n" + "text " * 40 + "\n"
    return files


def make_repo(root: Path) -> Path:
    """The repository, committed, with an uncommitted edit and an untracked file too."""
    root.mkdir(parents=True)
    for name, content in repo_files().items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    subprocess.run([*GIT, "init", "-q"], cwd=root, check=True)
    subprocess.run([*GIT, "add", "-A"], cwd=root, check=True)
    subprocess.run([*GIT, "commit", "-qm", "start"], cwd=root, check=True)
    with (root / "README.md").open("a") as handle:
        handle.write("Uncommitted line.\n")
    (root / "NOTES.txt").write_text("untracked notes\n")
    return root


def copy_repo(source: Path, target: Path) -> Path:
    subprocess.run(["cp", "-a", str(source), str(target)], check=True)
    return target


# ---------------------------------------------------------------------------- the workers

#: Each worker's subtask names its one command after ``$ ``; "REFUTE" marks the one its
#: verifier refutes. The first three append to the changelog: the first merges, the other
#: two conflict with it (and each other) and go to resolvers.
SUBTASKS = (
    "Rename old_helper to new_helper $ sed -i 's/old_helper/new_helper/g' src/app/util.py "
    + " ".join(f"{p}/*.py" for p in RENAMED)
    + " && echo '- renamed old_helper to new_helper' >> CHANGELOG.md",
    "Drop the legacy package $ git rm -q -r legacy && echo '- dropped legacy/' >> CHANGELOG.md",
    # mv, not git mv: an overlay refuses to rename a directory of its lower layer (EXDEV),
    # and mv then copies and deletes, as it does across file systems.
    "Move the docs to manual/ $ mv docs manual && chmod +x scripts/build.sh "
    "scripts/deploy.sh && echo '- moved docs/ to manual/' >> CHANGELOG.md",
    "Add a metrics package $ mkdir -p src/app/metrics && for i in $(seq 1 "
    f'{METRICS}); do echo "VALUE_$i = $i" > src/app/metrics/m$i.py; done && '
    "printf '\\000\\001\\002\\377' > src/app/metrics/logo.bin",
    "Bump the version REFUTE $ echo 'VERSION = 9' > src/app/version.py && "
    "echo '- bumped the version' >> CHANGELOG.md",
    "Turn debugging off $ sed -i 's/DEBUG = True/DEBUG = False/' config.py && rm tmp/scratch.txt",
)
#: The lines the confirmed workers append to the changelog: each must be there once.
CHANGELOG_LINES = (
    "- renamed old_helper to new_helper",
    "- dropped legacy/",
    "- moved docs/ to manual/",
)
REFUTED_LINE = "- bumped the version"


def command_of(subtask: str) -> str | None:
    return subtask.split("$ ", 1)[1] if "$ " in subtask else None


def refute_marked(prompt: str) -> str:
    return "refuted" if "REFUTE" in prompt else "confirmed"


#: The summary turn's reply waits this long: the last moments (a point plus its offset)
#: must still find the run alive.
LAST_REPLY_DELAY = 0.25


@dataclass
class KilledScenario(OrchestrationScenario):
    """The scenario, its last reply (the summary turn's) held back a little."""

    def main(self, request: ScriptedRequest) -> Reply:
        reply = super().main(request)
        if not mode_is_on(request.messages):
            reply.delay = max(reply.delay, LAST_REPLY_DELAY)
        return reply


def scenario(delay: float = 0.03) -> OrchestrationScenario:
    return KilledScenario(
        subtasks=list(SUBTASKS),
        scout_command="ls",
        worker_command=command_of,
        verdict=refute_marked,
        delay=delay,
    )


def start_server(responder: OrchestrationScenario) -> ScriptedServer:
    server = ScriptedServer(responder, api_key=API_KEY)
    server.start_in_thread()
    return server
