"""The agent's workspace: prepare it before a run, and read back what the agent changed.

Preparing snapshots the workspace as the agent receives it (after the task's
``pre_commands``) twice: as a commit in the repository itself, built through a private
index and pinned by ``refs/agentrl/baseline`` (so the agent finds a sane repository, its
index, HEAD and branches untouched), and into the private baseline store of
:mod:`agentrl.harnesses.baseline`, out of the agent's reach. The diff is taken from the
store alone, as the agent user, with a fixed git configuration, once every process of
the agent is killed: every file the agent created, changed or deleted, binary files,
modes and symlinks included (an agent that commits, stages, rewrites or deletes its
``.git`` changes nothing about it), minus the problem statement, harness files and tool
caches.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Sequence

from agentrl.harnesses.base import HarnessError, give_to_user
from agentrl.harnesses.baseline import (
    CAPTURE_EXITS,
    SCRATCH_PREFIX,
    capture_script,
    kill_script,
    store_script,
)
from agentrl.harnesses.history import ROOT_GIT, scrub_history
from agentrl.sandboxes.base import Sandbox, max_output_bytes
from agentrl.types import ExecResult, Task

__all__ = ["BASELINE_REF", "capture_diff", "ensure_user", "prepare_workspace"]

logger = logging.getLogger(__name__)

BASELINE_REF = "refs/agentrl/baseline"
_STATE = "/tmp/agentrl-workspace"
#: Git as root in a workspace the agent controlled: its hooks and fsmonitor never run.
_GIT = f"{ROOT_GIT} -c core.autocrlf=false -c core.quotepath=false"


def _git_env() -> dict[str, str]:
    return {
        "GIT_INDEX_FILE": f"{_STATE}/index",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "agentrl",
        "GIT_AUTHOR_EMAIL": "agentrl@localhost",
        "GIT_COMMITTER_NAME": "agentrl",
        "GIT_COMMITTER_EMAIL": "agentrl@localhost",
        "HOME": _STATE,
    }


def _pathspec(excludes: Sequence[str]) -> str:
    specs = ["."] + [f":(exclude){p}" for p in excludes if p]
    return " ".join(shlex.quote(s) for s in specs)


def _snapshot_script(excludes: Sequence[str], ignore: Sequence[str]) -> str:
    """Shell that refreshes the private index from the working tree (git root = cwd)."""
    patterns = "\n".join(ignore)
    return (
        f"mkdir -p {_STATE} && printf '%s\\n' {shlex.quote(patterns)} > {_STATE}/ignore && "
        f"{_GIT} -c core.excludesFile={_STATE}/ignore add -A -- {_pathspec(excludes)}"
    )


async def prepare_workspace(
    sandbox: Sandbox,
    task: Task,
    *,
    user: str = "agent",
    problem_file: str = "PROBLEM_STATEMENT.md",
    timeout: float = 600.0,
    ignore: Sequence[str] = (),
    run_pre_commands: bool = True,
    base_commit: str | None = None,
    keep_history: bool = False,
) -> str:
    """Run ``task.pre_commands``, cut the repository's future, snapshot the baseline,
    write the problem statement.

    Returns the baseline: the id of the workspace's tree in the private store, what
    :func:`capture_diff` takes. Before the snapshot the repository keeps only the
    history reachable from ``base_commit`` (the task's base; ``None``: HEAD), see
    :func:`~agentrl.harnesses.history.scrub_history`; ``keep_history=True`` skips that.
    The workdir (``.git`` included) is handed to ``user`` (created first when the image
    has no such account); the store, built after that as root, stays root's.
    Raises ``HarnessError`` when a pre-command fails or git is missing. A rollout passes
    ``run_pre_commands=False``: there the grader's ``prepare`` runs them, as it does
    before grading.
    """
    workdir = shlex.quote(task.workdir)
    problem_path = f"{task.workdir.rstrip('/')}/{problem_file}"
    pre_commands = task.pre_commands if run_pre_commands else ()
    if not pre_commands:
        # Its write creates the workdir; nothing that runs before the snapshot (which
        # leaves it out) touches the working tree.
        await sandbox.write_file(problem_path, task.problem_statement)
    else:
        made = await sandbox.exec(f"mkdir -p {workdir}", user="root", timeout=60)
        if made.exit_code != 0:
            raise HarnessError(f"cannot create the workdir {task.workdir}: {made.stderr.strip()}")
    for number, command in enumerate(pre_commands, start=1):
        result = await sandbox.exec(command, user="root", workdir=task.workdir, timeout=timeout)
        if result.exit_code != 0:
            raise HarnessError(
                f"pre_command {number}/{len(task.pre_commands)} of task {task.instance_id} "
                f"exited with code {result.exit_code}: {command[:200]!r}: "
                f"{(result.stderr or result.stdout).strip()[-800:]}"
            )
    if not keep_history:
        await scrub_history(
            sandbox,
            task.workdir,
            base_commit=base_commit,
            timeout=timeout,
            instance_id=task.instance_id,
        )
    script = (
        "set -e\n"
        f"cd {workdir}\n"
        "command -v git >/dev/null || { echo 'git is not installed in the sandbox' >&2; exit 3; }\n"
        f"{_GIT} rev-parse --is-inside-work-tree >/dev/null 2>&1 || {_GIT} init -q\n"
        f'cd "$({_GIT} rev-parse --show-toplevel)"\n'
        f"mkdir -p {_STATE} && rm -f {_STATE}/index\n"
        f"if {_GIT} rev-parse -q --verify HEAD >/dev/null; then {_GIT} read-tree HEAD; fi\n"
        f"{_snapshot_script((problem_file,), ignore)}\n"
        f"tree=$({_GIT} write-tree)\n"
        f"commit=$(echo 'agentrl baseline' | {_GIT} commit-tree \"$tree\")\n"
        f'{_GIT} update-ref {BASELINE_REF} "$commit"\n'
        # The agent's account, in the same exec (its output kept off stdout).
        + ("" if user == "root" else _user_script(user))
        + 'echo "$commit"\n'
    )
    result = await sandbox.exec(script, user="root", env=_git_env(), timeout=timeout)
    if result.exit_code == _USER_FAILED:
        raise _no_user(user, result)
    commit = result.stdout.strip().splitlines()[-1:] if result.exit_code == 0 else []
    if not commit:
        raise HarnessError(
            f"could not snapshot the workspace {task.workdir} with git "
            f"(exit {result.exit_code}): {(result.stderr or result.stdout).strip()[-800:]}"
        )
    if pre_commands:
        await sandbox.write_file(problem_path, task.problem_statement)
    await give_to_user(sandbox, user, [task.workdir])
    # After the hand-over: the store's index then holds the files' final owner and ctime,
    # so the capture rehashes only what the agent touched.
    stored = await sandbox.exec(
        store_script(task.workdir, _GIT, problem_file, ignore),
        user="root",
        env={"GIT_CONFIG_NOSYSTEM": "1", "HOME": _STATE},
        timeout=timeout,
    )
    tree = stored.stdout.strip().splitlines()[-1:] if stored.exit_code == 0 else []
    if not tree or not _is_object_id(tree[0]):
        raise HarnessError(
            f"could not build the private baseline of {task.workdir} "
            f"(exit {stored.exit_code}): {(stored.stderr or stored.stdout).strip()[-800:]}"
        )
    return tree[0]


def _is_object_id(value: str) -> bool:
    return len(value) in (40, 64) and all(c in "0123456789abcdef" for c in value)


#: Exit code of a script whose ``_user_script`` could not create the user.
_USER_FAILED = 85


def _user_script(user: str) -> str:
    """POSIX sh that creates ``user`` unless it exists, or exits ``_USER_FAILED``; it
    prints nothing on stdout."""
    q = shlex.quote(user)
    return (
        f"if ! id -u {q} >/dev/null 2>&1; then\n"
        f"  useradd -m -s /bin/sh {q} 2>/dev/null || adduser -D {q} 2>/dev/null || "
        f"adduser --disabled-password --gecos '' {q} >&2 || true\n"
        f"  id -u {q} >/dev/null || exit {_USER_FAILED}\n"
        "fi\n"
    )


def _no_user(user: str, result: ExecResult) -> HarnessError:
    return HarnessError(
        f"the sandbox has no user {user!r} and creating it failed "
        f"({(result.stderr or result.stdout).strip()[-300:]}); add the user to the "
        "image, or run the agent as root (RolloutConfig(agent_user='root'))"
    )


async def ensure_user(sandbox: Sandbox, user: str) -> None:
    """Create the unprivileged ``user`` when the sandbox's image has no such account."""
    if user == "root":
        return
    result = await sandbox.exec(_user_script(user), user="root", timeout=60)
    if result.exit_code != 0:
        raise _no_user(user, result)


async def capture_diff(
    sandbox: Sandbox,
    workdir: str,
    baseline: str,
    excludes: Sequence[str],
    ignore: Sequence[str] = (),
    *,
    user: str = "agent",
    timeout: float = 300.0,
    max_bytes: int | None = None,
) -> str:
    """The agent's changes since ``baseline`` as a binary-safe git diff (new files included).

    ``baseline`` is what :func:`prepare_workspace` returned for ``workdir``; ``excludes``
    are repository-relative paths left out (problem statement, harness files);
    ``ignore`` are gitignore patterns for untracked files (tool caches). First, as root,
    every process of ``user`` still in the sandbox is killed and a scratch directory
    made for it; then the diff is taken as ``user`` against the private store (see
    :mod:`agentrl.harnesses.baseline`). With ``user="root"`` there is nothing to protect
    (the agent was root): nothing is killed and the capture runs as root.

    Raises ``HarnessError`` when there is no diff to take — the workdir is gone or
    unenterable, the store is gone (only root, or in the ``local`` backend the agent,
    can remove it), the disk is full — and when the diff is larger than ``max_bytes``
    (default: the sandbox output cap, ``AGENTRL_SANDBOX_MAX_OUTPUT_BYTES``) or comes back
    shorter than it is: a cut diff is never returned as if it were whole.
    """
    if not _is_object_id(baseline):
        raise HarnessError(f"the baseline {baseline!r} is not a tree id from prepare_workspace")
    limit = max_output_bytes(max_bytes)
    # Both run in "/": the agent can make the workdir (the default directory) unenterable.
    made = await sandbox.exec(kill_script(user), user="root", timeout=120, workdir="/")
    scratch = made.stdout.strip().splitlines()[-1:] if made.exit_code == 0 else []
    if not scratch or not scratch[0].startswith(SCRATCH_PREFIX):
        raise HarnessError(_no_diff(workdir, made, "could not stop the agent's processes"))
    script = capture_script(workdir, scratch[0], baseline, excludes, ignore)
    result = await sandbox.exec(script, user=user, timeout=timeout, workdir="/")
    size = result.stdout.strip().splitlines()[-1:] if result.exit_code == 0 else []
    if not size or not size[0].isdigit():
        raise HarnessError(_no_diff(workdir, result, "could not read the agent's diff"))
    expected = int(size[0])
    if expected > limit:
        raise HarnessError(
            f"the agent's diff is {expected} bytes, over the cap of {limit} "
            "(AGENTRL_SANDBOX_MAX_OUTPUT_BYTES); it is not graded"
        )
    if expected == 0:
        return ""
    # Read as a file: exec output is capped, and a cut diff would not apply.
    data = bytes(await sandbox.read_file(f"{scratch[0]}/agent.diff", user=user, text=False))
    if len(data) != expected:
        raise HarnessError(
            f"the agent's diff came back with {len(data)} of its {expected} bytes; "
            "a cut diff is not graded"
        )
    return data.decode("utf-8", errors="surrogateescape")


def _no_diff(workdir: str, result: ExecResult, what: str) -> str:
    if result.exit_code in CAPTURE_EXITS:
        return f"no diff to take in {workdir}: {CAPTURE_EXITS[result.exit_code]}"
    return (
        f"{what} in {workdir} (exit {result.exit_code}): "
        f"{(result.stderr or result.stdout).strip()[-800:]}"
    )
