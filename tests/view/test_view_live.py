"""Following a run in progress (RunSource.refresh over files.JsonlTail): what the runner
appends is read incrementally, a half-written line waits, a rewritten file starts over."""

from __future__ import annotations

import json

from view_support import CraftedResult, write_run

from agentrl.types import Outcome
from agentrl.view import RunSource


def _result(task: str, outcome: Outcome = Outcome.UNSOLVED) -> CraftedResult:
    return CraftedResult(instance_id=task, outcome=outcome, reward=float(outcome is Outcome.SOLVED))


def test_appended_rollouts_are_read_and_a_partial_last_line_waits(tmp_path):
    """The runner commits a rollout; a second is half written (no newline yet): refresh
    reads the first only, then the second once its line is whole, at its byte offset."""
    out = tmp_path / "run"
    write_run(out, {"a-1": _result("a-1")}, None)
    source = RunSource.open(out)
    assert [r["key"] for r in source.rows] == ["a-1#0"] and source.refresh() is False
    line = json.dumps({"key": "b-1#0", "instance_id": "b-1", "outcome": "solved", "reward": 1.0})
    with (out / "rollouts.jsonl").open("a") as fh:
        fh.write(line[:25])
        fh.flush()
        assert source.refresh() is False and len(source.rows) == 1
        fh.write(line[25:] + "\n")
    assert source.refresh() is True
    assert [r["key"] for r in source.rows] == ["a-1#0", "b-1#0"]
    assert source.row("b-1#0")["outcome"] == "solved" and source.generation == 0


def test_samples_of_a_rollout_committed_later_are_found(tmp_path, qwen_tokenizer):
    """A rollout committed after the viewer opened has its samples indexed too: its page
    shows its tokens."""
    from view_support import LONG_TASK, long_prompt_session

    out = tmp_path / "run"
    write_run(out, {"a-1": _result("a-1")}, None)
    source = RunSource.open(out)
    write_run(out, {LONG_TASK: long_prompt_session(qwen_tokenizer, prompt_words=50)}, None)
    assert source.rollout_data(f"{LONG_TASK}#0") is None  # not read yet
    assert source.refresh() is True
    detail = source.rollout_data(f"{LONG_TASK}#0")
    assert detail["session"]["samples"][0]["trained_tokens"] > 0


def test_a_rewritten_file_is_read_again_from_its_start(tmp_path):
    """A resumed run moves its infra_error rows out of rollouts.jsonl (rewriting the file):
    the source starts over, without the moved row, and counts a new generation."""
    out = tmp_path / "run"
    write_run(out, {"a-1": _result("a-1"), "b-1": _result("b-1", Outcome.INFRA_ERROR)}, None)
    source = RunSource.open(out)
    assert len(source.rows) == 2
    write_run(out, {"c-1": _result("c-1", Outcome.SOLVED)}, None)
    assert source.refresh() is True
    assert [r["key"] for r in source.rows] == ["a-1#0", "c-1#0"] and source.generation == 1
    assert source.run_data()["generation"] == 1
