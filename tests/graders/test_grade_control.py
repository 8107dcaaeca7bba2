"""Whose failure a broken grade is: the empty-diff control of ``Grader.grade``.

The grader double runs the shared pipeline for real (check, boot through a ``Booter``, setup,
apply, evaluate, the control); only its sandbox is a double that runs nothing, and its
``apply``/``evaluate`` steps are scripted per diff.
"""

from __future__ import annotations

import asyncio

from agentrl.graders.base import Grader
from agentrl.graders.patching import PatchOutcome
from agentrl.retry import RetryPolicy
from agentrl.sandboxes.base import Sandbox, SandboxError
from agentrl.sandboxes.boot import Booter
from agentrl.types import ExecResult, Grade, Task

TASK = Task(instance_id="control-1", problem_statement="")
OTHER = Task(instance_id="control-2", problem_statement="")
FAST = Booter(policy=RetryPolicy(attempts=1, base=0.001, cap=0.001))


class IdleSandbox(Sandbox):
    """A sandbox double: it starts and closes, and nothing may run in it."""

    name = "idle"

    @classmethod
    def from_task(cls, task, **options):
        return cls()

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        return None

    async def exec(self, cmd: str, **options: object) -> ExecResult:
        raise AssertionError(f"nothing runs in an idle sandbox ({cmd!r})")

    async def write_file(self, path, content, *, user="root"):
        raise AssertionError("nothing is written to an idle sandbox")

    async def read_file(self, path, *, user="root", text=True):
        raise AssertionError("nothing is read from an idle sandbox")

    def url_for(self, host: str, port: int) -> str:
        return f"http://{host}:{port}"


class ScriptedGrader(Grader):
    """Evaluates each diff by a script: ``"ok"`` grades, ``"raise"`` raises a sandbox
    error, ``"error"`` returns a grade with an error; the empty diff follows ``control``
    (a list consumed one grade at a time). ``apply_fails`` makes applying raise."""

    name = "scripted-control"

    def __init__(self, control=("ok",), apply_fails=False) -> None:
        self.control = list(control)
        self.apply_fails = apply_fails
        self.evaluated: list[str] = []

    def parse_task(self, row):
        raise NotImplementedError

    async def apply(self, sandbox, task, diff):
        if self.apply_fails and diff:
            raise SandboxError("applying the patch took longer than 300s")
        return PatchOutcome(applied=True, method="scripted" if diff else "empty")

    async def evaluate(self, sandbox, task, diff, details):
        self.evaluated.append(diff)
        step = self.control.pop(0) if not diff else diff
        if step == "raise":
            raise SandboxError("the grader's work dir is gone")
        if step == "error":
            return Grade(reward=0.0, solved=False, error="grading timed out after 20s")
        return Grade(reward=0.0, solved=False, details=details)


def grade(grader: Grader, diff: str, task: Task = TASK) -> Grade:
    return asyncio.run(grader.grade(task, diff, IdleSandbox.from_task, booter=FAST))


def test_a_diff_that_breaks_grading_is_the_policys_failure():
    """The diff's evaluation raises; the empty diff grades cleanly: reward 0, no error, the
    failure and the control's verdict recorded — trainable, not a grader error."""
    grader = ScriptedGrader()
    result = grade(grader, "raise")
    assert result.error is None and result.reward == 0.0 and not result.solved
    assert "work dir is gone" in result.details["grading_failure"]
    assert "the failure is the diff's" in result.details["control"]
    assert grader.evaluated == ["raise", ""]


def test_a_grade_with_an_error_after_apply_is_attributed_too():
    """A grade that came back with an error (a timed-out test run) is the diff's when the
    control grades."""
    result = grade(ScriptedGrader(), "error")
    assert result.error is None and result.details["grading_failure"].startswith("grading timed")


def test_a_failure_while_applying_is_attributed():
    """Applying the diff raised (the diff reached the sandbox): the control decides."""
    result = grade(ScriptedGrader(apply_fails=True), "diff")
    assert result.error is None and "took longer" in result.details["grading_failure"]


def test_only_a_control_that_fails_too_leaves_a_grader_error():
    """When the empty diff fails as well, the grading is broken: the error stays, with the
    control's failure recorded."""
    result = grade(ScriptedGrader(control=["raise"]), "raise")
    assert result.error is not None and "work dir is gone" in result.error
    assert result.details["control"].startswith("the empty diff fails too")


def test_the_empty_diff_itself_is_never_attributed():
    """A failure grading the empty diff is a grader error (no control runs for it)."""
    grader = ScriptedGrader(control=["raise"])
    result = grade(grader, "")
    assert result.error is not None and grader.evaluated == [""]


def test_a_succeeding_control_is_kept_per_task_and_a_failed_one_is_tried_again():
    """The control runs once per task while it succeeds; a failed control is not kept."""
    grader = ScriptedGrader(control=["raise", "ok", "ok"])
    assert grade(grader, "raise").error is not None  # the control failed: not kept
    assert grade(grader, "raise").error is None  # tried again: it grades, kept
    assert grade(grader, "raise").error is None  # kept: no third control run
    assert grader.evaluated.count("") == 2
    assert grade(grader, "raise", OTHER).error is None  # another task: its own control
    assert grader.evaluated.count("") == 3


def test_concurrent_failures_of_one_task_share_one_control():
    """Many rollouts of one task failing at once run the control once."""
    grader = ScriptedGrader(control=["ok"])

    async def main():
        return await asyncio.gather(
            *(grader.grade(TASK, "raise", IdleSandbox.from_task, booter=FAST) for _ in range(4))
        )

    results = asyncio.run(main())
    assert all(r.error is None for r in results) and grader.evaluated.count("") == 1


def test_a_clean_grade_runs_no_control():
    """A diff whose grade has no error is returned as it is, without a control."""
    grader = ScriptedGrader(control=[])
    result = grade(grader, "ok")
    assert result.error is None and "control" not in result.details
    assert grader.evaluated == ["ok"]


def test_an_attributed_grade_keeps_that_the_diff_applied():
    """The diff applied and the evaluation broke: applied_cleanly stays True; a failure
    while applying leaves it False."""
    assert grade(ScriptedGrader(), "raise").applied_cleanly
    assert not grade(ScriptedGrader(apply_fails=True), "diff").applied_cleanly
