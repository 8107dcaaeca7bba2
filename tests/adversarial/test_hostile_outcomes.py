"""A hostile policy cannot dodge its reward, and infrastructure failures never train.

Each test runs the real Claude Code CLI in the real local sandbox against the scripted
engine (its replies are what a Qwen3 policy would sample, in the ``hermes`` format); the
policy's Bash tool call is the attack. The rule under test (docs/rollouts.md, "Whose
failure is it"): once a turn of the policy was recorded, whatever happens to the sandbox,
its processes and its workspace is the policy's doing — a trainable outcome with reward 0
— unless there is evidence the policy cannot forge that infrastructure failed.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from rollout_support import CLI_DIR, SANDBOX_PORT, claude_solution, textstats_task, tool_call

from agentrl.graders.scaleswe import ScaleSWEGrader
from agentrl.harnesses.claude_code import ClaudeCodeHarness
from agentrl.harnesses.errors import HarnessError
from agentrl.harnesses.workspace import capture_diff, prepare_workspace
from agentrl.rollout import RolloutConfig, RolloutResult, run_rollout
from agentrl.rollout import phases as phases_module
from agentrl.rollout.runner import ROLLOUTS_FILE, Runner
from agentrl.sandboxes.local import LocalSandbox, processes_in_namespace
from agentrl.testing.scripted_engine import ScriptedReply
from agentrl.types import Outcome, Task

pytestmark = pytest.mark.slow

TASKS = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "scaleswe.jsonl"
#: The agent's time budget: every attack below ends its rollout well within it.
BUDGET = 30


@pytest.fixture(scope="module")
def task():
    """The textstats example task (eval_cmd grading), parsed by the scaleswe grader."""
    return textstats_task()


@pytest.fixture
def middleware(agentrl_middleware):
    """The shipped middleware fixture: TCP and a unix socket, in front of the scripted engine."""
    return agentrl_middleware


class Sandboxes:
    """A local-sandbox factory (the installed CLIs bound in) that remembers what it built."""

    def __init__(self, middleware, cls=LocalSandbox, **options) -> None:
        if not (CLI_DIR / "bin" / "claude").exists():
            pytest.fail(f"the agent CLIs are not installed in {CLI_DIR}; run agentrl install-clis")
        binds, self.cli_path = ClaudeCodeHarness.host_install(CLI_DIR)
        self.cls = cls
        self.options = {
            "services": {SANDBOX_PORT: middleware.unix_path},
            "ro_binds": binds,
            "host_python": True,
            **options,
        }
        self.built: list[LocalSandbox] = []

    def __call__(self, task) -> LocalSandbox:
        self.built.append(self.cls.from_task(task, **self.options))
        return self.built[-1]

    def harness(self) -> ClaudeCodeHarness:
        return ClaudeCodeHarness(
            cli_path=self.cli_path, extra_args=(), extra_env={"CLAUDE_CODE_MAX_RETRIES": "0"}
        )


def config(**overrides) -> RolloutConfig:
    values = {"agent_time_budget": BUDGET, "eval_timeout": 60, "middleware_port": SANDBOX_PORT}
    return RolloutConfig(**{**values, **overrides})


async def rollout(task, sandboxes, middleware, **kwargs) -> RolloutResult:
    return await run_rollout(
        task,
        harness=sandboxes.harness(),
        grader=ScaleSWEGrader(),
        sandbox_factory=sandboxes,
        middleware=middleware,
        config=kwargs.pop("config", None) or config(),
        **kwargs,
    )


def bash(command: str) -> str:
    return tool_call("Bash", command=command, description="Run a command")


def assert_trains_with_zero_reward(result: RolloutResult, sandboxes: Sandboxes) -> None:
    """The policy's own doing: a trainable outcome, reward 0, its samples kept; cleaned up."""
    assert result.outcome.trainable, (result.outcome, result.error, result.agent_log[-1500:])
    assert result.reward == 0.0 and not result.remove_sample
    assert result.samples and all(s.reward == 0.0 for s in result.samples)
    assert result.timings["total"] < BUDGET + 60
    agent_box = sandboxes.built[0]
    assert agent_box._closed and processes_in_namespace(agent_box.pid_namespace) == []


#: attack -> (the policy's Bash command, the outcome it ends in).
HOSTILE_COMMANDS = {
    # Kills the CLI and the sandbox's init with it: the sandbox is gone mid-run.
    "kill-every-process": ("kill -9 -1", Outcome.AGENT_ERROR),
    # The diff comes from the private baseline, not the repository: still taken (empty).
    "remove-git": ("rm -rf /workspace/.git", Outcome.UNSOLVED),
    # Its cwd unreadable, Claude Code's tools fail and it ends its turn (its exit is seen at
    # once, not left to the budget); the capture makes the agent's own directories
    # enterable again (git keeps no such modes): an empty diff, unsolved.
    "chmod-000-workspace": ("chmod -R 000 .", Outcome.UNSOLVED),
    # Files made readable again by the capture, for the same reason: unsolved.
    "chmod-000-every-file": ("find . -mindepth 1 -depth -exec chmod 000 {} +", Outcome.UNSOLVED),
    # Claude Code refuses ``rm -rf /workspace/*`` and ``cd / && rm -rf /workspace``; a
    # policy finds the spelling it lets through (the mount point itself stays). The diff
    # deletes every file, and is graded: unsolved.
    "delete-workdir-contents": ("find /workspace -mindepth 1 -delete", Outcome.UNSOLVED),
    "delete-workdir": (
        "python3 -c 'import shutil; shutil.rmtree(\"/workspace\")'",
        Outcome.UNSOLVED,
    ),
}


@pytest.mark.parametrize("attack", sorted(HOSTILE_COMMANDS))
async def test_a_policy_that_destroys_its_sandbox_trains_with_reward_zero(
    attack, task, middleware, scripted_engine
):
    """Attack: the policy kills every process it can, removes .git, makes the workspace
    unreadable, or deletes the workdir. Bound: a trainable outcome (agent_error, unsolved
    or timeout) with reward 0 and remove_sample False, within the agent's budget."""
    command, outcome = HOSTILE_COMMANDS[attack]
    sandboxes = Sandboxes(middleware)
    scripted_engine.queue(bash(command))
    scripted_engine.queue("Done.")
    result = await rollout(task, sandboxes, middleware)

    assert result.outcome is outcome, (result.error, result.agent_log[-1500:])
    assert_trains_with_zero_reward(result, sandboxes)


async def test_a_policy_that_fills_the_disk_trains_with_reward_zero(
    task, middleware, scripted_engine
):
    """Attack: the policy writes until ENOSPC in a 64 MiB /tmp (where the diff state, the
    exec markers and the CLI's home live). Bound: trainable, reward 0, within the budget."""
    sandboxes = Sandboxes(middleware, tmp_size_mb=64)
    scripted_engine.queue(bash("dd if=/dev/zero of=/tmp/fill bs=1M; df -h /tmp"))
    scripted_engine.queue("Done.")
    result = await rollout(task, sandboxes, middleware)

    # The CLI cannot write its own state any more and exits 1.
    assert result.outcome is Outcome.AGENT_ERROR, (result.error, result.agent_log[-1500:])
    assert_trains_with_zero_reward(result, sandboxes)


async def test_a_sandbox_killed_after_the_policy_acted_is_an_agent_error(
    task, middleware, scripted_engine, monkeypatch
):
    """Attack: the sandbox dies under the agent (its init killed, as a policy that found a
    way to would). Bound: agent_error with reward 0 that trains, naming the failed step."""

    class DyingSandbox(LocalSandbox):
        async def run_exec(self, request):
            if "agentrl-dies" in request.cmd:
                await self._process.kill()
            return await super().run_exec(request)

    sandboxes = Sandboxes(middleware, cls=DyingSandbox)
    scripted_engine.queue(bash("echo agentrl-dies"))
    scripted_engine.queue("Done.")
    real_run = ClaudeCodeHarness.run

    async def run_then_die(self, sandbox, ctx, prompt, budget):
        code = await real_run(self, sandbox, ctx, prompt, budget)
        await sandbox.exec("echo agentrl-dies")
        return code

    monkeypatch.setattr(ClaudeCodeHarness, "run", run_then_die)
    result = await rollout(task, sandboxes, middleware)

    assert result.outcome is Outcome.AGENT_ERROR, result.error
    assert "after the agent ran" in result.error and "SandboxGoneError" in result.error
    assert_trains_with_zero_reward(result, sandboxes)


async def test_a_sandbox_the_backend_says_it_lost_is_an_infra_error(
    task, middleware, scripted_engine
):
    """The infra side: the same failure, but the backend says (``lost_externally``) it lost
    the sandbox for its own reasons. Bound: infra_error, remove_sample True."""

    class ReapedSandbox(LocalSandbox):
        async def lost_externally(self, error):
            return True

    sandboxes = Sandboxes(middleware, cls=ReapedSandbox)
    # The local sandbox's agent shares root's host uid: it can lock the private baseline.
    scripted_engine.queue(bash("chmod 000 /tmp/agentrl-baseline"))
    scripted_engine.queue("Done.")
    result = await rollout(task, sandboxes, middleware)

    assert result.outcome is Outcome.INFRA_ERROR and result.remove_sample, result.error
    assert "the backend lost the sandbox" in result.error and result.reward == 0.0


async def test_an_engine_that_is_down_is_an_infra_error(task, middleware, scripted_engine):
    """The infra side: every generate call fails (the engine is down). Bound: infra_error,
    remove_sample True, no samples trained."""
    scripted_engine.responder = lambda body, headers: ScriptedReply(status=503, error="down")
    sandboxes = Sandboxes(middleware)
    result = await rollout(task, sandboxes, middleware)

    assert result.outcome is Outcome.INFRA_ERROR and result.remove_sample, result.error
    assert result.reward == 0.0 and result.turns == 0


async def test_a_middleware_failing_turns_after_the_policy_acted_is_an_infra_error(
    task, middleware, scripted_engine
):
    """The infra side: the policy removes .git, then the engine fails its next turn. The
    failed turn is evidence the policy cannot forge. Bound: infra_error, remove_sample."""
    scripted_engine.queue(bash("rm -rf /workspace/.git"))
    scripted_engine.fail_next(500, "CUDA error: an illegal memory access was encountered")
    sandboxes = Sandboxes(middleware)
    result = await rollout(task, sandboxes, middleware)

    assert result.outcome is Outcome.INFRA_ERROR and result.remove_sample, result.error
    assert "failed in the middleware or engine" in result.error


async def test_a_sandbox_that_never_boots_is_an_infra_error(task, middleware, scripted_engine):
    """The infra side: every boot fails. Bound: infra_error, remove_sample True."""
    sandboxes = Sandboxes(middleware, bwrap="/nonexistent/bwrap")
    result = await rollout(task, sandboxes, middleware, config=config(boot_backoff=0.01))

    assert result.outcome is Outcome.INFRA_ERROR and result.remove_sample, result.error
    assert not scripted_engine.generate_requests


async def test_a_bug_in_our_code_is_an_infra_error_with_its_traceback(
    task, middleware, scripted_engine, monkeypatch
):
    """The infra side: our diff code raises a TypeError (a bug) after the policy acted.
    Bound: infra_error, remove_sample True, the traceback in the agent log."""

    async def buggy_capture(*args, **kwargs):
        raise TypeError("capture_diff() got confused")

    monkeypatch.setattr(phases_module, "capture_diff", buggy_capture)
    scripted_engine.queue(bash("true"))
    scripted_engine.queue("Done.")
    sandboxes = Sandboxes(middleware)
    result = await rollout(task, sandboxes, middleware)

    assert result.outcome is Outcome.INFRA_ERROR and result.remove_sample, result.error
    assert result.error.startswith("internal error: could not capture the diff: TypeError")
    assert "[agentrl: internal error]" in result.agent_log
    assert "buggy_capture" in result.agent_log and "Traceback" in result.agent_log


def committed_rows(out: Path) -> dict[int, dict]:
    """The rows of ``out/rollouts.jsonl`` by sample index, each with its agent log read."""
    rows = {}
    for line in (out / ROLLOUTS_FILE).read_text().splitlines():
        row = json.loads(line)
        row["agent_log"] = Path(row["agent_log_path"]).read_text()
        rows[row["sample_index"]] = row
    return rows


async def test_a_batch_commits_every_rollout_when_one_is_dropped_and_one_raises(
    task, middleware, scripted_engine, monkeypatch, tmp_path
):
    """Robustness: a batch of 4 — one solves, one has its session dropped mid-run, one
    raises from a patched phase, one rollout_fn raises outright. Bound: run_rollout never
    raises, and all 4 lines are committed to rollouts.jsonl with the failures as
    infra_error (their tracebacks in their agent logs)."""
    sandboxes = Sandboxes(middleware)
    for reply in claude_solution():
        scripted_engine.queue(reply, session="job-0")
    scripted_engine.queue(bash("sleep 4"), session="job-1")
    scripted_engine.queue("Done.", session="job-1")
    scripted_engine.queue("Nothing to do.", session="job-2")
    real_grade = phases_module.Phases._grade

    async def grade_or_raise(self):
        if self.state.sid == "job-2":
            raise RuntimeError("a patched phase fell over")
        return await real_grade(self)

    monkeypatch.setattr(phases_module.Phases, "_grade", grade_or_raise)

    async def rollout_fn(task, index):
        if index == 3:
            raise ValueError("the rollout function itself is broken")
        return await rollout(task, sandboxes, middleware, session_id=f"job-{index}")

    async def drop_mid_run():
        served = scripted_engine.served
        await scripted_engine.wait_for(lambda: any(s.routing_key == "job-1" for s in served), 120)
        await middleware.drop_session("job-1")

    runner = Runner(rollout_fn, tmp_path, concurrency=4)
    dropper = asyncio.create_task(drop_mid_run())
    summary = await runner.run(runner.plan([task], 4))
    await dropper

    rows = committed_rows(tmp_path)
    assert sorted(rows) == [0, 1, 2, 3] and summary.done == 4
    assert rows[0]["outcome"] == "solved"
    for index in (1, 2, 3):
        assert rows[index]["outcome"] == "infra_error" and rows[index]["remove_sample"]
    assert "a patched phase fell over" in rows[2]["error"]
    assert "the rollout function itself is broken" in rows[3]["error"]
    for index in (2, 3):
        log = rows[index]["agent_log"]
        assert "[agentrl: internal error]" in log and "Traceback" in log


@pytest.fixture
async def workspace(tmp_path):
    """A started local sandbox with a small repository at /workspace and its baseline."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "mod.py").write_text("VALUE = 1\n")
    async with LocalSandbox(repo=str(repo)) as box:
        task = Task(instance_id="t-diff", problem_statement="Make VALUE 2.")
        yield box, await prepare_workspace(box, task)


async def test_a_diff_over_the_cap_is_refused_not_cut(workspace):
    """Attack: the policy writes a diff larger than the output cap (so a cut one might be
    graded as if whole). Bound: capture_diff raises HarnessError naming the cap; it never
    returns a diff it did not read in full."""
    box, baseline = workspace
    blob = "head -c 300000 /dev/urandom | base64 > /workspace/big.txt"
    assert (await box.exec(blob, user="agent")).exit_code == 0
    excludes = ("PROBLEM_STATEMENT.md",)
    with pytest.raises(HarnessError, match=r"over the cap of 65536"):
        await capture_diff(box, "/workspace", baseline, excludes, max_bytes=65536)
    assert (await box.exec("rm /workspace/big.txt", user="agent")).exit_code == 0
    assert await capture_diff(box, "/workspace", baseline, excludes, max_bytes=65536) == ""


async def test_a_diff_read_back_short_is_refused(workspace, monkeypatch):
    """Attack: the diff file shrinks (or the backend caps the read) between its size and
    its read. Bound: HarnessError, never a shorter diff."""
    box, baseline = workspace
    assert (await box.exec("echo 'VALUE = 2' > /workspace/mod.py", user="agent")).exit_code == 0
    real_read = LocalSandbox.read_file

    async def short_read(self, path, **kwargs):
        return (await real_read(self, path, **kwargs))[:-10]

    monkeypatch.setattr(LocalSandbox, "read_file", short_read)
    with pytest.raises(HarnessError, match=r"came back with \d+ of its \d+ bytes"):
        await capture_diff(box, "/workspace", baseline, ())


async def test_git_hooks_and_fsmonitor_the_agent_planted_do_not_run_as_root(workspace):
    """Attack: the policy sets core.fsmonitor and a pre-commit-style hook in .git/config so
    that the root-run diff capture executes its command. Bound: the marker file is never
    written; the diff is taken."""
    box, baseline = workspace
    plant = (
        "cd /workspace && git config core.fsmonitor 'touch /tmp/pwned-fsmonitor; false' && "
        "mkdir -p .git/hooks && printf '#!/bin/sh\\ntouch /tmp/pwned-hook\\n' > .git/hooks/post-index-change && "
        "chmod +x .git/hooks/post-index-change && echo 'VALUE = 2' > mod.py"
    )
    assert (await box.exec(plant, user="agent")).exit_code == 0, "could not plant"
    diff = await capture_diff(box, "/workspace", baseline, ())
    assert "+VALUE = 2" in diff
    assert (await box.exec("ls /tmp/pwned-fsmonitor /tmp/pwned-hook", user="root")).exit_code != 0
