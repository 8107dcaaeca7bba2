"""``scrub_history`` in the real local sandbox with real git: the shapes a task repo comes in.

The planted-secret attack (every hiding place at once, as agent and root) is in
``tests/adversarial/test_hostile_git_history.py``; here: a base commit behind HEAD, one the
repository lacks, a bad one, a submodule's future, a repository that cannot be made
self-contained, and the graders' ``base_commit``.
"""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

import pytest

from agentrl.graders.base import Grader
from agentrl.graders.swebench import SWEBenchGrader
from agentrl.harnesses.errors import HarnessError
from agentrl.harnesses.history import scrub_history
from agentrl.harnesses.workspace import capture_diff, prepare_workspace
from agentrl.sandboxes.local import LocalSandbox
from agentrl.types import Task

ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "dev",
    "GIT_AUTHOR_EMAIL": "dev@example.com",
    "GIT_COMMITTER_NAME": "dev",
    "GIT_COMMITTER_EMAIL": "dev@example.com",
    "GIT_CONFIG_NOSYSTEM": "1",
    "HOME": "/nonexistent",
}
GIT = "git -c safe.directory=*"


def sh(cwd: Path, script: str) -> str:
    cwd.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["sh", "-c", "set -e\n" + script], cwd=cwd, env=ENV, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def two_commits(repo: Path) -> tuple[str, str]:
    """A repo on ``main`` at its second commit ("future"); returns (base, future)."""
    base = sh(
        repo,
        "git init -q -b main . && echo 'VALUE = 1' > mod.py && git add -A && "
        "git commit -qm base && git rev-parse HEAD",
    )
    future = sh(
        repo, "echo 'VALUE = 2  # FIX' > mod.py && git commit -qam fix && git rev-parse HEAD"
    )
    return base, future


async def run(box: LocalSandbox, script: str, user: str = "agent") -> str:
    done = await box.exec(script, user=user, workdir="/workspace", timeout=60)
    assert done.exit_code == 0, done.stderr
    return done.stdout.strip()


async def test_a_named_base_behind_head_becomes_head_and_the_rest_goes(tmp_path, caplog):
    """The task names its base; HEAD sits on a later commit: the branch moves to the base,
    the later commit is unreachable, the working tree is not touched, and the diff is
    still taken against the workspace as the agent got it."""
    base, future = two_commits(tmp_path / "repo")
    async with LocalSandbox(repo=str(tmp_path / "repo")) as box:
        task = Task(instance_id="move-1", problem_statement="x")
        with caplog.at_level(logging.INFO, logger="agentrl.harnesses.history"):
            baseline = await prepare_workspace(box, task, base_commit=base)
        assert "moved HEAD to the base commit" in caplog.text
        assert await run(box, "git rev-parse HEAD && git symbolic-ref HEAD") == (
            f"{base}\nrefs/heads/main"
        )
        missing = await box.exec(f"git cat-file -e {future}", user="agent", workdir="/workspace")
        assert missing.exit_code != 0
        assert await run(box, "cat mod.py") == "VALUE = 2  # FIX"
        await run(box, "echo 'VALUE = 3' > mod.py")
        diff = await capture_diff(box, "/workspace", baseline, ("PROBLEM_STATEMENT.md",))
        assert "-VALUE = 2  # FIX\n+VALUE = 3" in diff


async def test_a_base_the_repository_lacks_keeps_head_and_still_scrubs(tmp_path, caplog):
    """A base commit id the repository does not have is logged; HEAD's history is kept and
    a tag on another line of history still goes."""
    base, _ = two_commits(tmp_path / "repo")
    sh(tmp_path / "repo", f"git tag gone {base} && git reset -q --hard {base}")
    sh(tmp_path / "repo", "git checkout -q -b side && echo s > s && git add s && git commit -qm s")
    sh(tmp_path / "repo", "git tag side-tag && git checkout -q main && git branch -qD side")
    async with LocalSandbox(repo=str(tmp_path / "repo")) as box:
        with caplog.at_level(logging.WARNING, logger="agentrl.harnesses.history"):
            await scrub_history(box, "/workspace", base_commit="0" * 40, instance_id="lack-1")
        assert "lack-1: the base commit 0000" in caplog.text
        assert await run(box, f"{GIT} rev-parse HEAD", user="root") == base
        assert await run(box, f"{GIT} log --all --format=%s", user="root") == "base"


async def test_a_base_commit_that_is_not_an_id_is_refused(tmp_path):
    """A base commit is spliced into a root shell: anything but hex digits is refused."""
    async with LocalSandbox(repo=str(tmp_path)) as box:
        with pytest.raises(HarnessError, match="is not a commit id"):
            await scrub_history(box, "/workspace", base_commit="HEAD; touch /tmp/pwned")


async def prepare_and_check_sub(box: LocalSandbox, key: str, base: str, future: str) -> None:
    """Prepare the workspace; submodule ``sub`` is at ``base`` and ``future`` is gone."""
    await prepare_workspace(box, Task(instance_id=key, problem_statement="x"))
    assert await run(box, "git -C sub rev-parse HEAD") == base
    assert await run(box, "git -C sub log --all --format=%s") == "base"
    gone = await box.exec(f"git -C sub cat-file -e {future}", user="agent")
    assert gone.exit_code != 0


async def test_a_submodules_future_goes_too(tmp_path):
    """An absorbed submodule keeps its checked-out commit; its later commit and tag go."""
    sub_base, sub_future = two_commits(tmp_path / "sub")
    sh(tmp_path / "sub", f"git tag v2 {sub_future} && git reset -q --hard {sub_base}")
    sh(tmp_path / "sub", f"git update-ref refs/heads/next {sub_future}")
    sh(
        tmp_path / "repo",
        "git init -q -b main . && echo top > top.txt && git add -A && git commit -qm top && "
        "git -c protocol.file.allow=always submodule add -q ../sub sub && "
        "git -C sub checkout -q v2 && git -C sub checkout -q " + sub_base + " && "
        "git commit -qam 'add sub'",
    )
    async with LocalSandbox(repo=str(tmp_path / "repo")) as box:
        await prepare_and_check_sub(box, "sub-1", sub_base, sub_future)
        assert await run(box, "git -C sub tag && git -C sub remote && git status --short") == (
            "?? PROBLEM_STATEMENT.md"
        )


async def test_a_submodule_with_its_own_git_dir_loses_its_future_too(tmp_path):
    """A submodule whose repository sits in its own directory (not absorbed into
    .git/modules, so found only through the index's gitlink) keeps its checked-out commit;
    its later commit and branch go."""
    sub_base, sub_future = two_commits(tmp_path / "repo" / "sub")
    sh(tmp_path / "repo" / "sub", f"git update-ref refs/heads/next {sub_future}")
    sh(tmp_path / "repo" / "sub", f"git reset -q --hard {sub_base}")
    sh(
        tmp_path / "repo",
        "git init -q -b main . && echo top > top.txt && "
        "git -c protocol.file.allow=always submodule add -q ./sub sub 2>/dev/null && "
        "git add -A && git commit -qm top",
    )
    assert (tmp_path / "repo" / "sub" / ".git").is_dir()
    assert "160000" in sh(tmp_path / "repo", "git ls-files --stage sub")
    async with LocalSandbox(repo=str(tmp_path / "repo")) as box:
        await prepare_and_check_sub(box, "sub-2", sub_base, sub_future)


async def test_a_repository_with_missing_objects_fails_loudly(tmp_path):
    """Objects that live only in an alternate store the sandbox cannot see cannot be kept:
    preparation fails with what happened instead of handing over a broken repository."""
    two_commits(tmp_path / "repo")
    sh(tmp_path / "repo", "git clone -q --bare . ../store")
    sh(
        tmp_path / "repo",
        f"echo {tmp_path / 'store' / 'objects'} > .git/objects/info/alternates && "
        "rm -rf .git/objects/?? ../store",
    )
    async with LocalSandbox(repo=str(tmp_path / "repo")) as box:
        refused = r"(?s)history in /workspace could not be repacked.*HEAD names a commit"
        with pytest.raises(HarnessError, match=refused):
            await prepare_workspace(box, Task(instance_id="broken-1", problem_statement="x"))


def test_graders_name_the_base_commit_their_tasks_carry():
    """swebench's base is its instance's ``base_commit``; a grader without one says None."""
    grader = SWEBenchGrader()
    task = Task(instance_id="i", problem_statement="x", grading={"instance": {"base_commit": "ab"}})
    assert grader.base_commit(task) == "ab"
    bare = Task(instance_id="i", problem_statement="x", grading={"instance": {"base_commit": ""}})
    assert grader.base_commit(bare) is None
    assert Grader.base_commit(grader, task) is None
