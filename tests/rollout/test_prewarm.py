"""The grading sandbox booted while the agent runs (``Sandbox.prewarm_grading``).

Real rollouts (Claude Code, the local sandbox, the scaleswe grader on the textstats
example task, the scripted engine): what is checked is when each sandbox started, when it
ran its first command and that every one was closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from rollout_support import CLI_DIR, CORE, SANDBOX_PORT, claude_solution, textstats_task, tool_call

from agentrl.graders.scaleswe import ScaleSWEGrader
from agentrl.harnesses.claude_code import ClaudeCodeHarness
from agentrl.retry import RetryPolicy
from agentrl.rollout import RolloutConfig, run_rollout
from agentrl.sandboxes.base import Sandbox, SandboxError
from agentrl.sandboxes.boot import Booter, PrewarmedBooter
from agentrl.sandboxes.local import LocalSandbox
from agentrl.types import ExecResult, Outcome, Task


class Watched(LocalSandbox):
    """A local sandbox that notes when its start ended, its first command and its close."""

    started_at: float | None = None
    first_exec_at: float | None = None
    closed_at: float | None = None

    async def start(self) -> None:
        await super().start()
        self.started_at = time.monotonic()

    async def run_exec(self, request):
        if self.first_exec_at is None:
            self.first_exec_at = time.monotonic()
        return await super().run_exec(request)

    async def aclose(self) -> None:
        await super().aclose()
        self.closed_at = self.closed_at or time.monotonic()


class NotPrewarmed(Watched):
    prewarm_grading = False


async def _rollout(middleware, cls: type[Watched]):
    if not (CLI_DIR / "bin" / "claude").exists():
        pytest.fail(f"Claude Code is not installed in {CLI_DIR}; run `agentrl install-clis`")
    binds, cli = ClaudeCodeHarness.host_install(CLI_DIR)
    options = {
        "services": {SANDBOX_PORT: middleware.unix_path},
        "ro_binds": binds,
        "host_python": True,
    }
    built: list[Watched] = []

    def factory(task):
        sandbox = cls.from_task(task, **options)
        built.append(sandbox)
        return sandbox

    result = await run_rollout(
        textstats_task(),
        harness=ClaudeCodeHarness(cli_path=cli, extra_args=(), extra_env={}),
        grader=ScaleSWEGrader(),
        sandbox_factory=factory,
        middleware=middleware,
        config=RolloutConfig(agent_time_budget=180, eval_timeout=120, middleware_port=SANDBOX_PORT),
    )
    return result, built


async def test_the_grading_sandbox_boots_while_the_agent_runs_and_is_untouched_until_grading(
    agentrl_middleware, scripted_engine
):
    """Prewarm: the grading sandbox was started before the agent's sandbox closed, yet ran
    its first command only after the agent's sandbox was gone (the grader's), and both are
    closed; the rollout still solves the task."""
    for reply in claude_solution():
        scripted_engine.queue(reply)
    result, built = await _rollout(agentrl_middleware, Watched)

    assert result.outcome is Outcome.SOLVED, result.error
    agent, grading = built
    assert grading.started_at is not None and agent.closed_at is not None
    assert grading.started_at < agent.closed_at
    assert grading.first_exec_at is not None and grading.first_exec_at > agent.closed_at
    assert agent._closed and grading._closed


async def test_a_backend_that_does_not_prewarm_boots_the_grader_after_the_agent(
    agentrl_middleware, scripted_engine
):
    """Without ``prewarm_grading`` the grading sandbox starts only once the agent's closed."""
    for reply in claude_solution():
        scripted_engine.queue(reply)
    result, built = await _rollout(agentrl_middleware, NotPrewarmed)

    assert result.outcome is Outcome.SOLVED, result.error
    agent, grading = built
    assert grading.started_at is not None and agent.closed_at is not None
    assert grading.started_at > agent.closed_at
    assert agent._closed and grading._closed


async def test_an_unused_prewarmed_sandbox_is_closed_without_running_anything(
    agentrl_middleware, scripted_engine
):
    """An empty diff is not graded: the prewarmed sandbox never ran a command and is closed."""
    scripted_engine.queue(tool_call("Read", file_path=CORE))
    scripted_engine.queue("I could not find the problem.")
    result, built = await _rollout(agentrl_middleware, Watched)

    assert result.outcome is Outcome.UNSOLVED, result.error
    assert len(built) == 2
    agent, grading = built
    assert grading.first_exec_at is None
    assert agent._closed and grading._closed
    assert grading._process is None or grading._process.exited


# -- PrewarmedBooter, with a sandbox double ---------------------------------------------------


class Double(Sandbox):
    """A sandbox double: ``start`` fails when told to; records its close."""

    name = "double"

    def __init__(self, fail: bool = False) -> None:
        self.fail, self.closed = fail, False

    @classmethod
    def from_task(cls, task, **options):
        return cls()

    async def start(self) -> None:
        await asyncio.sleep(0)
        if self.fail:
            raise SandboxError("scripted boot failure")

    async def aclose(self) -> None:
        self.closed = True

    async def run_exec(self, request):
        return ExecResult(exit_code=0, stdout="", stderr="")

    async def write_file(self, path, content, *, user="root"):
        raise NotImplementedError

    async def read_file(self, path, *, user="root", text=True):
        raise NotImplementedError

    def url_for(self, host, port):
        raise NotImplementedError


ONE_TRY = RetryPolicy(attempts=1, base=0.001, cap=0.002)
TASK = Task(instance_id="t-1", problem_statement="")


async def test_the_prewarmed_sandbox_is_handed_out_once_then_boots_are_ordinary():
    """The first boot returns the prewarmed sandbox itself; the second builds a new one."""
    made: list[Double] = []

    def factory(task):
        made.append(Double())
        return made[-1]

    booter = Booter(policy=ONE_TRY)
    prewarm = asyncio.ensure_future(booter.boot(factory, TASK))
    grading = PrewarmedBooter(policy=ONE_TRY, prewarm=prewarm)
    first = await grading.boot(factory, TASK)
    second = await grading.boot(factory, TASK)
    assert first is made[0] and second is made[1] and len(made) == 2
    assert grading.prewarm is None


async def test_a_prewarm_that_failed_to_boot_is_replaced_by_an_ordinary_boot():
    """A prewarm whose every attempt failed costs nothing but the boot: a new one is made."""
    made: list[Double] = []

    def factory(task):
        made.append(Double(fail=not made))
        return made[-1]

    booter = Booter(policy=ONE_TRY)
    prewarm = asyncio.ensure_future(booter.boot(factory, TASK))
    sandbox = await PrewarmedBooter(policy=ONE_TRY, prewarm=prewarm).boot(factory, TASK)
    assert sandbox is made[1] and made[0].closed and not sandbox.closed


async def test_a_grade_cancelled_while_the_prewarm_boots_gives_it_back():
    """Cancelled while waiting for the prewarm, the booter keeps it for the rollout's cleanup."""
    gate = asyncio.Event()

    class Slow(Double):
        async def start(self) -> None:
            await gate.wait()

    booter = Booter(policy=ONE_TRY)
    prewarm = asyncio.ensure_future(booter.boot(lambda task: Slow(), TASK))
    grading = PrewarmedBooter(policy=ONE_TRY, prewarm=prewarm)
    waiting = asyncio.ensure_future(grading.boot(Double.from_task, TASK))
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert grading.prewarm is prewarm and not prewarm.done()
    prewarm.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await prewarm
