"""An agent reading the answer out of the task repository's git history.

The task repository is planted with its own future: the fix commit behind a tag and a
remote-tracking ref, a remote, a reflog entry, a stash, a note, an unreachable blob, a
linked worktree on the host and one in the sandbox, and an alternate object store that holds a secret besides objects the
base needs. After ``prepare_workspace`` (real local sandbox, real git) neither the agent
nor root finds the secret with git or with grep, and the workspace still diffs.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from agentrl.harnesses.history import scrub_history
from agentrl.harnesses.workspace import capture_diff, prepare_workspace
from agentrl.sandboxes.e2b import E2BSandbox
from agentrl.sandboxes.local import LocalSandbox
from agentrl.types import Task

SECRET = "FUTURE-SECRET"
GIT_ENV = {
    "GIT_AUTHOR_NAME": "dev",
    "GIT_AUTHOR_EMAIL": "dev@example.com",
    "GIT_COMMITTER_NAME": "dev",
    "GIT_COMMITTER_EMAIL": "dev@example.com",
    "GIT_CONFIG_NOSYSTEM": "1",
    "HOME": "/nonexistent",
}

PLANT = f"""
set -e
git init -q -b main .
echo 'VALUE = 1' > mod.py && echo readme > README.md && git add -A && git commit -qm base
git checkout -qb fix
echo 'VALUE = 2  # {SECRET}-commit' > mod.py && git commit -qam 'the fix {SECRET}-message'
git tag -a v-fix -m '{SECRET}-tag'
git checkout -q main
git update-ref refs/remotes/origin/fix fix
git remote add origin https://example.invalid/{SECRET}-remote.git
echo 'VALUE = 3  # {SECRET}-reflog' > mod.py && git commit -qam 'gone {SECRET}-reflog'
git reset -q --hard HEAD~1
echo 'VALUE = 4  # {SECRET}-stash' > mod.py && git stash -q
echo '{SECRET}-blob' | git hash-object -w --stdin >/dev/null
git notes add -m '{SECRET}-note' HEAD
git branch -qD fix
git gc -q
echo '{SECRET}-loose' | git hash-object -w --stdin >/dev/null
git worktree add -q ../host-wt v-fix
"""

#: In the sandbox, as root: an alternate store with a secret and the objects of the base;
#: the workspace's own copies of the base's objects are dropped (``clone --shared`` style).
ALTERNATE = f"""
set -e
cd /workspace
G="git -c safe.directory=*"
$G init -q --bare /tmp/alt
$G push -q /tmp/alt main:refs/heads/main
echo '{SECRET}-alternate' | $G --git-dir=/tmp/alt hash-object -w --stdin >/dev/null
echo /tmp/alt/objects > .git/objects/info/alternates
$G repack -a -d -l -q
$G worktree add -q /tmp/wt v-fix
$G cat-file --batch-all-objects --batch | grep -c '{SECRET}-alternate'
"""

#: What the agent's shell could try; prints every hit of the secret.
HUNT = f"""
cd "${{WORKDIR:-/workspace}}"
G="git -c safe.directory=*"
{{
  $G log --all --format='%H %s %b %N' -p
  $G log --walk-reflogs --all 2>/dev/null
  $G stash list; $G tag; $G remote -v; $G for-each-ref; $G worktree list
  $G fsck --lost-found --unreachable --dangling 2>&1
  cat .git/lost-found/*/* 2>/dev/null
  $G cat-file --batch-all-objects --batch
  grep -ra '{SECRET}' .git
  cat .git/objects/info/alternates 2>/dev/null
  grep -ra '{SECRET}' /tmp/wt 2>/dev/null
}} | grep -a '{SECRET}' || echo CLEAN
"""


def _plant(repo: Path) -> str:
    repo.mkdir()
    env = {**os.environ, **GIT_ENV}
    subprocess.run(["sh", "-c", PLANT], cwd=repo, env=env, check=True, capture_output=True)
    listed = subprocess.run(
        ["git", "log", "--all", "--format=%B", "-p"], cwd=repo, env=env, capture_output=True
    )
    assert SECRET.encode() in listed.stdout  # the plant is reachable before the scrub
    return subprocess.run(
        ["git", "rev-parse", "main"], cwd=repo, env=env, capture_output=True, text=True
    ).stdout.strip()


@pytest.mark.parametrize("shape", ["head", "base_commit"])
async def test_the_agent_cannot_read_the_future_out_of_git(tmp_path, shape):
    """Attack: ``git log --all``, fsck's lost-found, ``cat-file --batch-all-objects``,
    grep over ``.git`` and an alternate store, as the agent and as root. Bound: none of
    them prints the secret after prepare; HEAD is the base (a task with no base commit,
    and one whose base commit is named while HEAD is detached there), and the agent's
    change is still in the diff."""
    base = _plant(tmp_path / "repo")
    async with LocalSandbox(repo=str(tmp_path / "repo")) as box:
        if shape == "base_commit":
            detach = "git -c safe.directory=* checkout -q --detach main"
            assert (await box.exec(detach, user="root", workdir="/workspace")).exit_code == 0
        planted = await box.exec(ALTERNATE, user="root")
        assert planted.exit_code == 0 and planted.stdout.strip() == "1", planted.stderr
        task = Task(instance_id="hist-1", problem_statement="Make VALUE 2.")
        baseline = await prepare_workspace(
            box, task, base_commit=base if shape == "base_commit" else None
        )
        for user in ("agent", "root"):
            hunt = await box.exec(HUNT, user=user, timeout=60)
            assert hunt.stdout.strip() == "CLEAN", (user, hunt.stdout[-2000:])
        state = await box.exec(
            "git rev-parse HEAD && git status --porcelain && git fsck --full 2>&1 | wc -l",
            user="agent",
            workdir="/workspace",
        )
        head, *status, fsck_lines = state.stdout.split()
        assert head == base
        assert status == ["??", "PROBLEM_STATEMENT.md"]
        assert fsck_lines == "0"  # nothing dangling, nothing missing
        edit = "sed -i 's/1/2/' mod.py && git -c user.name=a -c user.email=a@b commit -qam mine"
        edited = await box.exec(edit, user="agent", workdir="/workspace")
        assert edited.exit_code == 0, edited.stderr
        diff = await capture_diff(box, "/workspace", baseline, ("PROBLEM_STATEMENT.md",))
        assert "-VALUE = 1\n+VALUE = 2" in diff and SECRET not in diff


async def test_the_future_is_cut_through_the_e2b_path(tmp_path, agentrl_e2b_options):
    """Attack: the same hunt in an E2B sandbox (the E2B double: the real SDK, commands run
    on this host). Bound: after ``scrub_history`` over the SDK's exec, nothing prints the
    secret and HEAD is the base."""
    repo = tmp_path / "repo"
    base = _plant(repo)
    async with E2BSandbox("registry/task:1", **agentrl_e2b_options) as box:
        await scrub_history(box, str(repo), instance_id="hist-e2b")
        hunt = await box.exec(HUNT, env={"WORKDIR": str(repo)}, timeout=60)
        assert hunt.stdout.strip() == "CLEAN", hunt.stdout[-2000:]
        head = await box.exec(f"git -C {repo} rev-parse HEAD", timeout=60)
        assert head.stdout.strip() == base
        assert not (tmp_path / "host-wt").exists()
