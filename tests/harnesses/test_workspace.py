"""How many execs preparing a workspace and taking its diff cost, and what they leave."""

from __future__ import annotations

import pytest

from agentrl.harnesses.base import HarnessError
from agentrl.harnesses.workspace import capture_diff, prepare_workspace
from agentrl.sandboxes.base import ExecRequest
from agentrl.sandboxes.local import LocalSandbox
from agentrl.types import ExecResult, Task


@pytest.fixture
async def counted(tmp_path):
    """A started local sandbox (a one-file repository at /workspace) that records each
    command it runs."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "mod.py").write_text("VALUE = 1\n")
    async with LocalSandbox(repo=str(repo)) as box:
        box.calls = []
        run_exec = box.run_exec

        async def recording(request: ExecRequest) -> ExecResult:
            box.calls.append(request.cmd)
            return await run_exec(request)

        box.run_exec = recording
        yield box


async def test_a_workdir_that_does_not_exist_is_made_by_the_statement_write(counted):
    """Without pre-commands no `mkdir` exec runs: writing the problem statement makes the
    workdir; the agent's account is checked in the snapshot's exec, the private store is
    built in one more after the hand-over (six execs in all)."""
    task = Task(instance_id="t-new", problem_statement="Do it.", workdir="/tmp/new/ws")
    baseline = await prepare_workspace(counted, task)
    assert len(counted.calls) == 6
    assert not any(cmd.startswith("mkdir -p /tmp/new/ws") for cmd in counted.calls)
    assert sum("useradd" in cmd for cmd in counted.calls) == 1
    assert sum("commit-tree" in cmd for cmd in counted.calls) == 1
    assert sum("pack-objects" in cmd for cmd in counted.calls) == 1
    statement = await counted.read_file("/tmp/new/ws/PROBLEM_STATEMENT.md", user="agent")
    assert statement == "Do it."
    assert await capture_diff(counted, "/tmp/new/ws", baseline, ("PROBLEM_STATEMENT.md",)) == ""


async def test_pre_commands_still_run_in_a_made_workdir_before_the_statement(counted):
    """With pre-commands the workdir is made first and the statement written after them,
    so a pre-command that cleans the tree cannot remove it."""
    task = Task(
        instance_id="t-pre",
        problem_statement="Do it.",
        workdir="/tmp/pre",
        pre_commands=("rm -f /tmp/pre/PROBLEM_STATEMENT.md; echo built > build.log",),
    )
    await prepare_workspace(counted, task)
    assert counted.calls[0] == "mkdir -p /tmp/pre"
    assert (await counted.read_file("/tmp/pre/PROBLEM_STATEMENT.md")) == "Do it."
    assert (await counted.read_file("/tmp/pre/build.log")) == "built\n"


async def test_an_empty_diff_is_not_read_back(counted):
    """A diff of 0 bytes is "" at once: no read of the diff file follows the capture (one
    exec as root that stops the agent's processes, one as the agent that takes the diff)."""
    task = Task(instance_id="t-empty", problem_statement="x")
    baseline = await prepare_workspace(counted, task)
    counted.calls.clear()
    assert await capture_diff(counted, "/workspace", baseline, ("PROBLEM_STATEMENT.md",)) == ""
    assert len(counted.calls) == 2
    await counted.exec("echo 'VALUE = 2' > /workspace/mod.py", user="agent")
    counted.calls.clear()
    diff = await capture_diff(counted, "/workspace", baseline, ("PROBLEM_STATEMENT.md",))
    assert "+VALUE = 2" in diff
    assert len(counted.calls) == 3


async def test_an_agent_account_that_cannot_be_made_fails_the_snapshot_clearly(counted):
    """A user the image lacks and cannot create (the local root is read-only) fails the
    preparation with the message that names both fixes."""
    task = Task(instance_id="t-user", problem_statement="x")
    with pytest.raises(HarnessError, match=r"(?s)no user 'builder'.*agent_user='root'"):
        await prepare_workspace(counted, task, user="builder")
