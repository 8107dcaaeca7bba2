"""The grader contract: parse a task row, say if it can be graded, grade a diff."""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import os
import pathlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, ClassVar, TypeVar

import attrs

from agentrl.graders.tasks import resolve_host_path
from agentrl.plugin_options import keyword_parameters
from agentrl.sandboxes.base import Sandbox, SandboxError
from agentrl.types import Grade, Task

__all__ = [
    "DEFAULT_GRADE_TIMEOUT",
    "GRADE_DIR",
    "Grader",
    "SandboxFactory",
    "cannot_grade",
    "fresh_sandbox",
    "grade_timeout",
    "grader_failed",
    "grading_timed_out",
    "is_host_path",
    "sandbox_source_problem",
]

logger = logging.getLogger(__name__)

#: Builds a fresh (not yet started) sandbox for a task; graders never reuse the agent's.
SandboxFactory = Callable[[Task], Sandbox]

#: Grading files live here in the sandbox, away from the repository.
GRADE_DIR = "/tmp/agentrl-grade"

#: Seconds a grading run (the tests, not the sandbox boot) may take by default.
DEFAULT_GRADE_TIMEOUT = 600.0

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
    environ = os.environ if env is None else env
    for name in ("AGENTRL_GRADE_TIMEOUT", "AGENTRL_EVAL_TIMEOUT", "SWE_EVAL_TIMEOUT_SEC"):
        raw = environ.get(name, "").strip()
        if not raw:
            continue
        try:
            seconds = float(raw)
        except ValueError:
            raise ValueError(
                f"{name}={raw!r} is not a number of seconds; set it to e.g. 600"
            ) from None
        if seconds <= 0:
            raise ValueError(f"{name}={raw!r} must be a positive number of seconds")
        return seconds
    return DEFAULT_GRADE_TIMEOUT


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
    return Grade(reward=0.0, applied_cleanly=False, error=f"cannot grade: {reason}")


def grader_failed(exc: BaseException) -> Grade:
    """The grade when grading itself broke (sandbox, upload, spec), not the agent's diff."""
    return Grade(
        reward=0.0,
        applied_cleanly=False,
        error=f"grader failed: {type(exc).__name__}: {exc}",
    )


def grading_timed_out(timeout: float, details: dict[str, Any]) -> Grade:
    """The grade when the tests ran past the ``timeout`` seconds budget."""
    return Grade(
        reward=0.0,
        error=f"grading timed out after {timeout:g}s (raise AGENTRL_GRADE_TIMEOUT)",
        details=details,
    )


@contextlib.asynccontextmanager
async def fresh_sandbox(
    sandbox_factory: SandboxFactory, task: Task, *, boot_retries: int = 2, backoff: float = 0.5
) -> AsyncIterator[Sandbox]:
    """A new sandbox from ``sandbox_factory``, started and destroyed on exit.

    A failed boot is retried ``boot_retries`` times with a new sandbox: nothing has run
    in it yet, so a retry cannot change what is graded.
    """
    attempt = 0
    while True:
        sandbox = sandbox_factory(task)
        try:
            await sandbox.start()
            break
        except (SandboxError, OSError) as exc:
            await sandbox.aclose()
            if attempt >= boot_retries:
                raise
            attempt += 1
            logger.warning(
                "%s: grading sandbox failed to boot (%s); retry %d of %d",
                task.instance_id,
                exc,
                attempt,
                boot_retries,
            )
            await asyncio.sleep(backoff * attempt)
    try:
        yield sandbox
    finally:
        await sandbox.aclose()


class Grader(abc.ABC):
    """Grades an agent's diff in a fresh sandbox built from the task's image."""

    name: ClassVar[str]

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

    @abc.abstractmethod
    async def grade(self, task: Task, diff: str, sandbox_factory: SandboxFactory) -> Grade:
        """Apply ``diff`` in a fresh sandbox and grade it; errors become ``Grade.error``."""
