"""The phases of one rollout (``agentrl.rollout.run_rollout`` is the public entry point).

``Phases.run`` boots the agent sandbox, prepares the workspace, opens the session, runs
the harness, captures the diff, grades in a fresh sandbox and finishes the session, all
under the outer guard; ``classify`` turns what happened into a typed outcome.

**Prewarm.** When the backend's idle sandbox is cheap (``Sandbox.prewarm_grading``), the
grading sandbox boots while the agent runs. It stays fresh: the same factory and boot
loop make it, nothing runs in it before the grader's first command, it shares nothing
with the agent's sandbox, and booting earlier only means less of the agent's doing
exists yet. An unused one is closed; one that failed to boot is replaced by a boot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import traceback
import urllib.parse
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from agentrl.graders.base import Grader, grade_diff, grader_failed
from agentrl.harnesses.base import EXIT_TIME_BUDGET_EXCEEDED, Harness, HarnessContext
from agentrl.harnesses.errors import HarnessError
from agentrl.harnesses.workspace import capture_diff, prepare_workspace
from agentrl.rollout.config import GRADE_SETUP_MARGIN, grading_guard
from agentrl.sandboxes.base import Sandbox, SandboxError
from agentrl.sandboxes.boot import Booter, BootError, PrewarmedBooter, SandboxFactory
from agentrl.trajectory import TrainingSample
from agentrl.types import Grade, Outcome, Task, TurnFact

if TYPE_CHECKING:
    from agentrl.rollout.config import RolloutConfig
    from agentrl.serve.middleware import Middleware
    from agentrl.serve.sessions import Session
    from agentrl.serve.shard_handle import ShardSession
    from agentrl.serve.shards import ShardedMiddleware

logger = logging.getLogger("agentrl.rollout")

#: What a sandbox, a harness or the workspace raise when the sandbox misbehaves: once the
#: policy has acted, the policy can cause any of these. Anything else is a bug of ours.
POLICY_REACHABLE_ERRORS: tuple[type[BaseException], ...] = (
    SandboxError,
    HarnessError,
    OSError,
    TimeoutError,
    asyncio.TimeoutError,
)


class Failure(Exception):
    """Ends a rollout early: ``infra_error`` (never trains), or ``agent_error`` when the
    policy broke its own sandbox (it trains, with reward 0); ``trace`` is the traceback of
    an internal error."""

    def __init__(self, outcome: Outcome, message: str, trace: str = "") -> None:
        super().__init__(message)
        self.outcome = outcome
        self.trace = trace


@attrs.define
class State:
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
    recorded_turns: int = 0
    #: The policy broke its own sandbox after it acted (``fail`` set ``agent_error``).
    policy_failed: bool = False
    #: The traceback of an internal error (a bug of ours), for the result's agent log.
    traceback: str = ""

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

    @property
    def reward(self) -> float:
        """The grade's reward, or 0.0 when the outcome must not train the policy."""
        trainable = self.outcome is not None and self.outcome.trainable
        if not trainable or self.grade is None or self.grade.suspicious:
            return 0.0
        return float(self.grade.reward)

    def fail(self, outcome: Outcome, message: str) -> None:
        if self.outcome is None or self.outcome.trainable:
            self.outcome, self.error = outcome, message


@attrs.define(kw_only=True)
class Phases:
    """One rollout's parts and progress; ``run`` drives the phases."""

    task: Task
    harness: Harness
    grader: Grader
    sandbox_factory: SandboxFactory
    middleware: Middleware | ShardedMiddleware
    config: RolloutConfig
    sampling_params: dict[str, Any]
    booter: Booter
    prompt: str
    state: State
    #: The middleware session, once opened; its turn facts stay readable after it closes.
    session: Session | ShardSession | None = None
    #: The grading boot holding the sandbox booting while the agent runs (module docstring).
    prewarm: PrewarmedBooter | None = None

    async def run(self) -> tuple[list[TurnFact], list[TrainingSample]]:
        """Run every phase under the guard; returns the session's turn facts and the samples.

        The outcome is classified from the turns recorded before the session is finished.
        """
        state, config = self.state, self.config
        started = time.monotonic()
        samples: list[TrainingSample] = []
        try:
            try:
                await asyncio.wait_for(self._agent_and_grade(), timeout=config.guard_timeout)
            except asyncio.TimeoutError:
                state.fail(
                    Outcome.INFRA_ERROR,
                    f"the rollout guard of {config.guard_timeout:g}s expired during the "
                    f"{state.phase!r} phase; raise guard_timeout or find what hangs",
                )
            except Exception as exc:
                self._internal_error(exc)
            try:
                await self._settle()
                classify(state, self.turn_facts(), config)
                if state.session_open:
                    with state.timed("finish"):
                        samples = await self._finish()
            except Exception as exc:
                self._internal_error(exc)
        finally:
            with contextlib.suppress(Exception):
                await self.middleware.drop_session(state.sid)
        state.timings["total"] = round(time.monotonic() - started, 3)
        return self.turn_facts(), samples

    def _internal_error(self, exc: Exception) -> None:
        """A bug of ours escaped a phase: ``infra_error``, its traceback kept for the log."""
        logger.exception(
            "rollout %s: internal error in the %r phase", self.state.sid, self.state.phase
        )
        self.state.outcome = Outcome.INFRA_ERROR
        self.state.error = (
            f"internal error in the {self.state.phase!r} phase: {type(exc).__name__}: {exc}"
        )
        self.state.traceback = self.state.traceback or _trace(exc)

    def turn_facts(self) -> list[TurnFact]:
        """What the session recorded of each turn so far (none before it opened)."""
        return list(self.session.turn_facts) if self.session is not None else []

    async def _agent_and_grade(self) -> None:
        state = self.state
        try:
            try:
                await self._agent()
            except Failure as failure:
                state.fail(failure.outcome, str(failure))
                state.policy_failed = state.outcome is Outcome.AGENT_ERROR
                state.traceback = state.traceback or failure.trace
                return
            with state.timed("grade"):
                state.grade = await self._grade()
            if state.grade.error is not None:
                state.fail(
                    Outcome.GRADER_ERROR, f"grader {self.grader.name!r}: {state.grade.error}"
                )
        finally:
            await asyncio.shield(self._drop_prewarm())

    def _start_prewarm(self, sandbox: Sandbox) -> None:
        """Boot the grading sandbox now, when the backend says holding it is cheap and the
        grader boots through the rollout's booter."""
        if sandbox.prewarm_grading and type(self.grader).grade is Grader.grade:
            booter = self.booter
            future = asyncio.ensure_future(
                booter.boot(self.sandbox_factory, self.task, what="grading sandbox")
            )
            self.prewarm = PrewarmedBooter(
                policy=booter.policy, timeout=booter.timeout, semaphore=booter.semaphore
            )
            self.prewarm.prewarm = future

    async def _drop_prewarm(self) -> None:
        """Close a prewarmed grading sandbox the grader did not take (or stop its boot)."""
        future = self.prewarm.prewarm if self.prewarm is not None else None
        if future is None:
            return
        self.prewarm.prewarm = None  # type: ignore[union-attr]
        future.cancel()
        await asyncio.wait({future})
        if not future.cancelled() and future.exception() is None:
            with contextlib.suppress(Exception):
                await future.result().aclose()

    async def _agent(self) -> None:
        state, config, task, harness = self.state, self.config, self.task, self.harness
        with state.timed("boot"):
            sandbox = await self._boot()
        self._start_prewarm(sandbox)
        try:
            with state.timed("prepare"):
                # The grader brings the workspace to the task's base (pre_commands and
                # the like), exactly as it will in the grading sandbox.
                await _guarded(
                    "prepare the workspace for the task",
                    asyncio.wait_for(self.grader.prepare(sandbox, task), config.prepare_timeout),
                )
                baseline = await _guarded(
                    "prepare the workspace",
                    prepare_workspace(
                        sandbox,
                        task,
                        user=config.agent_user,
                        problem_file=config.problem_file,
                        timeout=config.prepare_timeout,
                        ignore=config.diff_ignore,
                        run_pre_commands=False,
                        base_commit=self.grader.base_commit(task),
                    ),
                )
                token = await _guarded("open a middleware session", self._open_session())
            with state.timed("install"):
                ctx = HarnessContext(
                    base_url=_sandbox_url(sandbox, self.middleware, config),
                    api_key=token,
                    workdir=task.workdir,
                    session_id=state.sid,
                    user=config.agent_user,
                    model=config.model,
                )
                await _guarded("install the agent CLI", harness.install(sandbox))
                await _guarded("configure the agent CLI", harness.configure(sandbox, ctx))
            with state.timed("agent"):
                state.exit_code = await self._after_start(
                    sandbox,
                    "run the agent CLI",
                    harness.run(sandbox, ctx, self.prompt, config.agent_time_budget),
                )
            with state.timed("diff"):
                excludes = (config.problem_file, *harness.workspace_excludes)
                state.diff = await self._after_start(
                    sandbox,
                    "capture the diff",
                    capture_diff(
                        sandbox,
                        task.workdir,
                        baseline,
                        excludes,
                        config.diff_ignore,
                        user=config.agent_user,
                    ),
                )
        finally:
            if state.session_open and not state.agent_log:
                with contextlib.suppress(Exception):
                    state.agent_log = await asyncio.wait_for(harness.read_log(sandbox), 30)
            with state.timed("teardown"):
                await sandbox.aclose()

    async def _open_session(self) -> str:
        token = self.middleware.open_session(
            self.state.sid,
            sampling_defaults=self.sampling_params,
            max_context_tokens=self.config.max_context_tokens,
            max_turns=self.config.max_turns,
        )
        self.session = self.middleware.session(self.state.sid)
        self.state.session_open = True
        return token

    async def _settle(self) -> None:
        """Bring the held session up to date with what its finished requests recorded (a
        sharded middleware's mirror asks the session's worker), then read its counters."""
        if self.session is not None and not self.session.closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.middleware.settle(self.state.sid), 30)
        self._count_turns()

    def _count_turns(self) -> None:
        """Read the session's turn counters (the held session: it may have been dropped)."""
        if self.session is not None:
            self.state.recorded_turns = self.session.turns_recorded
            self.state.unrecorded_turns = self.session.turns_started - self.session.turns_recorded

    async def _after_start(self, sandbox: Sandbox, what: str, step: Any) -> Any:
        """Await a step that runs once the agent CLI was started, and judge its failure.

        Once the policy has acted (a turn of it was recorded), whatever the sandbox does
        is its doing: a failure here ends the rollout as ``agent_error`` (reward 0, it
        trains) unless there is evidence the policy cannot forge that infrastructure
        failed: no turn recorded yet, the backend says it lost the sandbox itself, or the
        exception is not one a sandbox raises (a bug in our code: ``infra_error``).
        """
        try:
            return await step
        except (Failure, asyncio.CancelledError):
            raise
        except Exception as exc:
            raise await self._judge(sandbox, what, exc) from exc
        finally:
            await self._settle()

    async def _judge(self, sandbox: Sandbox, what: str, exc: Exception) -> Failure:
        state = self.state
        message = f"could not {what}: {type(exc).__name__}: {exc}"
        await self._settle()
        if not isinstance(exc, POLICY_REACHABLE_ERRORS):
            logger.exception("rollout %s: an internal error in %r", state.sid, state.phase)
            return Failure(Outcome.INFRA_ERROR, f"internal error: {message}", _trace(exc))
        logger.info("rollout %s: %s", state.sid, message)
        if not state.recorded_turns:
            return Failure(Outcome.INFRA_ERROR, f"{message} (before the policy acted)")
        try:
            external = await asyncio.wait_for(sandbox.lost_externally(exc), 60)
        except Exception:
            logger.warning("lost_externally failed for %s", state.sid, exc_info=True)
            external = False
        if external:
            return Failure(Outcome.INFRA_ERROR, f"{message} (the backend lost the sandbox)")
        return Failure(Outcome.AGENT_ERROR, f"{message} (after the agent ran: its doing)")

    async def _boot(self) -> Sandbox:
        try:
            return await self.booter.boot(self.sandbox_factory, self.task, what="agent sandbox")
        except BootError as exc:
            raise Failure(Outcome.INFRA_ERROR, str(exc)) from exc

    async def _grade(self) -> Grade:
        diff, config, grader = self.state.diff, self.config, self.grader
        if not diff.strip() and not config.grade_empty_diff:
            return Grade(
                reward=0.0, solved=False, applied_cleanly=True, details={"empty_diff": True}
            )
        try:
            # The grader times its own test run (and reports it in detail); this outer
            # guard also covers booting and preparing the grading sandbox.
            booter = self.prewarm or self.booter
            return await asyncio.wait_for(
                grade_diff(grader, self.task, diff, self.sandbox_factory, booter=booter),
                timeout=grading_guard(config.eval_timeout),
            )
        except asyncio.TimeoutError:
            error = (
                f"grading took longer than {grading_guard(config.eval_timeout):g}s: twice "
                f"eval_timeout={config.eval_timeout:g}s plus {GRADE_SETUP_MARGIN:g}s (the "
                "grade and its control, each with the sandbox's boot and setup)"
            )
        except Exception as exc:
            logger.exception("grader %s raised for %s", grader.name, self.task.instance_id)
            return grader_failed(exc)
        return Grade(reward=0.0, solved=False, applied_cleanly=False, error=error)

    async def _finish(self) -> list[TrainingSample]:
        state = self.state
        assert state.outcome is not None
        metadata = {
            "instance_id": self.task.instance_id,
            "session_id": state.sid,
            "harness": self.harness.name,
            "outcome": state.outcome.value,
        }
        try:
            return list(
                await self.middleware.finish_session(
                    state.sid,
                    reward=state.reward,
                    metadata=metadata,
                    max_sample_tokens=self.config.max_sample_tokens or None,
                )
            )
        except Exception as exc:
            logger.exception("finish_session failed for %s", state.sid)
            state.fail(Outcome.INFRA_ERROR, f"could not collect the samples: {exc}")
            return []


async def _guarded(what: str, step: Any) -> Any:
    """Await ``step``; a sandbox or harness failure becomes an infra_error ``Failure``."""
    try:
        return await step
    except (Failure, asyncio.CancelledError):
        raise
    except Exception as exc:
        message = f"could not {what}: {type(exc).__name__}: {exc}"
        if isinstance(exc, POLICY_REACHABLE_ERRORS):
            logger.debug("could not %s", what, exc_info=True)
            raise Failure(Outcome.INFRA_ERROR, message) from exc
        logger.exception("could not %s: an internal error", what)
        raise Failure(Outcome.INFRA_ERROR, f"internal error: {message}", _trace(exc)) from exc


def _trace(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def _sandbox_url(sandbox: Sandbox, middleware: Middleware, config: RolloutConfig) -> str:
    parsed = urllib.parse.urlsplit(getattr(middleware, "url", None) or "")
    port = config.middleware_port or parsed.port
    # A middleware on a unix socket only has no TCP host; sandboxes that relay the socket
    # (the local backend) only need the port.
    host = config.middleware_host or parsed.hostname or ("127.0.0.1" if port else None)
    if not host or not port:
        raise Failure(
            Outcome.INFRA_ERROR,
            "the middleware address is unknown: start the middleware on TCP or set "
            "RolloutConfig(middleware_host=..., middleware_port=...)",
        )
    try:
        return sandbox.url_for(host, port)
    except SandboxError as exc:
        raise Failure(
            Outcome.INFRA_ERROR, f"the sandbox cannot reach the middleware: {exc}"
        ) from exc


def classify(state: State, turns: Sequence[TurnFact], config: RolloutConfig) -> None:
    """Settle the outcome from the exit code, the turns and the grade."""
    if state.outcome is not None and not state.outcome.trainable:
        return
    if state.policy_failed:
        if state.unrecorded_turns:
            state.fail(
                Outcome.INFRA_ERROR,
                f"{state.unrecorded_turns} turn(s) failed in the middleware or engine before "
                f"the sandbox failed: {state.error}",
            )
        return
    code = state.exit_code
    if code is None:
        state.fail(Outcome.INFRA_ERROR, state.error or "the agent never ran")
    elif not turns and not state.recorded_turns:
        ended = "ran out of time" if code == EXIT_TIME_BUDGET_EXCEEDED else f"exited {code}"
        state.fail(
            Outcome.INFRA_ERROR,
            f"the agent CLI {ended} without one model call reaching the engine; check its "
            "log: the middleware URL or token may be wrong, or the engine is down or stuck",
        )
    elif code not in (0, EXIT_TIME_BUDGET_EXCEEDED) and state.unrecorded_turns:
        state.fail(
            Outcome.INFRA_ERROR,
            f"the agent CLI exited with code {code} after {state.unrecorded_turns} turn(s) "
            "failed in the middleware or engine (see the middleware log)",
        )
    elif state.grade is not None and state.grade.suspicious:
        state.outcome = Outcome.REWARD_HACK_SUSPECTED
        state.error = f"the diff holds what only a reward hack needs: {state.grade.suspicious[0]}"
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


def _overflowed(turns: Sequence[TurnFact], budget: int) -> bool:
    if not budget or not turns:
        return False
    last = turns[-1]
    return last.finish_reason == "length" and last.prompt_tokens + last.output_tokens >= budget
