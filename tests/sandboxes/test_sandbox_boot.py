"""The one boot loop: retry with a new sandbox, a boot timeout, and one semaphore for the
agent's and the grader's boots."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from agentrl.graders.base import Grader, grade_diff
from agentrl.retry import RetryPolicy
from agentrl.sandboxes.base import Sandbox, SandboxError
from agentrl.sandboxes.boot import Booter, BootError, current_boot_key
from agentrl.types import ExecResult, Grade, Task

TASK = Task(instance_id="t-1", problem_statement="")
FAST = RetryPolicy(attempts=3, base=0.001, cap=0.002)


class Starts:
    """Counts the sandboxes starting at once, and how many starts and closes there were."""

    def __init__(self, until: int = 0) -> None:
        #: Each start waits (up to 5 s) until this many were active at once.
        self.until = until
        self.all_in = asyncio.Event()
        self.active = self.peak = self.started = self.closed = 0
        self.built: list[CountingSandbox] = []
        self.entered = asyncio.Event()


class CountingSandbox(Sandbox):
    """A sandbox double whose ``start`` takes a few loop turns and may fail or hang."""

    name = "counting"

    def __init__(self, starts: Starts, failure: BaseException | None = None, hang=False) -> None:
        self.starts, self.failure, self.hang = starts, failure, hang
        self.closed = False
        starts.built.append(self)

    @classmethod
    def from_task(cls, task, **options):
        raise NotImplementedError

    async def start(self) -> None:
        starts = self.starts
        starts.active += 1
        starts.peak = max(starts.peak, starts.active)
        starts.entered.set()
        try:
            for _ in range(5):  # let every other boot that can start now do so
                await asyncio.sleep(0)
            if starts.peak >= starts.until:
                starts.all_in.set()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(starts.all_in.wait(), 5)
            if self.hang:
                await asyncio.Event().wait()
            if self.failure is not None:
                raise self.failure
            starts.started += 1
        finally:
            starts.active -= 1

    async def aclose(self) -> None:
        self.closed = True
        self.starts.closed += 1

    async def exec(self, cmd: str, **options: object) -> ExecResult:
        raise AssertionError(f"nothing runs in a counting sandbox ({cmd!r})")

    async def write_file(self, path, content, *, user="root"):
        raise AssertionError("nothing is written to a counting sandbox")

    async def read_file(self, path, *, user="root", text=True):
        raise AssertionError("nothing is read from a counting sandbox")

    def url_for(self, host: str, port: int) -> str:
        return f"http://{host}:{port}"


def factory_of(starts: Starts, *failures: BaseException | None, hang: bool = False):
    """A factory whose n-th sandbox fails its start with ``failures[n]`` (then none fail)."""
    left = list(failures)

    def factory(task: Task) -> CountingSandbox:
        return CountingSandbox(starts, left.pop(0) if left else None, hang=hang)

    return factory


async def test_every_attempt_of_one_boot_sees_the_same_boot_key():
    """The boot's key is current in every attempt's start (for idempotent creates), is
    another one for the next boot, and is gone once the boot returns."""
    seen = []

    class KeyedSandbox(CountingSandbox):
        async def start(self) -> None:
            seen.append(current_boot_key().value)
            await super().start()

    starts = Starts()
    failing = iter([SandboxError("one"), SandboxError("two"), None, None])
    factory = lambda task: KeyedSandbox(starts, next(failing))  # noqa: E731
    await Booter(policy=FAST).boot(factory, TASK)
    await Booter(policy=FAST).boot(factory, TASK)
    assert len(seen) == 4 and len(set(seen[:3])) == 1 and seen[3] != seen[0]
    assert current_boot_key() is None


class PipelineGrader(Grader):
    """A grader on the shared pipeline that solves every (empty) diff without running anything."""

    name = "pipeline"

    def parse_task(self, row):
        raise NotImplementedError

    async def evaluate(self, sandbox, task, diff, details):
        return Grade(reward=1.0, solved=True, details=details)


class OwnGradeGrader(PipelineGrader):
    """A grader written for the older contract: it overrides grade() with three arguments."""

    name = "own-grade"

    async def grade(self, task, diff, sandbox_factory):
        return Grade(reward=0.5, solved=False)


async def test_a_failed_boot_is_retried_with_a_new_sandbox():
    """Two failed starts, then one that works: three sandboxes built, the failed two closed."""
    starts = Starts()
    booter = Booter(policy=FAST)
    factory = factory_of(starts, SandboxError("pull failed"), OSError("no space"))
    sandbox = await booter.boot(factory, TASK)
    assert sandbox is starts.built[2] and not sandbox.closed
    assert [s.closed for s in starts.built] == [True, True, False]


async def test_every_attempt_failing_is_a_boot_error_naming_each_attempt():
    """All attempts fail: BootError lists each one; ``last`` is the final error."""
    starts = Starts()
    error = SandboxError("pull failed")
    with pytest.raises(BootError) as caught:
        await Booter(policy=FAST).boot(factory_of(starts, error, error, error), TASK, what="box")
    assert str(caught.value) == (
        "the box did not boot (3 attempt(s)): attempt 1: SandboxError: pull failed; "
        "attempt 2: SandboxError: pull failed; attempt 3: SandboxError: pull failed"
    )
    assert caught.value.last is error and starts.closed == 3


async def test_an_error_that_is_not_a_boot_failure_is_not_retried():
    """A bug (ValueError) in a start fails the boot after one attempt."""
    starts = Starts()
    with pytest.raises(BootError) as caught:
        await Booter(policy=FAST).boot(factory_of(starts, ValueError("bad option")), TASK)
    assert caught.value.attempts == ("attempt 1: ValueError: bad option",)
    assert len(starts.built) == 1 and starts.closed == 1


async def test_a_start_past_the_boot_timeout_is_retried_then_fails():
    """Starts that hang past ``timeout`` are closed and retried; the error says why."""
    starts = Starts()
    booter = Booter(policy=RetryPolicy(attempts=2, base=0.001), timeout=0.05)
    with pytest.raises(BootError, match=r"attempt 2: TimeoutError: no start within 0\.05s"):
        await booter.boot(factory_of(starts, hang=True), TASK)
    assert len(starts.built) == 2 and starts.closed == 2


async def test_a_cancelled_boot_closes_its_sandbox():
    """Cancelling a boot mid-start closes the sandbox being started."""
    starts = Starts()
    boot = asyncio.create_task(Booter(policy=FAST).boot(factory_of(starts, hang=True), TASK))
    await starts.entered.wait()
    boot.cancel()
    with pytest.raises(asyncio.CancelledError):
        await boot
    assert starts.built[0].closed


async def test_agent_and_grading_boots_share_the_boot_semaphore():
    """Six agent boots and six gradings on one booter with a semaphore of 2: never more than
    two sandboxes start at once, and every grading sandbox was started and closed."""
    starts = Starts()
    booter = Booter(policy=FAST, semaphore=asyncio.Semaphore(2))
    factory = factory_of(starts)
    grader = PipelineGrader()
    results = await asyncio.gather(
        *(booter.boot(factory, TASK, what="agent sandbox") for _ in range(6)),
        *(grade_diff(grader, TASK, "", factory, booter=booter) for _ in range(6)),
    )
    assert starts.started == 12 and starts.peak == 2
    assert [g.reward for g in results[6:]] == [1.0] * 6
    assert starts.closed == 6  # the grading sandboxes; the agent's are the caller's to close


async def test_without_a_shared_semaphore_the_boots_overlap():
    """The same twelve boots unbounded start together (what the semaphore prevents): each
    waits, up to 5 s, for all twelve to be starting (a grading boot reaches its start a few
    steps later, in real time, on a loaded machine)."""
    starts = Starts(until=12)
    booter = Booter(policy=FAST)
    factory = factory_of(starts)
    await asyncio.gather(
        *(booter.boot(factory, TASK) for _ in range(6)),
        *(grade_diff(PipelineGrader(), TASK, "", factory, booter=booter) for _ in range(6)),
    )
    assert starts.peak == 12


async def test_a_grader_overriding_grade_gets_the_older_three_arguments():
    """grade_diff calls an overriding grade(task, diff, factory) the way it was written."""
    grade = await grade_diff(OwnGradeGrader(), TASK, "", factory_of(Starts()), booter=Booter())
    assert grade.reward == 0.5


async def test_a_grading_boot_failure_is_the_last_errors_grader_failed_grade():
    """A grading sandbox that never boots: grader_failed naming the last attempt's error."""
    starts = Starts()
    error = SandboxError("image pull denied")
    grade = await PipelineGrader().grade(
        TASK, "", factory_of(starts, error, error, error), booter=Booter(policy=FAST)
    )
    assert grade.error == "grader failed: SandboxError: image pull denied"
    assert (grade.reward, grade.applied_cleanly, starts.closed) == (0.0, False, 3)
