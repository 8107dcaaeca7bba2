"""One task end to end: sandbox, agent CLI, diff, grade, token-exact samples.

::

    result = await run_rollout(task, harness=ClaudeCodeHarness(...), grader=grader,
                               sandbox_factory=factory, middleware=mw, config=RolloutConfig())

Phases (each timed in ``result.timings``): ``boot`` the agent sandbox (bounded by
``boot_semaphore``, retried with jittered backoff) → ``prepare`` the workspace
(``task.pre_commands``, a baseline snapshot, ``PROBLEM_STATEMENT.md``, the agent user owns
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
import contextlib
import logging
import os
import time
import urllib.parse
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from agentrl import plugins
from agentrl.graders.base import Grader, SandboxFactory
from agentrl.harnesses.base import (
    EXIT_TIME_BUDGET_EXCEEDED,
    Harness,
    HarnessContext,
    jittered_backoff,
)
from agentrl.harnesses.workspace import capture_diff, prepare_workspace
from agentrl.hookspecs import hookimpl
from agentrl.sandboxes.base import Sandbox, SandboxError
from agentrl.trajectory import TrainingSample
from agentrl.types import Grade, Outcome, RolloutFinishedEvent, Task

__all__ = ["DEFAULT_PROMPT", "RolloutConfig", "RolloutResult", "run_rollout"]

logger = logging.getLogger(__name__)

DEFAULT_PROMPT = """\
Resolve the issue below in the repository at {workdir} (it is also saved as \
{workdir}/{problem_file}). Change the source code so that the issue is fixed; do not \
modify the existing tests and do not commit.

<issue>
{problem_statement}
</issue>
"""

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


def _guard_default(self: RolloutConfig) -> float:
    return self.agent_time_budget + self.eval_timeout + 180.0


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


class _Failure(Exception):
    """Ends a rollout early with a non-trainable outcome."""

    def __init__(self, outcome: Outcome, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome


class _TurnLedger:
    """Observer of ``on_turn_recorded``: per-turn facts for the sessions being rolled out."""

    def __init__(self) -> None:
        self._turns: dict[str, list[tuple[int, int, str]]] = {}

    @hookimpl
    def on_turn_recorded(self, event: Any) -> None:
        turns = self._turns.get(event.session_id)
        if turns is not None:
            turns.append((event.prompt_tokens, event.output_tokens, event.finish_reason))

    def watch(self, sid: str) -> None:
        registry = plugins.get_registry()
        if not registry.pm.is_registered(self):
            registry.pm.register(self, name="agentrl.rollout")
        self._turns[sid] = []

    def pop(self, sid: str) -> list[tuple[int, int, str]]:
        return self._turns.pop(sid, [])


_LEDGER = _TurnLedger()


@attrs.define
class _State:
    """What a rollout has learned so far (kept when the guard interrupts it)."""

    sid: str
    phase: str = "boot"
    timings: dict[str, float] = attrs.field(factory=dict)
    exit_code: int | None = None
    agent_log: str = ""
    diff: str = ""
    grade: Grade | None = None
    outcome: Outcome | None = None
    error: str | None = None
    session_open: bool = False
    unrecorded_turns: int = 0

    @contextlib.contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        self.phase = phase
        started = time.monotonic()
        try:
            yield
        finally:
            self.timings[phase] = round(
                self.timings.get(phase, 0.0) + time.monotonic() - started, 3
            )

    def fail(self, outcome: Outcome, message: str) -> None:
        if self.outcome is None or self.outcome.trainable:
            self.outcome, self.error = outcome, message


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
    config = config or RolloutConfig()
    sid = session_id or f"{task.instance_id}-{uuid.uuid4().hex[:12]}"
    state = _State(sid=sid)
    started = time.monotonic()
    samples: list[TrainingSample] = []
    _LEDGER.watch(sid)
    try:
        try:
            await asyncio.wait_for(
                _agent_and_grade(
                    task,
                    state,
                    harness,
                    grader,
                    sandbox_factory,
                    middleware,
                    config,
                    sampling_params,
                    boot_semaphore,
                ),
                timeout=config.guard_timeout,
            )
        except asyncio.TimeoutError:
            state.fail(
                Outcome.INFRA_ERROR,
                f"the rollout guard of {config.guard_timeout:g}s expired during the "
                f"{state.phase!r} phase; raise guard_timeout or find what hangs",
            )
        turns = _LEDGER.pop(sid)
        _classify(state, turns, config)
        if state.session_open:
            with state.timed("finish"):
                samples = await _finish(middleware, state, task, harness)
    finally:
        _LEDGER.pop(sid)
        with contextlib.suppress(Exception):
            await middleware.drop_session(sid)
    state.timings["total"] = round(time.monotonic() - started, 3)
    assert state.outcome is not None
    reward = state.grade.reward if state.outcome.trainable and state.grade else 0.0
    result = RolloutResult(
        instance_id=task.instance_id,
        session_id=sid,
        outcome=state.outcome,
        reward=float(reward),
        samples=tuple(samples),
        diff=state.diff,
        grade=state.grade,
        agent_exit_code=state.exit_code,
        turns=len(turns),
        sampled_tokens=sum(out for _, out, _ in turns),
        timings=dict(state.timings),
        agent_log=state.agent_log,
        error=state.error,
        harness=harness.name,
    )
    logger.info(
        "rollout %s (%s): %s, reward %.2f, %d turns, %d samples, %.1fs%s",
        sid,
        harness.name,
        result.outcome.value,
        result.reward,
        result.turns,
        len(result.samples),
        state.timings["total"],
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
                "session_id": sid,
                "harness": harness.name,
                "timings": dict(result.timings),
                "error": result.error,
            },
        ),
    )
    return result


async def _agent_and_grade(
    task: Task,
    state: _State,
    harness: Harness,
    grader: Grader,
    sandbox_factory: SandboxFactory,
    middleware: Any,
    config: RolloutConfig,
    sampling_params: Mapping[str, Any] | None,
    boot_semaphore: asyncio.Semaphore | None,
) -> None:
    try:
        await _run_agent(
            task,
            state,
            harness,
            sandbox_factory,
            middleware,
            config,
            sampling_params,
            boot_semaphore,
        )
    except _Failure as failure:
        state.fail(failure.outcome, str(failure))
        return
    with state.timed("grade"):
        state.grade = await _grade(task, state.diff, grader, sandbox_factory, config)
    if state.grade.error is not None:
        state.fail(Outcome.GRADER_ERROR, f"grader {grader.name!r} failed: {state.grade.error}")


async def _run_agent(
    task: Task,
    state: _State,
    harness: Harness,
    sandbox_factory: SandboxFactory,
    middleware: Any,
    config: RolloutConfig,
    sampling_params: Mapping[str, Any] | None,
    boot_semaphore: asyncio.Semaphore | None,
) -> None:
    with state.timed("boot"):
        sandbox = await _boot(task, sandbox_factory, config, boot_semaphore)
    try:
        with state.timed("prepare"):
            baseline = await _guarded(
                "prepare the workspace",
                prepare_workspace(
                    sandbox,
                    task,
                    user=config.agent_user,
                    problem_file=config.problem_file,
                    timeout=config.prepare_timeout,
                    ignore=config.diff_ignore,
                ),
            )
            token = middleware.open_session(
                state.sid,
                sampling_defaults=dict(sampling_params or {}),
                max_context_tokens=config.max_context_tokens,
                max_turns=config.max_turns,
            )
            state.session_open = True
        with state.timed("install"):
            ctx = HarnessContext(
                base_url=_sandbox_url(sandbox, middleware, config),
                api_key=token,
                workdir=task.workdir,
                session_id=state.sid,
                user=config.agent_user,
                model=config.model,
            )
            await _guarded("install the agent CLI", harness.install(sandbox))
            await _guarded("configure the agent CLI", harness.configure(sandbox, ctx))
        with state.timed("agent"):
            prompt = config.prompt_template.format(
                problem_statement=task.problem_statement,
                workdir=task.workdir,
                problem_file=config.problem_file,
                instance_id=task.instance_id,
            )
            state.exit_code = await _guarded(
                "run the agent CLI", harness.run(sandbox, ctx, prompt, config.agent_time_budget)
            )
            state.agent_log = await _guarded("read the agent log", harness.read_log(sandbox))
            session = middleware.session(state.sid)
            state.unrecorded_turns = session.turns_started - session.turns_recorded
        with state.timed("diff"):
            excludes = (config.problem_file, *harness.workspace_excludes)
            state.diff = await _guarded(
                "capture the diff",
                capture_diff(sandbox, task.workdir, baseline, excludes, config.diff_ignore),
            )
    finally:
        await sandbox.aclose()


async def _guarded(what: str, step: Any) -> Any:
    """Await ``step``; a sandbox or harness failure becomes an infra_error ``_Failure``."""
    try:
        return await step
    except (_Failure, asyncio.CancelledError):
        raise
    except Exception as exc:
        logger.debug("could not %s", what, exc_info=True)
        raise _Failure(
            Outcome.INFRA_ERROR, f"could not {what}: {type(exc).__name__}: {exc}"
        ) from exc


async def _boot(
    task: Task,
    sandbox_factory: SandboxFactory,
    config: RolloutConfig,
    semaphore: asyncio.Semaphore | None,
) -> Sandbox:
    errors = []
    attempts = config.boot_retries + 1
    for attempt in range(1, attempts + 1):
        sandbox: Sandbox | None = None
        try:
            sandbox = sandbox_factory(task)
            async with semaphore if semaphore is not None else contextlib.nullcontext():
                await asyncio.wait_for(sandbox.start(), config.boot_timeout)
            return sandbox
        except asyncio.CancelledError:
            if sandbox is not None:
                await sandbox.aclose()
            raise
        except Exception as exc:
            if sandbox is not None:
                await sandbox.aclose()
            detail = str(exc) or f"no start within {config.boot_timeout:g}s"
            errors.append(f"attempt {attempt}: {type(exc).__name__}: {detail}")
            transient = isinstance(exc, (SandboxError, OSError, asyncio.TimeoutError))
            if not transient or attempt == attempts:
                break
            delay = jittered_backoff(attempt, base=config.boot_backoff)
            logger.warning(
                "sandbox boot for %s failed (%s); retry in %.1fs",
                task.instance_id,
                errors[-1],
                delay,
            )
            await asyncio.sleep(delay)
    raise _Failure(
        Outcome.INFRA_ERROR,
        f"the agent sandbox did not boot ({len(errors)} attempt(s)): " + "; ".join(errors),
    )


def _sandbox_url(sandbox: Sandbox, middleware: Any, config: RolloutConfig) -> str:
    parsed = urllib.parse.urlsplit(getattr(middleware, "url", None) or "")
    host = config.middleware_host or parsed.hostname
    port = config.middleware_port or parsed.port
    if not host or not port:
        raise _Failure(
            Outcome.INFRA_ERROR,
            "the middleware address is unknown: start the middleware on TCP or set "
            "RolloutConfig(middleware_host=..., middleware_port=...)",
        )
    try:
        return sandbox.url_for(host, port)
    except SandboxError as exc:
        raise _Failure(
            Outcome.INFRA_ERROR, f"the sandbox cannot reach the middleware: {exc}"
        ) from exc


async def _grade(
    task: Task, diff: str, grader: Grader, sandbox_factory: SandboxFactory, config: RolloutConfig
) -> Grade:
    if not diff.strip() and not config.grade_empty_diff:
        return Grade(reward=0.0, applied_cleanly=True, details={"empty_diff": True})
    try:
        return await asyncio.wait_for(
            grader.grade(task, diff, sandbox_factory), timeout=config.eval_timeout
        )
    except asyncio.TimeoutError:
        error = f"grading took longer than eval_timeout={config.eval_timeout:g}s"
    except Exception as exc:
        logger.exception("grader %s raised for %s", grader.name, task.instance_id)
        error = f"{type(exc).__name__}: {exc}"
    return Grade(reward=0.0, applied_cleanly=False, error=error)


def _classify(state: _State, turns: list[tuple[int, int, str]], config: RolloutConfig) -> None:
    """Settle the outcome from the exit code, the turns and the grade."""
    if state.outcome is not None and not state.outcome.trainable:
        return
    code = state.exit_code
    if code is None:
        state.fail(Outcome.INFRA_ERROR, state.error or "the agent never ran")
    elif not turns and code != EXIT_TIME_BUDGET_EXCEEDED:
        state.fail(
            Outcome.INFRA_ERROR,
            f"the agent CLI made no model call that reached the engine (exit code {code}); "
            "check its log: the middleware URL or token may be wrong, or the engine is down",
        )
    elif code not in (0, EXIT_TIME_BUDGET_EXCEEDED) and state.unrecorded_turns:
        state.fail(
            Outcome.INFRA_ERROR,
            f"the agent CLI exited with code {code} after {state.unrecorded_turns} turn(s) "
            "failed in the middleware or engine (see the middleware log)",
        )
    elif code == EXIT_TIME_BUDGET_EXCEEDED:
        state.outcome = Outcome.TIMEOUT
        state.error = f"the agent exceeded its time budget of {config.agent_time_budget:g}s"
    elif _overflowed(turns, config.max_context_tokens):
        state.outcome = Outcome.CONTEXT_OVERFLOW
        state.error = f"the context budget of {config.max_context_tokens} tokens ran out"
    elif code != 0:
        state.outcome = Outcome.AGENT_ERROR
        state.error = f"the agent CLI exited with code {code}"
    elif state.grade is not None and state.grade.solved:
        state.outcome = Outcome.SOLVED
    else:
        state.outcome = Outcome.UNSOLVED


def _overflowed(turns: list[tuple[int, int, str]], budget: int) -> bool:
    if not budget or not turns:
        return False
    prompt, output, finish = turns[-1]
    return finish == "length" and prompt + output >= budget


async def _finish(
    middleware: Any, state: _State, task: Task, harness: Harness
) -> list[TrainingSample]:
    assert state.outcome is not None
    reward = state.grade.reward if state.outcome.trainable and state.grade else 0.0
    metadata = {
        "instance_id": task.instance_id,
        "session_id": state.sid,
        "harness": harness.name,
        "outcome": state.outcome.value,
    }
    try:
        return list(await middleware.finish_session(state.sid, reward=reward, metadata=metadata))
    except Exception as exc:
        logger.exception("finish_session failed for %s", state.sid)
        state.fail(Outcome.INFRA_ERROR, f"could not collect the samples: {exc}")
        return []
