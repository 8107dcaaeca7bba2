"""Many rollouts: concurrency, resumable output files, progress and a summary.

The runner knows nothing of sandboxes or engines: it calls a ``rollout_fn(task, index)``
coroutine for every (task, sample index) not yet done and writes what comes back.

Output directory layout (``--out DIR``)::

    rollouts.jsonl          one line per finished rollout (outcome, reward, timings, paths)
    rollouts.failed.jsonl   earlier infra_error / grader_error lines of rollouts run again
    samples.jsonl           token-level training rows, one per TrainingSample (not in --eval)
    agent_logs/KEY.log      the agent CLI's own log (stream-json / --json output)
    diffs/KEY.diff          the agent's diff
    sessions/KEY.json       the task text and the middleware's facts of every turn (index,
                            sizes, finish reason, tool calls, parse status, timing), for
                            ``agentrl view``
    summary.json            the summary table's numbers (and the run's ``tokenizer``)

A rollout's samples are written before its ``rollouts.jsonl`` line, so that line is the
commit point: re-running resumes by skipping the keys already there and dropping sample
rows of rollouts that never committed. A committed ``infra_error`` or ``grader_error`` is
not done (unless ``keep_failed``): its line moves to ``rollouts.failed.jsonl`` and the
rollout runs again, as attempt 2, 3, … (its log and diff then get an ``.attempt-N``
suffix, so the failed attempt's files stay), leaving one line per rollout in
``rollouts.jsonl``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pathlib
import statistics
import time
import traceback
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import attrs

from agentrl.types import Outcome, Task

logger = logging.getLogger(__name__)

__all__ = ["FailedRollout", "RolloutJob", "RunSummary", "Runner", "rollout_key"]

ROLLOUTS_FILE = "rollouts.jsonl"
FAILED_FILE = "rollouts.failed.jsonl"
SAMPLES_FILE = "samples.jsonl"
SUMMARY_FILE = "summary.json"
LOGS_DIR, LOG_SUFFIX = "agent_logs", ".log"
DIFFS_DIR, DIFF_SUFFIX = "diffs", ".diff"
SESSIONS_DIR, SESSION_SUFFIX = "sessions", ".json"


def _staging_name(name: str) -> str:
    """Where a resume pass stages the rewrite of the JSONL file ``name`` (beside it)."""
    return f".{name}.resume"


#: Every file the runner writes at the top of ``out`` (the JSONL files' resume staging too).
OUTPUT_FILES = frozenset(
    {ROLLOUTS_FILE, FAILED_FILE, SAMPLES_FILE, SUMMARY_FILE}
    | {_staging_name(name) for name in (ROLLOUTS_FILE, SAMPLES_FILE)}
)
#: The runner's per-rollout directories, with the suffix of the files it writes there.
OUTPUT_DIRS = {LOGS_DIR: LOG_SUFFIX, DIFFS_DIR: DIFF_SUFFIX, SESSIONS_DIR: SESSION_SUFFIX}
#: Outcomes that say nothing about the policy: a resumed run does them again.
RETRIED_OUTCOMES = frozenset(o.value for o in Outcome if not o.trainable)


def rollout_key(instance_id: str, index: int) -> str:
    """The stable key of the ``index``-th rollout of a task (used for resuming)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in instance_id)
    return f"{safe}#{index}"


@attrs.frozen(kw_only=True)
class RolloutJob:
    """One rollout to run: a task and which of its samples this is."""

    task: Task
    index: int

    @property
    def key(self) -> str:
        return rollout_key(self.task.instance_id, self.index)


@attrs.define
class RunSummary:
    """Running totals for the progress display and the final table."""

    total: int = 0
    skipped: int = 0
    #: Jobs of this run that redo a committed infra_error / grader_error.
    retried: int = 0
    #: Rollouts of this run whose first dispatch was lost with its node or actor and that
    #: ran again elsewhere (a Ray run's rows say where, under ``rescheduled``).
    rescheduled: int = 0
    done: int = 0
    running: int = 0
    outcomes: Counter = attrs.field(factory=Counter)
    rewards: list[float] = attrs.field(factory=list)
    turns: list[int] = attrs.field(factory=list)
    tokens: list[int] = attrs.field(factory=list)
    phases: dict[str, list[float]] = attrs.field(factory=dict)
    started: float = attrs.field(factory=time.monotonic)

    def add(self, row: dict[str, Any]) -> None:
        self.done += 1
        self.outcomes[row["outcome"]] += 1
        if row.get("rescheduled"):
            self.rescheduled += 1
        if not row.get("remove_sample"):
            self.rewards.append(float(row["reward"]))
        self.turns.append(int(row.get("turns") or 0))
        self.tokens.append(int(row.get("sampled_tokens") or 0))
        for phase, seconds in (row.get("timings") or {}).items():
            self.phases.setdefault(phase, []).append(float(seconds))

    @property
    def solved(self) -> int:
        return self.outcomes[Outcome.SOLVED.value]

    @property
    def failed(self) -> int:
        return sum(n for o, n in self.outcomes.items() if not Outcome(o).trainable)

    @property
    def tokens_per_second(self) -> float:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return sum(self.tokens) / elapsed

    def to_dict(self) -> dict[str, Any]:
        graded = len(self.rewards)

        def mean(values: Sequence[float]) -> float | None:
            return statistics.fmean(values) if values else None

        return {
            "rollouts": self.done,
            "skipped_already_done": self.skipped,
            "retried": self.retried,
            "rescheduled": self.rescheduled,
            "solved": self.solved,
            "solve_rate": (self.solved / graded) if graded else None,
            "mean_reward": mean(self.rewards),
            "outcomes": dict(sorted(self.outcomes.items())),
            "mean_turns": mean(self.turns),
            "mean_sampled_tokens": mean(self.tokens),
            "mean_seconds_per_phase": {p: mean(v) for p, v in sorted(self.phases.items())},
        }


RolloutFn = Callable[[Task, int], Awaitable[Any]]


@attrs.frozen(kw_only=True)
class FailedRollout:
    """What the runner commits for a rollout whose ``rollout_fn`` raised: an ``infra_error``
    with the traceback as its agent log (the same row shape as ``RolloutResult.to_dict``)."""

    instance_id: str
    error: str
    agent_log: str
    outcome: Outcome = Outcome.INFRA_ERROR
    samples: tuple[Any, ...] = ()
    diff: str = ""
    remove_sample: bool = True

    @classmethod
    def from_exception(cls, job: RolloutJob, exc: BaseException) -> FailedRollout:
        trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return cls(
            instance_id=job.task.instance_id,
            error=f"the rollout raised {type(exc).__name__}: {exc}",
            agent_log=f"[agentrl: internal error]\n{trace}",
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance_id": self.instance_id,
            "session_id": "",
            "harness": "",
            "outcome": self.outcome.value,
            "reward": 0.0,
            "remove_sample": True,
            "num_samples": 0,
            "agent_exit_code": None,
            "turns": 0,
            "sampled_tokens": 0,
            "timings": {},
            "grade": None,
            "error": self.error,
            "diff": "",
            "agent_log": self.agent_log,
        }


class Runner:
    """Runs jobs with bounded concurrency and writes resumable output files."""

    def __init__(
        self,
        rollout_fn: RolloutFn,
        out_dir: str | pathlib.Path,
        *,
        concurrency: int = 4,
        evaluation: bool = False,
        decode: Callable[[Sequence[int]], str] | None = None,
        keep_failed: bool = False,
        tokenizer: str | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.rollout_fn = rollout_fn
        self.out = pathlib.Path(out_dir)
        self.concurrency = concurrency
        self.evaluation = evaluation
        self.decode = decode
        self.keep_failed = keep_failed
        #: The tokenizer's name or path, recorded for ``agentrl view`` to decode with.
        self.tokenizer = str(tokenizer) if tokenizer else None
        self.summary = RunSummary()
        self._write_lock = asyncio.Lock()
        #: key -> attempt number, for keys whose earlier attempts failed.
        self._attempts: dict[str, int] = {}

    # -- resume ------------------------------------------------------------
    def done_keys(self) -> set[str]:
        """Keys of rollouts already committed to ``rollouts.jsonl`` and kept as done.

        A committed ``infra_error`` or ``grader_error`` line moves to
        ``rollouts.failed.jsonl`` (unless ``keep_failed``), so that rollout runs again.
        Also drops what an interrupted run left behind: torn lines, a rollout line written
        twice, and sample rows of rollouts that never committed or run again.
        """
        done: set[str] = set()
        seen: set[str] = set()

        def decide(row: dict[str, Any]) -> str:
            key = row.get("key")
            if not isinstance(key, str) or key in seen:
                return _DROP
            seen.add(key)
            if not self.keep_failed and row.get("outcome") in RETRIED_OUTCOMES:
                return _MOVE
            done.add(key)
            return _KEEP

        failed = self.out / FAILED_FILE
        _filter_jsonl(self.out / ROLLOUTS_FILE, decide, move=lambda lines: _append(failed, lines))
        _filter_jsonl(
            self.out / SAMPLES_FILE, lambda row: _KEEP if row.get("key") in done else _DROP
        )
        self._attempts = {}
        if failed.exists():
            counts = Counter(_keys(failed))
            self._attempts = {key: n + 1 for key, n in counts.items()}
        return done

    def plan(self, tasks: Iterable[Task], samples_per_task: int) -> list[RolloutJob]:
        """Every (task, index) job not already done in the output directory."""
        if samples_per_task < 1:
            raise ValueError(f"samples_per_task must be >= 1, got {samples_per_task}")
        self.out.mkdir(parents=True, exist_ok=True)
        done = self.done_keys()
        jobs = [RolloutJob(task=t, index=i) for t in tasks for i in range(samples_per_task)]
        todo = [job for job in jobs if job.key not in done]
        self.summary.total = len(jobs)
        self.summary.skipped = len(jobs) - len(todo)
        self.summary.retried = sum(job.key in self._attempts for job in todo)
        return todo

    # -- running -----------------------------------------------------------
    async def run(
        self, jobs: Sequence[RolloutJob], on_update: Callable[[RunSummary], None] | None = None
    ) -> RunSummary:
        """Run ``jobs``; each result is written as soon as it finishes."""
        semaphore = asyncio.Semaphore(self.concurrency)
        self.summary.started = time.monotonic()

        async def one(job: RolloutJob) -> None:
            async with semaphore:
                self.summary.running += 1
                if on_update:
                    on_update(self.summary)
                try:
                    result = await self.rollout_fn(job.task, job.index)
                except Exception as exc:
                    # One rollout's bug must not cost the batch: it commits as infra_error.
                    logger.exception("rollout %s raised; recorded as infra_error", job.key)
                    result = FailedRollout.from_exception(job, exc)
                finally:
                    self.summary.running -= 1
                # A finished rollout is committed in full even if the run is cancelled now.
                await _complete(self._commit(job, result))
                if on_update:
                    on_update(self.summary)

        tasks = [asyncio.create_task(one(job), name=job.key) for job in jobs]
        try:
            # Every job runs to its end even when another's commit fails; the first
            # failure is raised after.
            for outcome in await asyncio.gather(*tasks, return_exceptions=True):
                if isinstance(outcome, BaseException):
                    raise outcome
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            summary = self.summary.to_dict()
            if self.tokenizer:
                summary["tokenizer"] = self.tokenizer
            (self.out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2))
        return self.summary

    async def _commit(self, job: RolloutJob, result: Any) -> None:
        """Write one rollout's files, its ``rollouts.jsonl`` line last, and count it."""
        key = job.key
        attempt = self._attempts.get(key, 1)
        stem = key.replace("#", "__") + (f".attempt-{attempt}" if attempt > 1 else "")
        log_path = self.out / LOGS_DIR / f"{stem}{LOG_SUFFIX}"
        diff_path = self.out / DIFFS_DIR / f"{stem}{DIFF_SUFFIX}"
        row = {
            "key": key,
            "instance_id": job.task.instance_id,
            "sample_index": job.index,
            "attempt": attempt,
            **result.to_dict(),
            "num_samples": len(result.samples),
            "remove_sample": bool(result.remove_sample),
            "agent_log_path": str(log_path),
            "diff_path": str(diff_path),
        }
        row.pop("agent_log", None)
        row.pop("diff", None)
        row["outcome"] = Outcome(row["outcome"]).value
        async with self._write_lock:
            # Serialising and decoding long samples takes tens of milliseconds each: off the
            # event loop, which also serves the middleware.
            await asyncio.to_thread(self._write_files, job, result, row, log_path, diff_path)
        self.summary.add(row)

    def _write_files(
        self,
        job: RolloutJob,
        result: Any,
        row: dict[str, Any],
        log_path: pathlib.Path,
        diff_path: pathlib.Path,
    ) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        diff_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text(result.agent_log or "")
        diff_path.write_text(result.diff or "")
        self._write_session(job, result, diff_path.name[: -len(DIFF_SUFFIX)])
        if not self.evaluation:
            with (self.out / SAMPLES_FILE).open("a") as fh:
                for k, sample in enumerate(result.samples):
                    fh.write(json.dumps(self._sample_row(job, k, sample, result)) + "\n")
        with (self.out / ROLLOUTS_FILE).open("a") as fh:
            fh.write(json.dumps(row, default=str) + "\n")

    def _write_session(self, job: RolloutJob, result: Any, stem: str) -> None:
        """``sessions/STEM.json``: what the view shows of a rollout that the rows do not hold."""
        task = job.task
        session = {
            "key": job.key,
            "tokenizer": self.tokenizer,
            "task": {
                "instance_id": task.instance_id,
                "problem_statement": task.problem_statement,
                "repo": task.repo,
                "grader": task.grader,
            },
            "turns": [
                attrs.asdict(fact)
                for fact in getattr(result, "turn_facts", ())
                if attrs.has(type(fact))
            ],
        }
        path = self.out / SESSIONS_DIR / f"{stem}{SESSION_SUFFIX}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(session, default=str))

    def _sample_row(self, job: RolloutJob, k: int, sample: Any, result: Any) -> dict[str, Any]:
        row = {
            "key": job.key,
            "instance_id": job.task.instance_id,
            "sample_index": job.index,
            "chain_index": k,
            "outcome": result.outcome.value,
            "remove_sample": bool(result.remove_sample),
            **sample.to_dict(),
        }
        if self.decode is not None:
            row["response"] = self.decode(sample.tokens[sample.prompt_length :])
        return row


async def _complete(awaitable: Awaitable[None]) -> None:
    """Await ``awaitable`` to its end even when cancelled meanwhile, then pass the cancellation on."""
    task = asyncio.ensure_future(awaitable)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        if not task.cancelled():
            task.exception()  # retrieved here: the cancellation is what propagates
        raise asyncio.CancelledError
    task.result()


_KEEP, _DROP, _MOVE = "keep", "drop", "move"


def _filter_jsonl(
    path: pathlib.Path,
    decide: Callable[[dict[str, Any]], str],
    move: Callable[[list[str]], None] | None = None,
) -> None:
    """Keep, drop or move the rows of a JSONL file, as ``decide`` says; torn or foreign lines go.

    One streaming pass decides; the file is rewritten (through a temporary file, then an
    atomic rename) only when something changes, so resuming a clean run writes nothing.
    Lines to move are handed to ``move`` before the rewrite: an interruption in between
    leaves them in both places, never in neither.
    """
    if not path.exists():
        return
    verdicts: list[str] = []
    moved: list[str] = []
    complete = True
    with path.open() as fh:
        for line in fh:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                row = None
            verdict = decide(row) if isinstance(row, dict) else _DROP
            verdicts.append(verdict)
            if verdict == _MOVE:
                moved.append(line if line.endswith("\n") else line + "\n")
            complete = line.endswith("\n")
    if all(v == _KEEP for v in verdicts) and complete:
        return
    dropped = verdicts.count(_DROP)
    if dropped:
        logger.warning(
            "%s: dropping %d of %d lines an interrupted run left unfinished",
            path,
            dropped,
            len(verdicts),
        )
    if moved:
        assert move is not None, f"{path}: rows to move but nowhere to move them"
        logger.info("%s: %d failed rollouts will run again", path, len(moved))
        move(moved)
    staging = path.with_name(_staging_name(path.name))
    with path.open() as src, staging.open("w") as dst:
        for line, verdict in zip(src, verdicts, strict=True):
            if verdict == _KEEP:
                dst.write(line if line.endswith("\n") else line + "\n")
    os.replace(staging, path)


def _append(path: pathlib.Path, lines: list[str]) -> None:
    """Append ``lines`` to ``path`` (durably), skipping any it already holds."""
    text = path.read_text() if path.exists() else ""
    have = set(text.splitlines(keepends=True))
    with path.open("a") as fh:
        if text and not text.endswith("\n"):
            fh.write("\n")  # a torn last line stays torn, on a line of its own
        for line in lines:
            if line not in have:
                fh.write(line)
                have.add(line)
        fh.flush()
        os.fsync(fh.fileno())


def _keys(path: pathlib.Path) -> list[str]:
    """The ``key`` of every readable row of a JSONL file."""
    keys = []
    with path.open() as fh:
        for line in fh:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and isinstance(row.get("key"), str):
                keys.append(row["key"])
    return keys
