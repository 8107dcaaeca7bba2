"""Grade each task's gold and empty patch to find broken tasks (``agentrl check-tasks``).

A well-formed task is gradable, its gold patch solves it, the empty patch does not, and
both say so the same way on every run. Anything else (gold fails, empty passes, a grader
error, a result that changes between runs) marks the task broken, so it can be dropped
before training. A gold patch whose tests could not even run (pytest missing, a command not
found, nothing collected) is told apart from one whose tests ran and failed: the first is
the sandbox's fault, the second the task's.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from agentrl.graders.base import Grader, SandboxFactory
from agentrl.graders.tasks import TaskLoadError, TaskRow, gold_patch
from agentrl.sandboxes.base import Sandbox, SandboxError
from agentrl.sandboxes.images import ImageReport
from agentrl.types import Grade, Task

__all__ = [
    "MISSING_IMAGE",
    "SandboxFactoryFor",
    "TaskCheck",
    "check_task",
    "check_tasks",
    "images_of",
    "output_tail",
    "sandbox_factory_for",
    "why_tests_did_not_run",
]

logger = logging.getLogger(__name__)

OK = "ok"
BROKEN = "broken"
UNCHECKED = "unchecked"
#: The task's image is not where the sandbox backend looks (a ``docker`` daemon without it).
MISSING_IMAGE = "missing-image"

#: How many characters of a grade's output check-tasks keeps (``--json``) and shows (``-v``).
TAIL_CHARS = 2000


@attrs.frozen(kw_only=True)
class TaskCheck:
    """The verdict on one task, with the rewards of every gold and empty run."""

    instance_id: str
    source: str
    status: str
    reasons: tuple[str, ...] = ()
    gold_rewards: tuple[float, ...] = ()
    empty_rewards: tuple[float, ...] = ()
    #: The end of the output of the grade that made the task broken, when it kept any.
    output_tail: str | None = None
    #: The image the task boots from (``Sandbox.task_images``, as the rollout decides it),
    #: when the backend holds images, and whether it is missing (also for a broken task).
    image: str | None = None
    image_missing: bool = False

    @property
    def broken(self) -> bool:
        return self.status == BROKEN

    @property
    def missing_image(self) -> bool:
        return self.status == MISSING_IMAGE

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance_id": self.instance_id,
            "source": self.source,
            "status": self.status,
            "reasons": list(self.reasons),
            "gold_rewards": list(self.gold_rewards),
            "empty_rewards": list(self.empty_rewards),
            "output_tail": self.output_tail,
            "image": self.image,
            "image_missing": self.image_missing,
        }


def output_tail(grade: Grade) -> str:
    """The end of what grading printed: the tests' output, else the patch log ('' if none)."""
    for key in ("output_tail", "log_tail", "apply_log"):
        text = grade.details.get(key)
        if isinstance(text, str) and text.strip():
            return text[-TAIL_CHARS:]
    return ""


_PYTEST_MISSING = re.compile(
    r"No module named '?pytest'?$|\bpytest: (?:command )?not found$", re.MULTILINE
)
#: A test runner's summary: tests ran (pytest's "1 failed, 2 passed", unittest's "Ran 3 tests").
_TESTS_RAN = re.compile(r"\b\d+ (?:passed|failed)\b|^Ran \d+ tests? in ", re.MULTILINE)
#: What a shell's exit code says when the test command itself could not run.
_EXIT_MEANINGS: dict[int, tuple[str, re.Pattern[str]]] = {
    127: ("a command was not found", re.compile(r"not found$|No such file or directory$", re.M)),
    126: ("a command could not be executed", re.compile(r"Permission denied$|cannot exec", re.M)),
}
#: Output that means the tests never ran, in the order it is looked for.
_CANNOT_RUN_OUTPUT: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("a command was not found", re.compile(r"command not found$|: not found$", re.M)),
    ("the test file is missing", re.compile(r"can't open file")),
    ("a module is missing", re.compile(r"No module named '?[\w.]+'?$", re.M)),
    (
        "the tests could not be collected, none ran",
        re.compile(
            r"errors? during collection|^ERROR collecting|no tests ran|collected 0 items", re.M
        ),
    ),
)


def _exit_code(grade: Grade) -> Any:
    """The test command's exit code as the grader recorded it (scaleswe or swebench key)."""
    return grade.details.get("exit_code", grade.details.get("eval_exit_code"))


def _last_line(pattern: re.Pattern[str], text: str) -> str | None:
    """The line holding ``pattern``'s last match in ``text`` (at most 200 characters)."""
    matches = list(pattern.finditer(text))
    if not matches:
        return None
    start = text.rfind("\n", 0, matches[-1].start()) + 1
    end = text.find("\n", matches[-1].end())
    line = text[start : end if end >= 0 else len(text)].strip()
    return line if len(line) <= 200 else line[:197] + "..."


def why_tests_did_not_run(grade: Grade) -> str | None:
    """Why ``grade``'s test command could not run at all, or ``None`` when the tests ran.

    Read from the exit code (127: command not found, 126: not executable) and the output
    tail (``No module named pytest``, a shell's "not found", collection errors with no
    test run). A runner summary counting passed or failed tests means the tests ran.
    """
    exit_code = _exit_code(grade)
    tail = output_tail(grade)
    line = _last_line(_PYTEST_MISSING, tail)
    if line:
        return (
            f"pytest is missing in the sandbox's Python ({line}); install it in the task's "
            "image, or for image-less local tasks in the Python that runs agentrl "
            "(--host-python binds it in)"
        )
    if exit_code in _EXIT_MEANINGS:
        meaning, pattern = _EXIT_MEANINGS[exit_code]
        line = _last_line(pattern, tail)
        return f"{meaning} (exit {exit_code})" + (f": {line}" if line else "")
    if _TESTS_RAN.search(tail):
        return None
    for meaning, pattern in _CANNOT_RUN_OUTPUT:
        line = _last_line(pattern, tail)
        if line:
            return f"{meaning}: {line}"
    return None


def _how_it_failed(grade: Grade) -> str:
    details = grade.details
    f2p, p2p = details.get("fail_to_pass"), details.get("pass_to_pass")
    if isinstance(f2p, Mapping) and isinstance(p2p, Mapping):
        return (
            f" (fail_to_pass {f2p.get('passed')}/{f2p.get('total')} passed, "
            f"pass_to_pass {p2p.get('passed')}/{p2p.get('total')})"
        )
    exit_code = _exit_code(grade)
    return f" (exit {exit_code})" if exit_code is not None else ""


def _describe(kind: str, grades: Sequence[Grade], want_solved: bool) -> tuple[str, Grade] | None:
    """What is wrong with the ``kind`` patch's grades, and the grade that shows it."""
    for grade in grades:
        if grade.error:
            return f"grader error on the {kind} patch: {grade.error}", grade
    if kind == "gold":
        for grade in grades:
            if not grade.applied_cleanly:
                return "the gold patch does not apply", grade
    solved = [g.solved for g in grades]
    if len(set(solved)) > 1:
        shown = next(g for g in grades if g.solved != want_solved)
        return f"flaky: the {kind} patch solved {sum(solved)} of {len(solved)} runs", shown
    if want_solved and not solved[0]:
        problem = why_tests_did_not_run(grades[0])
        if problem:
            return f"the test command could not run on the gold patch: {problem}", grades[0]
        reason = "the gold patch does not solve the task: the tests ran and failed"
        return reason + _how_it_failed(grades[0]), grades[0]
    if not want_solved and solved[0]:
        return "the empty patch solves the task (the tests do not detect the bug)", grades[0]
    return None


#: ``check_task``'s ``images`` when the caller has not asked the backend: it asks itself.
ASK = object()


async def check_task(
    row: TaskRow,
    grader: Grader,
    sandbox_factory: SandboxFactory,
    *,
    runs: int = 2,
    images: Any = ASK,
) -> TaskCheck:
    """Grade ``row``'s gold and empty patch ``runs`` times each and judge the task.

    ``images``: the backend's ``ImageReport`` covering the task (``check_tasks`` asks once
    for all rows), None when the backend holds no images, the reason it could not be
    asked, or ``ASK`` (the default) to ask the factory for this task alone. A task the
    grader turns down is broken, with its missing image (if any) named too; a gradable
    task whose image is missing is ``missing-image`` and not graded.
    """
    task = row.task
    source = f"{row.source}:{row.line}"
    if images is ASK:
        images = await images_of(sandbox_factory, [task])
    if isinstance(images, str):
        image, image_problem = None, images
    elif isinstance(images, ImageReport):
        need = images.need_of(task.instance_id)
        image = need.name if need is not None else None
        image_problem = images.problem_of(task.instance_id)
    else:
        image, image_problem = None, None
    image_facts = {"image": image, "image_missing": image_problem is not None}
    reason = await asyncio.to_thread(grader.check, task)
    if reason:
        reasons = (reason, image_problem) if image_problem else (reason,)
        return TaskCheck(
            instance_id=task.instance_id,
            source=source,
            status=BROKEN,
            reasons=reasons,
            **image_facts,
        )
    if image_problem:
        return TaskCheck(
            instance_id=task.instance_id,
            source=source,
            status=MISSING_IMAGE,
            reasons=(image_problem,),
            **image_facts,
        )
    try:
        gold = gold_patch(task)
    except TaskLoadError as exc:
        return TaskCheck(
            instance_id=task.instance_id,
            source=source,
            status=BROKEN,
            reasons=(str(exc),),
            **image_facts,
        )
    if not gold:
        return TaskCheck(
            instance_id=task.instance_id,
            source=source,
            status=UNCHECKED,
            reasons=("no gold patch (metadata.gold_patch or gold_patch_path): not graded",),
            **image_facts,
        )
    gold_grades: list[Grade] = []
    empty_grades: list[Grade] = []
    for _ in range(runs):
        gold_grades.append(await grader.grade(task, gold, sandbox_factory))
        empty_grades.append(await grader.grade(task, "", sandbox_factory))
    found = [
        problem
        for problem in (
            _describe("gold", gold_grades, True),
            _describe("empty", empty_grades, False),
        )
        if problem is not None
    ]
    tails = [output_tail(grade) for _, grade in found]
    return TaskCheck(
        instance_id=task.instance_id,
        source=source,
        status=BROKEN if found else OK,
        reasons=tuple(reason for reason, _ in found),
        gold_rewards=tuple(g.reward for g in gold_grades),
        empty_rewards=tuple(g.reward for g in empty_grades),
        output_tail=next((tail for tail in tails if tail), None),
        **image_facts,
    )


async def check_tasks(
    rows: Sequence[TaskRow],
    graders: Mapping[str, Grader],
    sandbox_factory: SandboxFactory,
    *,
    runs: int = 2,
    concurrency: int = 2,
    on_done: Callable[[TaskCheck], None] | None = None,
) -> list[TaskCheck]:
    """``check_task`` for every row with its task's grader (``graders`` by name), at most
    ``concurrency`` at a time; results come in row order. The backend is asked once, for
    all rows, which images are missing (``images_of``)."""
    gate = asyncio.Semaphore(max(1, concurrency))
    images = await images_of(sandbox_factory, [row.task for row in rows])

    async def one(row: TaskRow) -> TaskCheck:
        async with gate:
            grader = graders[row.task.grader]
            result = await check_task(row, grader, sandbox_factory, runs=runs, images=images)
        if on_done is not None:
            on_done(result)
        return result

    return list(await asyncio.gather(*(one(row) for row in rows)))


async def images_of(
    sandbox_factory: SandboxFactory, tasks: Sequence[Task]
) -> ImageReport | str | None:
    """The factory's ``image_report`` of ``tasks`` (one question to the backend), None when
    the factory or its backend holds no images, or why the backend could not be asked."""
    report = getattr(sandbox_factory, "image_report", None)
    if report is None:
        return None
    try:
        return await report(tasks)
    except SandboxError as exc:
        return f"cannot ask the sandbox backend for its images: {exc}"


@attrs.define
class SandboxFactoryFor:
    """A ``SandboxFactory`` of ``sandbox_cls`` with ``options``, which can also say, without
    booting, which images tasks need and which the backend lacks (``image_report``)."""

    sandbox_cls: type[Sandbox]
    options: dict[str, Any]

    def __call__(self, task: Task) -> Sandbox:
        return self.sandbox_cls.from_task(task, **self.options)

    async def image_report(self, tasks: Sequence[Task]) -> ImageReport | None:
        """The backend's ``Sandbox.image_report(tasks, **options)``: the images the tasks
        need and which it lacks (the ``docker`` sandbox lists its daemon's images once)."""
        return await self.sandbox_cls.image_report(tasks, **self.options)


def sandbox_factory_for(
    name: str, *, host_python: bool = True, options: Mapping[str, Any] | None = None
) -> SandboxFactoryFor:
    """A factory building a fresh ``name`` sandbox per task (this machine's Python bound in
    for image-less tasks when ``host_python`` and the backend can: ``Sandbox.with_host_python``)."""
    from agentrl.plugins import get_sandbox

    sandbox_cls = get_sandbox(name)
    extra = dict(options or {})
    if host_python:
        extra = {**getattr(sandbox_cls, "with_host_python", {}), **extra}
    return SandboxFactoryFor(sandbox_cls, extra)
