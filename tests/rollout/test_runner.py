"""The many-rollout runner: concurrency, output files, resume, failures and summaries."""

from __future__ import annotations

import asyncio
import json
import pathlib
import threading

import pytest
from rollout_support import FakeResult, FakeSample
from rollout_support import fake_tasks as _tasks

from agentrl.rollout.runner import RolloutJob, Runner, rollout_key
from agentrl.types import Outcome, Task


def _read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_runs_every_task_sample_and_writes_files(tmp_path):
    """Each (task, sample) runs once; rollouts, samples, logs, diffs and summary are written."""
    calls = []

    async def rollout(task, index):
        calls.append((task.instance_id, index))
        return FakeResult(task.instance_id, Outcome.SOLVED, 1.0, (FakeSample(), FakeSample()))

    runner = Runner(rollout, tmp_path, concurrency=3, decode=lambda ids: f"<{len(ids)} ids>")
    jobs = runner.plan(_tasks(2), samples_per_task=2)
    summary = await runner.run(jobs)
    assert sorted(calls) == [("task-0", 0), ("task-0", 1), ("task-1", 0), ("task-1", 1)]
    rollouts = _read(tmp_path / "rollouts.jsonl")
    assert {r["key"] for r in rollouts} == {rollout_key(t, i) for t, i in calls}
    assert all(r["outcome"] == "solved" and r["num_samples"] == 2 for r in rollouts)
    samples = _read(tmp_path / "samples.jsonl")
    assert len(samples) == 8
    assert samples[0]["loss_mask"] == [1, 1] and samples[0]["response"] == "<2 ids>"
    assert samples[0]["rollout_logprobs"] == [-0.5, -0.25] and samples[0]["tokens"] == [1, 2, 3, 4]
    assert samples[0]["metadata"] == {"turns": [1]} and samples[0]["chain_index"] == 0
    log = tmp_path / "agent_logs" / "task-0__0.log"
    assert log.read_text() == '{"type":"result"}\n'
    assert summary.solved == 4
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["solve_rate"] == 1.0
    assert written["mean_seconds_per_phase"] == {"agent": 1.5, "grade": 0.5}


async def test_concurrency_is_bounded(tmp_path):
    """No more than `concurrency` rollouts run at once."""
    running = 0
    peak = 0

    async def rollout(task, index):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1
        return FakeResult(task.instance_id, Outcome.UNSOLVED, 0.0, (FakeSample(reward=0.0),))

    runner = Runner(rollout, tmp_path, concurrency=2)
    await runner.run(runner.plan(_tasks(6), 1))
    assert peak == 2


async def test_rerun_resumes_and_skips_done(tmp_path):
    """A second run with the same output directory redoes nothing already finished."""
    calls = []

    async def rollout(task, index):
        calls.append(task.instance_id)
        return FakeResult(task.instance_id, Outcome.SOLVED, 1.0, (FakeSample(),))

    first = Runner(rollout, tmp_path)
    await first.run(first.plan(_tasks(2), 1))
    second = Runner(rollout, tmp_path)
    jobs = second.plan(_tasks(3), 1)
    assert [job.task.instance_id for job in jobs] == ["task-2"]
    assert second.summary.skipped == 2
    await second.run(jobs)
    assert calls == ["task-0", "task-1", "task-2"]
    assert len(_read(tmp_path / "rollouts.jsonl")) == 3
    assert len(_read(tmp_path / "samples.jsonl")) == 3


def test_resume_drops_uncommitted_samples_and_partial_lines(tmp_path):
    """Sample rows without a committed rollout line, and a torn last line, are discarded."""
    (tmp_path / "rollouts.jsonl").write_text(
        json.dumps({"key": "a#0", "outcome": "solved"}) + "\n" + '{"key": "b#0", "outc'
    )
    (tmp_path / "samples.jsonl").write_text(
        json.dumps({"key": "a#0"}) + "\n" + json.dumps({"key": "b#0"}) + "\n"
    )
    runner = Runner(lambda t, i: None, tmp_path)
    assert runner.done_keys() == {"a#0"}
    assert _read(tmp_path / "samples.jsonl") == [{"key": "a#0"}]
    assert _read(tmp_path / "rollouts.jsonl") == [{"key": "a#0", "outcome": "solved"}]


async def test_resuming_a_clean_run_rewrites_nothing(tmp_path):
    """Resuming after a run that finished cleanly leaves both output files untouched."""

    async def rollout(task, index):
        return FakeResult(task.instance_id, Outcome.SOLVED, 1.0, (FakeSample(),))

    first = Runner(rollout, tmp_path)
    await first.run(first.plan(_tasks(2), 1))
    files = [tmp_path / "rollouts.jsonl", tmp_path / "samples.jsonl"]
    before = [(p.stat().st_ino, p.stat().st_mtime_ns, p.read_text()) for p in files]
    assert Runner(rollout, tmp_path).done_keys() == {"task-0#0", "task-1#0"}
    assert [(p.stat().st_ino, p.stat().st_mtime_ns, p.read_text()) for p in files] == before


def test_resume_restores_a_missing_final_newline(tmp_path):
    """A complete last row cut before its newline is kept, and the next row starts a new line."""
    (tmp_path / "rollouts.jsonl").write_text(
        json.dumps({"key": "a#0"})
        + "\n"
        + json.dumps({"key": "a#0"})
        + "\n"
        + json.dumps({"key": "b#0"})
    )
    runner = Runner(lambda t, i: None, tmp_path)
    assert runner.done_keys() == {"a#0", "b#0"}
    assert (tmp_path / "rollouts.jsonl").read_text() == '{"key": "a#0"}\n{"key": "b#0"}\n'


async def test_writing_results_does_not_block_the_event_loop(tmp_path):
    """Serialising and decoding samples runs off the loop: other coroutines keep running."""
    entered, gate = threading.Event(), threading.Event()

    def slow_decode(ids):
        entered.set()
        assert gate.wait(5), "the event loop was blocked while a result was written"
        return "text"

    async def rollout(task, index):
        return FakeResult(task.instance_id, Outcome.SOLVED, 1.0, (FakeSample(),))

    runner = Runner(rollout, tmp_path, decode=slow_decode)
    run = asyncio.create_task(runner.run(runner.plan(_tasks(1), 1)))
    assert await asyncio.to_thread(entered.wait, 5)
    gate.set()  # reached only while the loop runs during the write
    summary = await run
    assert summary.solved == 1
    assert _read(tmp_path / "samples.jsonl")[0]["response"] == "text"


async def test_infra_failures_are_marked_and_not_counted_as_reward(tmp_path):
    """Infra errors are written with remove_sample and kept out of the solve rate."""

    async def rollout(task, index):
        if task.instance_id == "task-0":
            return FakeResult(task.instance_id, Outcome.INFRA_ERROR, 0.0, (FakeSample(),))
        return FakeResult(task.instance_id, Outcome.SOLVED, 1.0, (FakeSample(),))

    runner = Runner(rollout, tmp_path)
    summary = await runner.run(runner.plan(_tasks(2), 1))
    rows = {r["instance_id"]: r for r in _read(tmp_path / "rollouts.jsonl")}
    assert rows["task-0"]["remove_sample"] is True
    samples = {s["instance_id"]: s for s in _read(tmp_path / "samples.jsonl")}
    assert samples["task-0"]["remove_sample"] is True
    assert summary.failed == 1
    assert summary.to_dict()["solve_rate"] == 1.0


async def test_a_rollout_that_raises_is_committed_as_infra_error_and_the_batch_goes_on(tmp_path):
    """One rollout_fn raising (a bug) costs neither the batch nor its own line: all four
    commit, the raising one as infra_error with its traceback as the agent log; on resume
    it runs again."""

    async def rollout(task, index):
        if index == 1:
            raise KeyError("the session was dropped")
        await asyncio.sleep(0.05 * index)
        return FakeResult(task.instance_id, Outcome.SOLVED, 1.0, (FakeSample(),))

    runner = Runner(rollout, tmp_path, concurrency=4)
    summary = await runner.run(runner.plan(_tasks(1), 4))
    rows = {r["sample_index"]: r for r in _read(tmp_path / "rollouts.jsonl")}
    assert sorted(rows) == [0, 1, 2, 3] and summary.done == 4
    failed = rows[1]
    assert failed["outcome"] == "infra_error" and failed["remove_sample"] is True
    assert failed["error"] == "the rollout raised KeyError: 'the session was dropped'"
    log = _read_text(failed["agent_log_path"])
    assert log.startswith("[agentrl: internal error]\nTraceback") and "KeyError" in log
    assert {r["outcome"] for i, r in rows.items() if i != 1} == {"solved"}
    assert Runner(rollout, tmp_path).plan(_tasks(1), 4) == [RolloutJob(task=_tasks(1)[0], index=1)]


def _read_text(path: str) -> str:
    return pathlib.Path(path).read_text()


def _exists(path: str) -> bool:
    return pathlib.Path(path).exists()


def _outcome_by_task(outcomes: dict[str, Outcome], calls: list[str]):
    async def rollout(task, index):
        calls.append(task.instance_id)
        outcome = outcomes[task.instance_id]
        reward = 1.0 if outcome is Outcome.SOLVED else 0.0
        return FakeResult(task.instance_id, outcome, reward, (FakeSample(reward),))

    return rollout


async def test_rerun_redoes_infra_and_grader_errors_and_keeps_their_old_rows(tmp_path):
    """Resuming redoes infra/grader errors only; old rows and files move aside, one row per job."""
    calls: list[str] = []
    first = {
        "task-0": Outcome.INFRA_ERROR,
        "task-1": Outcome.GRADER_ERROR,
        "task-2": Outcome.AGENT_ERROR,
        "task-3": Outcome.UNSOLVED,
    }
    runner = Runner(_outcome_by_task(first, calls), tmp_path)
    await runner.run(runner.plan(_tasks(4), 1))
    failed_rows = [r for r in _read(tmp_path / "rollouts.jsonl") if r["remove_sample"]]

    calls.clear()
    second = Runner(_outcome_by_task(dict.fromkeys(first, Outcome.SOLVED), calls), tmp_path)
    jobs = second.plan(_tasks(4), 1)
    assert [job.key for job in jobs] == ["task-0#0", "task-1#0"]
    assert (second.summary.skipped, second.summary.retried) == (2, 2)
    summary = await second.run(jobs)
    assert sorted(calls) == ["task-0", "task-1"]
    assert summary.to_dict()["retried"] == 2

    rows = _read(tmp_path / "rollouts.jsonl")
    assert sorted(r["key"] for r in rows) == [f"task-{i}#0" for i in range(4)]
    by_key = {r["key"]: r for r in rows}
    assert by_key["task-0#0"]["outcome"] == "solved" and by_key["task-0#0"]["attempt"] == 2
    assert by_key["task-2#0"]["outcome"] == "agent_error" and by_key["task-2#0"]["attempt"] == 1
    assert _read(tmp_path / "rollouts.failed.jsonl") == failed_rows
    for old in failed_rows:  # the failed attempt's log and diff are still where its row says
        assert old["agent_log_path"] != by_key[old["key"]]["agent_log_path"]
        assert _exists(old["agent_log_path"]) and _exists(old["diff_path"])
        assert by_key[old["key"]]["diff_path"].endswith("__0.attempt-2.diff")
    samples = _read(tmp_path / "samples.jsonl")
    assert sorted(s["key"] for s in samples) == [f"task-{i}#0" for i in range(4)]
    assert not any(s["remove_sample"] for s in samples)


async def test_a_rollout_failing_again_counts_its_attempts(tmp_path):
    """Each failed attempt is kept in rollouts.failed.jsonl; the next one is numbered after them."""
    calls: list[str] = []
    for _ in range(3):
        runner = Runner(_outcome_by_task({"task-0": Outcome.INFRA_ERROR}, calls), tmp_path)
        await runner.run(runner.plan(_tasks(1), 1))
    assert calls == ["task-0"] * 3
    assert [r["attempt"] for r in _read(tmp_path / "rollouts.failed.jsonl")] == [1, 2]
    assert [r["attempt"] for r in _read(tmp_path / "rollouts.jsonl")] == [3]


async def test_keep_failed_counts_infra_errors_as_done(tmp_path):
    """With keep_failed a committed infra error is not redone and nothing is moved."""
    calls: list[str] = []
    runner = Runner(_outcome_by_task({"task-0": Outcome.INFRA_ERROR}, calls), tmp_path)
    await runner.run(runner.plan(_tasks(1), 1))
    before = (tmp_path / "rollouts.jsonl").read_text()
    again = Runner(_outcome_by_task({"task-0": Outcome.SOLVED}, calls), tmp_path, keep_failed=True)
    assert again.plan(_tasks(1), 1) == []
    assert (again.summary.skipped, again.summary.retried) == (1, 0)
    assert (tmp_path / "rollouts.jsonl").read_text() == before
    assert not (tmp_path / "rollouts.failed.jsonl").exists()


def test_moving_failed_rows_survives_an_interruption_half_way(tmp_path):
    """A row already copied to rollouts.failed.jsonl but still in rollouts.jsonl is kept once."""
    failed = json.dumps({"key": "a#0", "outcome": "infra_error", "attempt": 1}) + "\n"
    done = json.dumps({"key": "b#0", "outcome": "solved"}) + "\n"
    (tmp_path / "rollouts.jsonl").write_text(failed + done)
    (tmp_path / "rollouts.failed.jsonl").write_text(failed)
    runner = Runner(lambda t, i: None, tmp_path)
    assert runner.done_keys() == {"b#0"}
    assert (tmp_path / "rollouts.failed.jsonl").read_text() == failed
    assert (tmp_path / "rollouts.jsonl").read_text() == done
    assert runner.plan([Task(instance_id="a", problem_statement="x")], 1)[0].key == "a#0"
    assert runner.summary.retried == 1


async def test_evaluation_writes_no_samples(tmp_path):
    """--eval mode records rollouts and rewards but no training rows."""

    async def rollout(task, index):
        return FakeResult(task.instance_id, Outcome.UNSOLVED, 0.0, (FakeSample(),))

    runner = Runner(rollout, tmp_path, evaluation=True)
    await runner.run(runner.plan(_tasks(1), 1))
    assert not (tmp_path / "samples.jsonl").exists()
    assert len(_read(tmp_path / "rollouts.jsonl")) == 1


async def test_cancellation_keeps_finished_rollouts(tmp_path):
    """Cancelling mid-run (Ctrl-C) keeps what finished and cancels the rest."""
    started = asyncio.Event()
    cancelled = []

    async def rollout(task, index):
        if task.instance_id == "task-0":
            return FakeResult(task.instance_id, Outcome.SOLVED, 1.0, (FakeSample(),))
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(task.instance_id)
            raise

    runner = Runner(rollout, tmp_path, concurrency=2)
    run = asyncio.create_task(runner.run(runner.plan(_tasks(2), 1)))
    await started.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert cancelled == ["task-1"]
    assert [r["instance_id"] for r in _read(tmp_path / "rollouts.jsonl")] == ["task-0"]
    assert (tmp_path / "summary.json").exists()


async def test_cancellation_during_a_write_still_commits_it(tmp_path):
    """Ctrl-C while a finished rollout is being written waits for its rollouts.jsonl line."""
    entered, gate = threading.Event(), threading.Event()

    def slow_decode(ids):
        entered.set()
        assert gate.wait(5)
        return "text"

    async def rollout(task, index):
        return FakeResult(task.instance_id, Outcome.SOLVED, 1.0, (FakeSample(),))

    runner = Runner(rollout, tmp_path, decode=slow_decode)
    run = asyncio.create_task(runner.run(runner.plan(_tasks(1), 1)))
    assert await asyncio.to_thread(entered.wait, 5)
    run.cancel()
    await asyncio.sleep(0)  # deliver the cancellation while the write is still blocked
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert [r["key"] for r in _read(tmp_path / "rollouts.jsonl")] == ["task-0#0"]
    assert _read(tmp_path / "samples.jsonl")[0]["response"] == "text"
    assert json.loads((tmp_path / "summary.json").read_text())["rollouts"] == 1


def test_bad_arguments_are_rejected(tmp_path):
    """Zero concurrency or zero samples per task fail with the value named."""
    with pytest.raises(ValueError, match="concurrency must be >= 1, got 0"):
        Runner(lambda t, i: None, tmp_path, concurrency=0)
    with pytest.raises(ValueError, match="samples_per_task must be >= 1, got 0"):
        Runner(lambda t, i: None, tmp_path).plan(_tasks(1), 0)
