"""Patch ladders, test-path patterns and git baselines, on the real local sandbox."""

from __future__ import annotations

import pathlib

import pytest

from agentrl.graders.patching import (
    DEFAULT_TEST_PATTERNS,
    SCALESWE_LADDER,
    apply_patch,
    ensure_git_baseline,
    is_protected,
    swebench_ladder,
)
from agentrl.sandboxes.local import LocalSandbox

WORKDIR = "/workspace"


@pytest.mark.parametrize(
    ("path", "protected"),
    [
        ("tests/test_core.py", True),
        ("pkg/tests/helpers.py", True),
        ("conftest.py", True),
        ("pkg/conftest.py", True),
        ("test_thing.py", True),
        ("pkg/thing_test.py", True),
        ("pkg/testing.py", False),
        ("src/contest.py", False),
        ("latest/app.py", False),
    ],
)
def test_default_test_patterns(path, protected):
    """The default patterns cover test directories, test modules and conftest files."""
    assert is_protected(path, DEFAULT_TEST_PATTERNS) is protected


def test_explicit_protection_by_directory_or_glob():
    """A task's test_files may name directories (whole tree) or globs."""
    assert is_protected("spec/a/b.rb", ["spec"])
    assert is_protected("spec/a/b.rb", ["spec/"])
    assert not is_protected("specs.rb", ["spec"])
    assert is_protected("a/check_x.sh", ["*/check_*.sh"])
    assert not is_protected("tests/test_a.py", ["spec"])


@pytest.fixture
def repo(tmp_path) -> pathlib.Path:
    root = tmp_path / "repo"
    (root / "src").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "src" / "app.py").write_text("x = 1\ny = 1\n")
    (root / "src" / "other.py").write_text("a = 1\n")
    (root / "tests" / "test_app.py").write_text("def test_x():\n    assert False\n")
    return root


async def _read(sandbox: LocalSandbox, path: str) -> str:
    return await sandbox.read_file(f"{WORKDIR}/{path}")


@pytest.mark.slow
async def test_half_applicable_diff_leaves_the_tree_untouched(repo):
    """When no rung applies the whole diff, a partly applied rung is rolled back."""
    diff = (
        "--- a/src/other.py\n+++ b/src/other.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n"
        "--- a/src/app.py\n+++ b/src/app.py\n@@ -1,2 +1,2 @@\n-x = 9\n-y = 9\n+x = 3\n+y = 3\n"
    )
    async with LocalSandbox(repo=str(repo), workdir=WORKDIR) as sandbox:
        await ensure_git_baseline(sandbox, WORKDIR)
        for ladder in (SCALESWE_LADDER, swebench_ladder()):
            outcome = await apply_patch(sandbox, WORKDIR, diff, ladder=ladder)
            assert not outcome.applied
            assert await _read(sandbox, "src/other.py") == "a = 1\n"
            assert await _read(sandbox, "src/app.py") == "x = 1\ny = 1\n"
            status = await sandbox.exec("git status --porcelain", workdir=WORKDIR)
            assert status.stdout == "", status.stdout


@pytest.mark.slow
async def test_protected_paths_are_put_back_after_applying(repo):
    """Edited and added test files are reverted; the source edit stays applied."""
    diff = (
        "--- a/src/app.py\n+++ b/src/app.py\n@@ -1,2 +1,2 @@\n-x = 1\n+x = 2\n y = 1\n"
        "--- a/tests/test_app.py\n+++ b/tests/test_app.py\n@@ -1,2 +1,2 @@\n"
        " def test_x():\n-    assert False\n+    assert True\n"
        "--- /dev/null\n+++ b/tests/conftest.py\n@@ -0,0 +1 @@\n+import os\n"
    )
    async with LocalSandbox(repo=str(repo), workdir=WORKDIR) as sandbox:
        outcome = await apply_patch(sandbox, WORKDIR, diff, protect=DEFAULT_TEST_PATTERNS)
        assert outcome.applied
        assert outcome.method == SCALESWE_LADDER[1], "no git repo: --3way cannot apply"
        assert outcome.restored == ("tests/conftest.py", "tests/test_app.py")
        assert await _read(sandbox, "src/app.py") == "x = 2\ny = 1\n"
        assert "assert False" in await _read(sandbox, "tests/test_app.py")
        missing = await sandbox.exec("test -e tests/conftest.py", workdir=WORKDIR)
        assert missing.exit_code == 1


@pytest.mark.slow
async def test_empty_diff_and_missing_final_newline(repo):
    """An empty diff is a no-op; a diff without its final newline still applies."""
    async with LocalSandbox(repo=str(repo), workdir=WORKDIR) as sandbox:
        empty = await apply_patch(sandbox, WORKDIR, "  \n")
        assert empty.applied and empty.method == "empty"
        await ensure_git_baseline(sandbox, WORKDIR)
        diff = "--- a/src/other.py\n+++ b/src/other.py\n@@ -1 +1 @@\n-a = 1\n+a = 5"
        outcome = await apply_patch(sandbox, WORKDIR, diff)
        assert outcome.applied and outcome.method == SCALESWE_LADDER[0]
        assert await _read(sandbox, "src/other.py") == "a = 5\n"


@pytest.mark.slow
async def test_git_baseline_is_deterministic_and_idempotent(repo):
    """Two sandboxes of one tree get the same baseline commit; a second call is a no-op."""
    heads = []
    for _ in range(2):
        async with LocalSandbox(repo=str(repo), workdir=WORKDIR, overlay="never") as sandbox:
            assert await ensure_git_baseline(sandbox, WORKDIR) is True
            assert await ensure_git_baseline(sandbox, WORKDIR) is False
            head = await sandbox.exec("git rev-parse HEAD", workdir=WORKDIR, check=True)
            heads.append(head.stdout.strip())
    assert heads[0] == heads[1] and len(heads[0]) == 40
    assert not (repo / ".git").exists()
