"""One task end to end: sandbox, agent CLI, diff, grade, token-exact samples.

::

    result = await run_rollout(task, harness=ClaudeCodeHarness(...), grader=grader,
                               sandbox_factory=factory, middleware=mw, config=RolloutConfig())

Phases (each timed in ``result.timings``): ``boot`` the agent sandbox (bounded by
``boot_semaphore``, retried with jittered backoff) → ``prepare`` the workspace
(the grader's ``prepare``: ``task.pre_commands`` and the like; a baseline snapshot;
``PROBLEM_STATEMENT.md``; the agent user owns
the workdir) and open a middleware session → ``install`` and configure the harness →
``agent`` (the CLI, under ``agent_time_budget``) → ``diff`` against the baseline →
``grade`` in a fresh sandbox (the agent's is closed first) → ``finish`` the session with
the reward. An outer guard (``guard_timeout``) bounds everything; the session is always
dropped and the sandbox always closed.

Outcomes: infrastructure and grader failures are never a reward of 0 that trains the
policy: their results say ``remove_sample``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import uuid
from collections.abc import Mapping
from typing import Any

import attrs

from agentrl import plugins
from agentrl._rollout_phases import Phases, State
from agentrl.graders.base import Grader, SandboxFactory
from agentrl.harnesses.base import Harness
from agentrl.trajectory import TrainingSample
from agentrl.types import Grade, Outcome, RolloutFinishedEvent, Task

__all__ = [
    "DEFAULT_PROMPT",
    "RolloutConfig",
    "RolloutResult",
    "default_guard_timeout",
    "render_prompt",
    "run_rollout",
]

logger = logging.getLogger(__name__)

DEFAULT_PROMPT = """\
Resolve the issue below in the repository at {workdir} (it is also saved as \
{workdir}/{problem_file}). Change the source code so that the issue is fixed; do not \
modify the existing tests and do not commit.

<issue>
{problem_statement}
</issue>
"""

#: The placeholders ``render_prompt`` fills in.
_PLACEHOLDER = re.compile(r"\{(problem_statement|workdir|problem_file|instance_id)\}")

#: Untracked files an agent's own tool runs leave behind; never part of its diff.
DEFAULT_DIFF_IGNORE = (
    "__pycache__/",
    "*.py[cod]",
    ".pytest_cache/",
    ".mypy_cache/",
    ".ruff_cache/",
    ".hypothesis/",
    ".tox/",
    ".nox/",
    ".coverage",
    "*.egg-info/",
    "node_modules/",
)


#: Seconds the outer guard allows beyond the agent's budget and grading (boot, install, …).
GUARD_MARGIN = 180.0


def default_guard_timeout(agent_time_budget: float, eval_timeout: float) -> float:
    """The rollout guard when none is set: the agent's budget, grading, and ``GUARD_MARGIN``."""
    return agent_time_budget + eval_timeout + GUARD_MARGIN


def _guard_default(self: RolloutConfig) -> float:
    return default_guard_timeout(self.agent_time_budget, self.eval_timeout)


@attrs.frozen(kw_only=True)
class RolloutConfig:
    """Budgets, limits and addresses for one rollout (``from_env`` reads the defaults).

    ``middleware_host`` / ``middleware_port`` are the middleware's address as the sandbox
    backend needs it for ``Sandbox.url_for`` (default: taken from ``middleware.url``).
    ``max_sample_tokens`` 0 means the context budget. ``guard_timeout`` defaults to
    ``agent_time_budget + eval_timeout + 180``.
    """

    agent_time_budget: float = 1800.0
    eval_timeout: float = 600.0
    guard_timeout: float = attrs.field(default=attrs.Factory(_guard_default, takes_self=True))
    boot_retries: int = 2
    boot_backoff: float = 2.0
    boot_timeout: float = 300.0
    prepare_timeout: float = 600.0
    max_context_tokens: int = 0
    max_sample_tokens: int = 0
    max_turns: int | None = None
    middleware_host: str | None = None
    middleware_port: int | None = None
    agent_user: str = "agent"
    model: str | None = None
    prompt_template: str = DEFAULT_PROMPT
    problem_file: str = "PROBLEM_STATEMENT.md"
    diff_ignore: tuple[str, ...] = attrs.field(default=DEFAULT_DIFF_IGNORE, converter=tuple)
    grade_empty_diff: bool = False

    def __attrs_post_init__(self) -> None:
        for name in ("agent_time_budget", "eval_timeout", "guard_timeout", "boot_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"RolloutConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.boot_retries < 0:
            raise ValueError(f"RolloutConfig.boot_retries must be >= 0, got {self.boot_retries}")
        if self.guard_timeout < self.agent_time_budget:
            raise ValueError(
                f"RolloutConfig.guard_timeout ({self.guard_timeout}s) is shorter than "
                f"agent_time_budget ({self.agent_time_budget}s); the guard would always fire "
                "first. Leave guard_timeout unset for agent + eval + 180 s"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> RolloutConfig:
        """Defaults from ``AGENTRL_*`` variables (or slime's ``SWE_*``), then ``overrides``.

        ``AGENTRL_AGENT_TIME_BUDGET`` / ``SWE_AGENT_TIME_BUDGET_SEC``,
        ``AGENTRL_EVAL_TIMEOUT`` / ``SWE_EVAL_TIMEOUT_SEC``, ``AGENTRL_ROLLOUT_GUARD`` /
        ``SWE_ROLLOUT_GUARD_SEC``, ``AGENTRL_BOOT_RETRIES`` / ``SWE_BOOT_RETRIES``,
        ``AGENTRL_MAX_CONTEXT_TOKENS``, ``AGENTRL_MAX_TURNS``, ``AGENTRL_PROMPT_TEMPLATE``
        (or ``SWE_CC_PROMPT``).
        """
        env = os.environ if environ is None else environ
        table = {
            "agent_time_budget": (float, "AGENTRL_AGENT_TIME_BUDGET", "SWE_AGENT_TIME_BUDGET_SEC"),
            "eval_timeout": (float, "AGENTRL_EVAL_TIMEOUT", "SWE_EVAL_TIMEOUT_SEC"),
            "guard_timeout": (float, "AGENTRL_ROLLOUT_GUARD", "SWE_ROLLOUT_GUARD_SEC"),
            "boot_retries": (int, "AGENTRL_BOOT_RETRIES", "SWE_BOOT_RETRIES"),
            "max_context_tokens": (int, "AGENTRL_MAX_CONTEXT_TOKENS"),
            "max_turns": (int, "AGENTRL_MAX_TURNS"),
            "prompt_template": (str, "AGENTRL_PROMPT_TEMPLATE", "SWE_CC_PROMPT"),
        }
        values: dict[str, Any] = {}
        for field, (kind, *names) in table.items():
            for name in names:
                raw = env.get(name, "").strip()
                if not raw:
                    continue
                try:
                    values[field] = kind(raw)
                except ValueError:
                    raise ValueError(
                        f"{name}={raw!r} is not a valid {kind.__name__}; unset it or give a number"
                    ) from None
                break
        values.update(overrides)
        return cls(**values)


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

    @property
    def remove_sample(self) -> bool:
        """Whether the trainer must drop this rollout's samples (infra or grader failure)."""
        return not self.outcome.trainable

    def to_dict(self) -> dict[str, Any]:
        grade = None
        if self.grade is not None:
            grade = {
                "reward": self.grade.reward,
                "applied_cleanly": self.grade.applied_cleanly,
                "error": self.grade.error,
                "details": dict(self.grade.details),
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


async def run_rollout(
    task: Task,
    *,
    harness: Harness,
    grader: Grader,
    sandbox_factory: SandboxFactory,
    middleware: Any,
    config: RolloutConfig | None = None,
    sampling_params: Mapping[str, Any] | None = None,
    session_id: str | None = None,
    boot_semaphore: asyncio.Semaphore | None = None,
) -> RolloutResult:
    """Run ``task`` once with ``harness`` and return its typed, graded result.

    ``sandbox_factory(task)`` builds a fresh (not started) sandbox; it is used for the
    agent and again, by the grader, for grading. ``sampling_params`` become the session's
    sampling defaults. Never raises for a failed rollout (only for cancellation).
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
        boot_semaphore=boot_semaphore,
        prompt=render_prompt(cfg.prompt_template, task, cfg.problem_file),
        state=State(sid=session_id or f"{task.instance_id}-{uuid.uuid4().hex[:12]}"),
    )
    turns, samples = await rollout.run()
    state = rollout.state
    assert state.outcome is not None
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
        sampled_tokens=sum(output for _, output, _ in turns),
        timings=dict(state.timings),
        agent_log=state.agent_log,
        error=state.error,
        harness=harness.name,
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
            },
        ),
    )
    return result


def render_prompt(template: str, task: Task, problem_file: str) -> str:
    """The agent's prompt: ``template`` with its placeholders filled in.

    Only ``{problem_statement}``, ``{workdir}``, ``{problem_file}`` and ``{instance_id}``
    are replaced; any other braces stay as written, so a template may contain code.
    """
    values = {
        "problem_statement": task.problem_statement,
        "workdir": task.workdir,
        "problem_file": problem_file,
        "instance_id": task.instance_id,
    }
    # One pass, so a placeholder-like text inside the issue itself is left as written.
    return _PLACEHOLDER.sub(lambda match: values[match.group(1)], template)
