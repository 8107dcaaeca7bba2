"""The grader contract: parse a task row, say if it can be graded, grade a diff.

``Grader.grade`` is one pipeline for every grader (check → fresh sandbox → setup → apply
→ evaluate → a Grade); a grader writes the steps that differ, ``evaluate`` at least.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import pathlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

import attrs

from agentrl import settings
from agentrl.graders import guard
from agentrl.graders.patching import (
    DEFAULT_TEST_PATTERNS,
    SCALESWE_LADDER,
    PatchOutcome,
    apply_patch,
)
from agentrl.plugin_options import keyword_parameters
from agentrl.sandboxes.base import Sandbox
from agentrl.sandboxes.boot import Booter, BootError, SandboxFactory
from agentrl.sandboxes.exec import exec_and_wait
from agentrl.types import ExecResult, Grade, Task

__all__ = [
    "DEFAULT_GRADE_TIMEOUT",
    "EVALUATE_MARGIN",
    "GRADE_DIR",
    "Grader",
    "SandboxFactory",
    "cannot_grade",
    "fresh_sandbox",
    "grade_diff",
    "grade_timeout",
    "grader_failed",
    "grading_timed_out",
    "is_host_path",
    "resolve_host_path",
    "sandbox_source_problem",
]

logger = logging.getLogger(__name__)

#: Grading files live here in the sandbox, away from the repository.
GRADE_DIR = "/tmp/agentrl-grade"

#: Seconds a grading run (the tests, not the sandbox boot) may take by default.
DEFAULT_GRADE_TIMEOUT = 600.0
#: Seconds ``evaluate`` may take beyond the grading budget (reading results, parsing logs).
EVALUATE_MARGIN = 120.0

_GraderT = TypeVar("_GraderT", bound="Grader")

#: (grader class, option) pairs already reported as ignored, so each is logged once.
_ignored_reported: set[tuple[type, str]] = set()


def grade_timeout(value: float | None = None, env: Mapping[str, str] | None = None) -> float:
    """The grading time budget: ``value``, else ``AGENTRL_GRADE_TIMEOUT``, else the
    rollout's ``AGENTRL_EVAL_TIMEOUT``, else slime's ``SWE_EVAL_TIMEOUT_SEC``, else 600 s."""
    if value is not None:
        if value <= 0:
            raise ValueError(f"grading timeout must be positive seconds, got {value}")
        return float(value)
    return settings.get("AGENTRL_GRADE_TIMEOUT", env, default=DEFAULT_GRADE_TIMEOUT)


def resolve_host_path(value: str | None, base_dir: pathlib.Path | None) -> str | None:
    """``value`` made absolute against ``base_dir`` when it is a relative host path."""
    if not value or base_dir is None:
        return value
    path = pathlib.Path(value).expanduser()
    if path.is_absolute():
        return str(path)
    return str((base_dir / path).resolve())


def is_host_path(repo: str | None) -> bool:
    """Whether a task's ``repo`` names a path on this machine (not a URL)."""
    return bool(repo) and "://" not in repo


def sandbox_source_problem(task: Task, image_field: str) -> str | None:
    """Why no sandbox can be built for ``task`` (``image_field`` names the row's image key)."""
    if not task.image and not task.repo:
        return (
            f"nothing to build a sandbox from: set {image_field} (a sandbox image) or "
            "metadata.repo (a local directory or tarball)"
        )
    if is_host_path(task.repo) and not pathlib.Path(task.repo).exists():
        return f"metadata.repo {task.repo} does not exist on this machine"
    return None


def cannot_grade(reason: str) -> Grade:
    """The grade of a task :meth:`Grader.check` turned down: nothing was applied or run."""
    return Grade(reward=0.0, solved=False, applied_cleanly=False, error=f"cannot grade: {reason}")


def grader_failed(exc: BaseException, details: Mapping[str, Any] | None = None) -> Grade:
    """The grade when grading broke (sandbox, upload, spec); ``details``: what ran so far.

    Once the diff applied, whose failure it is gets decided by the control (see
    :meth:`Grader.grade`)."""
    return Grade(
        reward=0.0,
        solved=False,
        applied_cleanly=False,
        error=f"grader failed: {type(exc).__name__}: {exc}",
        details=dict(details or {}),
    )


def grading_timed_out(timeout: float, details: dict[str, Any]) -> Grade:
    """The grade when the tests ran past the ``timeout`` seconds budget."""
    return Grade(
        reward=0.0,
        solved=False,
        error=f"grading timed out after {timeout:g}s (raise AGENTRL_GRADE_TIMEOUT)",
        details=details,
    )


@contextlib.asynccontextmanager
async def fresh_sandbox(
    sandbox_factory: SandboxFactory, task: Task, *, booter: Booter | None = None
) -> AsyncIterator[Sandbox]:
    """A new sandbox from ``sandbox_factory``, started by ``booter`` and closed on exit.

    The boot is retried by the booter's policy (default: :class:`Booter`'s); when every
    attempt failed, the last attempt's error is raised.
    """
    try:
        sandbox = await (booter or Booter()).boot(sandbox_factory, task, what="grading sandbox")
    except BootError as exc:
        logger.warning("%s: %s", task.instance_id, exc)
        raise exc.last from None
    try:
        yield sandbox
    finally:
        await sandbox.aclose()


async def grade_diff(
    grader: Grader,
    task: Task,
    diff: str,
    sandbox_factory: SandboxFactory,
    *,
    booter: Booter | None = None,
) -> Grade:
    """``grader.grade``, its grading sandbox started by ``booter`` (the rollout's boot path).

    A grader that overrides ``grade()`` itself (written for the contract before the shared
    pipeline) is called with the three arguments it takes and starts its own sandbox.
    """
    if type(grader).grade is Grader.grade:
        return await grader.grade(task, diff, sandbox_factory, booter=booter)
    return await grader.grade(task, diff, sandbox_factory)


class Grader(abc.ABC):
    """Grades an agent's diff in a fresh sandbox built from the task's image."""

    name: ClassVar[str]
    #: The grading budget in seconds (graders set their own, see :func:`grade_timeout`).
    timeout: float = DEFAULT_GRADE_TIMEOUT
    #: The sandbox user grading commands run as.
    user: str = "root"
    #: The most characters of a log (a failed apply's, the tests') kept in a grade's details.
    log_tail: ClassVar[int] = 4000

    @classmethod
    def from_options(
        cls: type[_GraderT], *, timeout: float | None = None, **options: Any
    ) -> _GraderT:
        """Build the grader from the caller's options, passing only those it takes.

        This is how every caller (``agentrl rollout``, slime, ``agentrl check-tasks``)
        builds a grader. ``timeout`` is the grading budget in seconds (``None``: the
        grader's own default, see :func:`grade_timeout`). Options the constructor does not
        accept (no parameter of that name, no ``**kwargs``) are left out with a warning, so
        a grader without a ``timeout`` parameter still loads. Override it to map the
        options another way.
        """
        given = dict(options)
        if timeout is not None:
            given["timeout"] = timeout
        accepted = keyword_parameters(cls)
        if accepted is None:  # **kwargs: every option is taken
            return cls(**given)
        for option in sorted(set(given) - accepted):
            if (cls, option) not in _ignored_reported:
                _ignored_reported.add((cls, option))
                logger.warning(
                    "grader %r (%s.%s) takes no %r option; ignoring it",
                    getattr(cls, "name", cls.__qualname__),
                    cls.__module__,
                    cls.__qualname__,
                    option,
                )
        return cls(**{k: v for k, v in given.items() if k in accepted})

    @classmethod
    def claims(cls, row: Mapping[str, Any]) -> bool:
        """Whether ``row`` is in this grader's format, for ``auto`` grader selection.

        ``detect_grader`` asks every registered grader (plugins first) and takes the first
        that claims the row; a row nobody claims goes to ``scaleswe``. The default claims
        nothing: such a grader is chosen by name only. It must not raise on odd rows.
        """
        return False

    @abc.abstractmethod
    def parse_task(self, row: Mapping[str, Any]) -> Task:
        """Parse one JSONL row into a Task; raise ``ValueError`` naming the bad field."""

    def resolve_paths(self, task: Task, base_dir: pathlib.Path | None) -> Task:
        """``task`` with relative host paths (``repo``, gold patch) resolved against ``base_dir``.

        Called by ``load_tasks`` with the JSONL file's directory; graders with more host
        paths extend it.
        """
        if base_dir is None:
            return task
        metadata = dict(task.metadata)
        if metadata.get("gold_patch_path"):
            metadata["gold_patch_path"] = resolve_host_path(metadata["gold_patch_path"], base_dir)
        repo = task.repo
        if is_host_path(repo):
            repo = resolve_host_path(repo, base_dir)
        return attrs.evolve(task, repo=repo, metadata=metadata)

    def check(self, task: Task) -> str | None:
        """Why ``task`` cannot be graded, or ``None`` when it can."""
        return None

    async def prepare(self, sandbox: Sandbox, task: Task) -> dict[str, Any]:
        """Bring a started sandbox's workspace to the task's base; returns what it ran.

        Run in the agent's sandbox before the agent starts and in the grading sandbox
        before the diff is applied, so the diff applies to the same base it was made on.
        """
        return {}

    def base_commit(self, task: Task) -> str | None:
        """The commit the agent's workspace starts from, when the task names one.

        The agent's repository keeps only the history reachable from it (``None``: from
        HEAD once :meth:`prepare` ran); see ``agentrl.harnesses.history``.
        """
        return None

    # -- the grading pipeline ----------------------------------------------------------------
    async def grade(
        self,
        task: Task,
        diff: str,
        sandbox_factory: SandboxFactory,
        *,
        booter: Booter | None = None,
    ) -> Grade:
        """Apply ``diff`` in a fresh sandbox and grade it; errors become ``Grade.error``.

        One pipeline for every grader: :meth:`check` (in a thread: it may block), a fresh
        sandbox from ``sandbox_factory`` started by ``booter`` (retry, boot timeout and the
        shared boot semaphore; default :class:`Booter`), :meth:`setup`, :meth:`apply`, and
        :meth:`evaluate` under the grading budget. A refused task is :func:`cannot_grade`,
        a diff that does not apply is a reward of 0 with ``applied_cleanly=False``, tests
        past the budget are :func:`grading_timed_out`, anything that breaks is
        :func:`grader_failed`; the sandbox is always closed. A failure once a non-empty
        diff reached the sandbox (its apply included) is attributed by the control (:meth:`_attribute`): the diff's doing
        (reward 0, no error) unless the empty diff fails too. Subclasses write the steps.
        """
        reason = await asyncio.to_thread(self.check, task)
        if reason:
            return cannot_grade(reason)
        details: dict[str, Any] = {}
        # From the moment the diff reaches the grading sandbox, a failure may be its doing.
        reached = applied = False
        try:
            async with fresh_sandbox(sandbox_factory, task, booter=booter) as sandbox:
                details.update(await self.setup(sandbox, task))
                reached = bool(diff.strip())
                patch = await self.apply(sandbox, task, diff)
                details["patch_method"] = patch.method
                if patch.restored:
                    details["restored_test_files"] = list(patch.restored)
                if not patch.applied:
                    details["apply_log"] = patch.log[-self.log_tail :]
                    return Grade(reward=0.0, solved=False, applied_cleanly=False, details=details)
                applied = True
                if suspicious := self.screen(task, patch, details):
                    return suspicious
                grade = await self._evaluate_in_budget(sandbox, task, diff, details)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning("grading %s failed: %r", task.instance_id, exc)
            grade = attrs.evolve(grader_failed(exc, details), applied_cleanly=applied)
        if grade.error is None or not reached:
            return grade
        return await self._attribute(task, grade, sandbox_factory, booter)

    async def _attribute(
        self, task: Task, failed: Grade, sandbox_factory: SandboxFactory, booter: Booter | None
    ) -> Grade:
        """Whose failure ``failed`` is, a grade that broke once the diff reached the sandbox.

        The control — the empty diff graded by this grader on the same task, once per task
        and kept while it succeeds — decides: when it grades without an error, the diff
        broke the grading (it deleted the grader's files, hung the tests, killed the
        runner), so the grade is the policy's: reward 0, no error, the failure recorded.
        Only a control that fails too leaves ``failed`` a grader error. The policy never
        picks its outcome class by breaking the grader.
        """
        control = await self._control(task, sandbox_factory, booter)
        details = dict(failed.details)
        if control.error is not None:
            details["control"] = f"the empty diff fails too: {control.error}"
            return attrs.evolve(failed, details=details)
        details["grading_failure"] = failed.error
        details["control"] = "the empty diff grades without error: the failure is the diff's"
        logger.info(
            "%s: grading failed after the diff applied (%s); the control grades, so it is "
            "the diff's doing",
            task.instance_id,
            failed.error,
        )
        return Grade(
            reward=0.0, solved=False, applied_cleanly=failed.applied_cleanly, details=details
        )

    async def _control(
        self, task: Task, sandbox_factory: SandboxFactory, booter: Booter | None
    ) -> Grade:
        """The grade of the empty diff on ``task``: one run at a time per task, a success
        kept for the grader's life (a failure is tried again next time: it may pass)."""
        controls: dict[str, Grade] = self.__dict__.setdefault("_controls", {})
        # A lock belongs to one event loop; a grader may outlive its loop (check-tasks).
        locks: dict[tuple[int, str], asyncio.Lock] = self.__dict__.setdefault("_locks", {})
        key = (id(asyncio.get_running_loop()), task.instance_id)
        lock = locks.setdefault(key, asyncio.Lock())
        async with lock:
            kept = controls.get(task.instance_id)
            if kept is not None:
                return kept
            grade = await self.grade(task, "", sandbox_factory, booter=booter)
            if grade.error is None:
                controls[task.instance_id] = grade
            return grade

    async def _evaluate_in_budget(
        self, sandbox: Sandbox, task: Task, diff: str, details: dict[str, Any]
    ) -> Grade:
        # The graders time their test runs themselves; this backstop ends an evaluation
        # whose sandbox stopped answering.
        evaluation = asyncio.ensure_future(self.evaluate(sandbox, task, diff, details))
        try:
            await asyncio.wait({evaluation}, timeout=self.timeout + EVALUATE_MARGIN)
        finally:
            if not evaluation.done():
                evaluation.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await evaluation
        if evaluation.cancelled():
            return grading_timed_out(self.timeout, details)
        return evaluation.result()

    async def setup(self, sandbox: Sandbox, task: Task) -> dict[str, Any]:
        """Ready the started grading sandbox for the diff; returns what goes in the details.

        By default :meth:`prepare`, so the diff applies to the base it was made on.
        """
        return dict(await self.prepare(sandbox, task))

    async def apply(self, sandbox: Sandbox, task: Task, diff: str) -> PatchOutcome:
        """Apply ``diff`` in the workdir with :meth:`patch_ladder`; what it changed in
        :meth:`protected_paths` or in any task's test infrastructure is put back."""
        return await apply_patch(
            sandbox,
            task.workdir,
            diff,
            ladder=await self.patch_ladder(),
            protect=await asyncio.to_thread(self.protected_paths, task),
            user=self.user,
        )

    def screen(self, task: Task, patch: PatchOutcome, details: dict[str, Any]) -> Grade | None:
        """Record what :meth:`apply` dropped, then run the suspicious-edit guard on the tree's
        final change: a hit is the Grade (reward 0, ``suspicious`` set) and no test runs.

        Test files (:meth:`protected_paths` and the default test patterns) are not read;
        ``metadata.guard_allow`` names patterns the task allows (``agentrl.graders.guard``).
        """
        if patch.dropped:
            details["dropped"] = [d.to_dict() for d in patch.dropped]
        allow = task.metadata.get("guard_allow") or ()
        unknown = guard.unknown_names(allow)
        if unknown:
            logger.warning(
                "%s: metadata.guard_allow names no guard pattern: %s (known: %s)",
                task.instance_id,
                ", ".join(unknown),
                ", ".join(p.name for p in guard.PATTERNS),
            )
        findings = guard.scan(
            patch.tree_diff,
            allow=allow,
            test_patterns=(*self.protected_paths(task), *DEFAULT_TEST_PATTERNS),
            pytest_repo=patch.pytest_repo,
        )
        if not findings:
            return None
        logger.info("%s: suspicious edits, tests not run: %s", task.instance_id, findings[:5])
        return Grade(reward=0.0, solved=False, suspicious=findings, details=details)

    async def patch_ladder(self) -> Sequence[str]:
        """The apply commands to try in order (see ``agentrl.graders.patching``)."""
        return SCALESWE_LADDER

    def protected_paths(self, task: Task) -> Sequence[str]:
        """The task's test paths (globs, directories) a diff may not change during grading;
        none by default. Every task's test infrastructure (``conftest.py``, runner config,
        ``.pth``, … see ``agentrl.graders.protection``) is protected on top of these."""
        return ()

    async def run_tests(self, sandbox: Sandbox, task: Task, command: str) -> ExecResult:
        """Run ``command`` in the workdir as :attr:`user` under the grading budget.

        A run past :attr:`timeout` is killed and comes back with exit code
        ``EXIT_TIME_BUDGET_EXCEEDED`` (grade it with :func:`grading_timed_out`).
        """
        return await exec_and_wait(
            sandbox, command, time_budget=self.timeout, user=self.user, workdir=task.workdir
        )

    async def evaluate(
        self, sandbox: Sandbox, task: Task, diff: str, details: dict[str, Any]
    ) -> Grade:
        """Run the tests on the applied diff and grade them; ``details`` has what ran so far.

        Called under the grading budget (``timeout`` plus a margin for reading results);
        every grader that uses the shared :meth:`grade` writes this.
        """
        raise NotImplementedError(
            f"grader {self.name!r} ({type(self).__qualname__}) implements neither evaluate() "
            "nor grade()"
        )
