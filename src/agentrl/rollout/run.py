"""One task end to end: sandbox, agent CLI, diff, grade, token-exact samples.

::

    result = await run_rollout(task, harness=ClaudeCodeHarness(...), grader=grader,
                               sandbox_factory=factory, middleware=mw, config=RolloutConfig())

Phases (each timed in ``result.timings``): ``boot`` the agent sandbox (bounded by
``boot_semaphore``, retried with jittered backoff by ``agentrl.sandboxes.boot``) →
``prepare`` the workspace (the grader's ``prepare``: ``task.pre_commands`` and the like;
a baseline snapshot; ``PROBLEM_STATEMENT.md``; the agent user owns the workdir) and open
a middleware session → ``install`` and configure the harness → ``agent`` (the CLI, under
``agent_time_budget``) → ``diff`` against the baseline → ``grade`` in a fresh sandbox
(the agent's is closed first; booted the same way, under the same semaphore) →
``finish`` the session with the reward. An outer guard (``guard_timeout``) bounds
everything; the session is always dropped and the sandbox always closed.

Outcomes: infrastructure and grader failures are never a reward of 0 that trains the
policy: their results say ``remove_sample``. Once the policy has acted, what happens to its
sandbox is its doing: a sandbox killed, a workspace destroyed, a diff that cannot be taken
are an ``agent_error`` with reward 0 that trains (the rule is in docs/rollouts.md).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from agentrl import plugins
from agentrl.graders.base import Grader, SandboxFactory
from agentrl.harnesses.base import Harness
from agentrl.retry import RetryPolicy
from agentrl.rollout.config import RolloutConfig, render_prompt
from agentrl.rollout.phases import Phases, State
from agentrl.sandboxes.boot import Booter
from agentrl.trajectory import TrainingSample
from agentrl.types import Grade, Outcome, RolloutFinishedEvent, Task, TurnFact

if TYPE_CHECKING:
    from agentrl.serve.middleware import Middleware
    from agentrl.serve.shards import ShardedMiddleware

__all__ = ["RolloutResult", "rollout_booter", "run_rollout"]

logger = logging.getLogger(__name__)


@attrs.frozen(kw_only=True)
class RolloutResult:
    """Everything one rollout produced; ``to_dict`` is its JSON line (without samples)."""

    instance_id: str
    session_id: str
    outcome: Outcome
    reward: float
    samples: tuple[TrainingSample, ...] = attrs.field(default=(), converter=tuple)
    diff: str = ""
    grade: Grade | None = None
    agent_exit_code: int | None = None
    turns: int = 0
    sampled_tokens: int = 0
    timings: dict[str, float] = attrs.field(factory=dict)
    agent_log: str = ""
    error: str | None = None
    harness: str = ""
    #: What the middleware session recorded of each turn, in order (not in ``to_dict``).
    turn_facts: tuple[TurnFact, ...] = attrs.field(default=(), converter=tuple)

    @property
    def remove_sample(self) -> bool:
        """Whether the trainer must drop this rollout's samples (infra or grader failure)."""
        return not self.outcome.trainable

    def to_dict(self) -> dict[str, Any]:
        grade = None
        if self.grade is not None:
            grade = {
                "reward": self.grade.reward,
                "solved": self.grade.solved,
                "applied_cleanly": self.grade.applied_cleanly,
                "error": self.grade.error,
                "details": dict(self.grade.details),
                "suspicious": list(self.grade.suspicious),
            }
        return {
            "instance_id": self.instance_id,
            "session_id": self.session_id,
            "harness": self.harness,
            "outcome": self.outcome.value,
            "reward": self.reward,
            "remove_sample": self.remove_sample,
            "num_samples": len(self.samples),
            "agent_exit_code": self.agent_exit_code,
            "turns": self.turns,
            "sampled_tokens": self.sampled_tokens,
            "timings": dict(self.timings),
            "grade": grade,
            "error": self.error,
            "diff": self.diff,
            "agent_log": self.agent_log,
        }


def with_traceback(agent_log: str, trace: str) -> str:
    """The agent log followed by the traceback of an internal error, when there was one."""
    if not trace:
        return agent_log
    return f"{agent_log.rstrip()}\n[agentrl: internal error]\n{trace}".lstrip("\n")


def rollout_booter(config: RolloutConfig, semaphore: asyncio.Semaphore | None) -> Booter:
    """The booter for a rollout's agent and grading sandboxes: ``config``'s retry policy
    (``boot_retries`` after the first attempt, ``boot_backoff`` seconds growing from
    there) and ``boot_timeout``, waiting on ``semaphore``."""
    return Booter(
        policy=RetryPolicy.from_retries(config.boot_retries, base=config.boot_backoff),
        timeout=config.boot_timeout,
        semaphore=semaphore,
    )


async def run_rollout(
    task: Task,
    *,
    harness: Harness,
    grader: Grader,
    sandbox_factory: SandboxFactory,
    middleware: Middleware | ShardedMiddleware,
    config: RolloutConfig | None = None,
    sampling_params: Mapping[str, Any] | None = None,
    session_id: str | None = None,
    boot_semaphore: asyncio.Semaphore | None = None,
) -> RolloutResult:
    """Run ``task`` once with ``harness`` and return its typed, graded result.

    ``sandbox_factory(task)`` builds a fresh (not started) sandbox; it is used for the
    agent and again, by the grader, for grading. Both boots go through one
    :class:`~agentrl.sandboxes.boot.Booter` (``config``'s boot retries, backoff and timeout)
    and wait on ``boot_semaphore`` when given, so it bounds grading boots too.
    ``sampling_params`` become the session's sampling defaults. Never raises for a failed
    rollout (only for cancellation).
    """
    cfg = config or RolloutConfig()
    rollout = Phases(
        task=task,
        harness=harness,
        grader=grader,
        sandbox_factory=sandbox_factory,
        middleware=middleware,
        config=cfg,
        sampling_params=dict(sampling_params or {}),
        booter=rollout_booter(cfg, boot_semaphore),
        prompt=render_prompt(cfg.prompt_template, task, cfg.problem_file),
        state=State(sid=session_id or f"{task.instance_id}-{uuid.uuid4().hex[:12]}"),
    )
    turns, samples = await rollout.run()
    state = rollout.state
    if state.outcome is None:  # never: every path of ``run`` settles one
        state.outcome, state.error = Outcome.INFRA_ERROR, state.error or "no outcome was settled"
    result = RolloutResult(
        instance_id=task.instance_id,
        session_id=state.sid,
        outcome=state.outcome,
        reward=state.reward,
        samples=tuple(samples),
        diff=state.diff,
        grade=state.grade,
        agent_exit_code=state.exit_code,
        turns=max(len(turns), state.recorded_turns),
        sampled_tokens=sum(turn.output_tokens for turn in turns),
        timings=dict(state.timings),
        agent_log=with_traceback(state.agent_log, state.traceback),
        error=state.error,
        harness=harness.name,
        turn_facts=tuple(turns),
    )
    logger.info(
        "rollout %s (%s): %s, reward %.2f, %d turns, %d samples, %.1fs%s",
        result.session_id,
        harness.name,
        result.outcome.value,
        result.reward,
        result.turns,
        len(result.samples),
        result.timings["total"],
        f" — {result.error}" if result.error else "",
    )
    plugins.notify(
        "on_rollout_finished",
        RolloutFinishedEvent(
            instance_id=task.instance_id,
            outcome=result.outcome,
            reward=result.reward,
            num_samples=len(result.samples),
            metadata={
                "session_id": result.session_id,
                "harness": harness.name,
                "timings": dict(result.timings),
                "error": result.error,
                "turns": result.turns,
                "sampled_tokens": result.sampled_tokens,
            },
        ),
    )
    return result
