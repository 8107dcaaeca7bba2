"""`agentrl check-tasks`: gold and empty patches graded per task, broken tasks reported."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from agentrl.graders.base import Grader
from agentrl.graders.check import check_task
from agentrl.graders.tasks import TaskRow
from agentrl.types import Grade, Task

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "tasks"


def run_cli(*args: str, cwd: pathlib.Path = ROOT) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_PROTOCOL")}
    return subprocess.run(
        [sys.executable, "-m", "agentrl.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=540,
    )


@pytest.mark.slow
def test_every_example_task_is_well_formed():
    """check-tasks on examples/tasks/*.jsonl grades gold 1.0 and empty 0.0 twice per task."""
    files = sorted(str(p.relative_to(ROOT)) for p in EXAMPLES.glob("*.jsonl"))
    result = run_cli("check-tasks", *files, "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert {r["instance_id"] for r in records} == {
        "textstats-1",
        "intervals-1",
        "slugkit-1",
        "semver_lite-1",
    }
    for record in records:
        assert record["status"] == "ok", record
        assert record["gold_rewards"] == [1.0, 1.0]
        assert record["empty_rewards"] == [0.0, 0.0]
    assert "0 broken" in result.stderr


@pytest.mark.slow
def test_broken_tasks_are_reported(tmp_path):
    """Gold that fails, empty that passes, a protocol mismatch and no gold are all told apart."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "mod.py").write_text("VALUE = 1\n")
    (tmp_path / "noop.diff").write_text(
        "--- a/mod.py\n+++ b/mod.py\n@@ -1 +1,2 @@\n VALUE = 1\n+OTHER = 2\n"
    )
    fails = 'python -c "import mod, sys; sys.exit(mod.VALUE != 2)"'
    rows = [
        {
            "metadata": {
                "instance_id": "gold-fails",
                "repo": "repo",
                "eval_cmd": fails,
                "gold_patch_path": "noop.diff",
            }
        },
        {
            "metadata": {
                "instance_id": "empty-passes",
                "repo": "repo",
                "eval_cmd": "true",
                "gold_patch_path": "noop.diff",
            }
        },
        {"metadata": {"instance_id": "no-gold", "repo": "repo", "eval_cmd": "true"}},
        {
            "metadata": {
                "repo": "repo",
                "remote_env_info": {
                    "instance_id": "sweb-row",
                    "test_patch": "diff --git a/t b/t\n",
                },
            }
        },
    ]
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = run_cli("check-tasks", str(path), "--json", "--runs", "1", "--protocol", "scaleswe")
    assert result.returncode == 1, result.stdout + result.stderr
    by_id = {r["instance_id"]: r for r in map(json.loads, result.stdout.splitlines())}
    assert by_id["gold-fails"]["status"] == "broken"
    assert by_id["gold-fails"]["reasons"] == ["the gold patch does not solve the task"]
    assert by_id["empty-passes"]["status"] == "broken"
    assert "empty patch solves the task" in by_id["empty-passes"]["reasons"][0]
    assert by_id["no-gold"]["status"] == "unchecked"
    assert by_id["sweb-row"]["status"] == "broken"
    assert by_id["sweb-row"]["reasons"][0].startswith("protocol mismatch")
    assert "broken: gold-fails" in result.stderr
    assert "2 broken" not in result.stderr and "3 broken" in result.stderr


class ScriptedGrader(Grader):
    """A grader test double that returns a scripted sequence of grades (no sandbox)."""

    name = "scripted"

    def __init__(self, gold: list[Grade], empty: list[Grade]) -> None:
        self.gold, self.empty = list(gold), list(empty)

    def parse_task(self, row):
        raise NotImplementedError

    async def grade(self, task, diff, sandbox_factory):
        return (self.gold if diff else self.empty).pop(0)


def _row() -> TaskRow:
    task = Task(instance_id="t", problem_statement="", metadata={"gold_patch": "diff"})
    return TaskRow(source="x.jsonl", line=1, task=task)


async def test_flaky_grading_is_broken():
    """A gold patch that solves one run of two makes the task flaky, hence broken."""
    grader = ScriptedGrader(
        gold=[Grade(reward=1.0), Grade(reward=0.0)], empty=[Grade(reward=0.0)] * 2
    )
    result = await check_task(_row(), grader, sandbox_factory=None, runs=2)
    assert result.broken
    assert result.reasons == ("flaky: the gold patch solved 1 of 2 runs",)
    assert result.gold_rewards == (1.0, 0.0)


async def test_grader_errors_and_unapplied_gold_are_broken():
    """A grader error or a gold patch that does not apply is reported as such."""
    errors = ScriptedGrader(
        gold=[Grade(reward=0.0, error="sandbox died")], empty=[Grade(reward=0.0)]
    )
    result = await check_task(_row(), errors, sandbox_factory=None, runs=1)
    assert result.reasons == ("grader error on the gold patch: sandbox died",)
    unapplied = ScriptedGrader(
        gold=[Grade(reward=0.0, applied_cleanly=False)], empty=[Grade(reward=0.0)]
    )
    result = await check_task(_row(), unapplied, sandbox_factory=None, runs=1)
    assert result.reasons == ("the gold patch does not apply",)
    healthy = ScriptedGrader(gold=[Grade(reward=1.0)], empty=[Grade(reward=0.0)])
    result = await check_task(_row(), healthy, sandbox_factory=None, runs=1)
    assert result.status == "ok" and result.reasons == ()


def test_cli_lists_check_tasks():
    """`agentrl --help` shows the check-tasks command added by the graders plugin."""
    result = run_cli("--help")
    assert result.returncode == 0, result.stderr
    assert "check-tasks" in result.stdout
    missing = run_cli("check-tasks", "does-not-exist.jsonl")
    assert missing.returncode == 1
    assert "cannot open task file does-not-exist.jsonl" in missing.stderr
