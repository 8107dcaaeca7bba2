"""The grader contract's helpers: the grading time budget, path resolution, error grades."""

from __future__ import annotations

import pathlib

import attrs
import pytest

from agentrl.graders.base import (
    DEFAULT_GRADE_TIMEOUT,
    cannot_grade,
    grade_timeout,
    grader_failed,
    grading_timed_out,
    sandbox_source_problem,
)
from agentrl.graders.scaleswe import ScaleSWEGrader
from agentrl.types import Task


def test_grade_timeout_precedence():
    """Argument, then AGENTRL_GRADE_TIMEOUT, AGENTRL_EVAL_TIMEOUT, SWE_EVAL_TIMEOUT_SEC, 600."""
    env = {
        "AGENTRL_GRADE_TIMEOUT": "30",
        "AGENTRL_EVAL_TIMEOUT": "40",
        "SWE_EVAL_TIMEOUT_SEC": "50",
    }
    assert grade_timeout(5, env=env) == 5.0
    assert grade_timeout(env=env) == 30.0
    del env["AGENTRL_GRADE_TIMEOUT"]
    assert grade_timeout(env=env) == 40.0
    del env["AGENTRL_EVAL_TIMEOUT"]
    assert grade_timeout(env=env) == 50.0
    assert grade_timeout(env={}) == DEFAULT_GRADE_TIMEOUT == 600.0


@pytest.mark.parametrize("raw", ["soon", "0", "-3"])
def test_grade_timeout_rejects_bad_values(raw):
    """A budget that is not a positive number fails naming the variable and an example."""
    with pytest.raises(ValueError, match="AGENTRL_GRADE_TIMEOUT"):
        grade_timeout(env={"AGENTRL_GRADE_TIMEOUT": raw})
    with pytest.raises(ValueError, match="positive"):
        grade_timeout(0)


def test_grader_reads_its_budget_from_the_environment(monkeypatch):
    """A grader built after the environment changes uses the new budget."""
    monkeypatch.setenv("AGENTRL_GRADE_TIMEOUT", "12.5")
    assert ScaleSWEGrader().timeout == 12.5
    assert ScaleSWEGrader(timeout=3).timeout == 3.0


def test_resolve_paths_leaves_absolute_and_remote_sources(tmp_path):
    """Only relative host paths are resolved; absolute paths and URLs stay as they are."""
    grader = ScaleSWEGrader()
    for repo, expected in (
        ("repo", str(tmp_path / "repo")),
        ("/abs/repo", "/abs/repo"),
        ("https://example.com/r.tar.gz", "https://example.com/r.tar.gz"),
    ):
        task = Task(instance_id="a", problem_statement="", repo=repo)
        assert grader.resolve_paths(task, tmp_path).repo == expected
    task = Task(instance_id="a", problem_statement="", repo="repo")
    assert grader.resolve_paths(task, None).repo == "repo"
    assert pathlib.Path(grader.resolve_paths(task, tmp_path).repo).is_absolute()


def test_sandbox_source_problem_names_the_rows_fields(tmp_path):
    """No image and no repo names the image field; a missing host repo is named; URLs pass."""
    bare = Task(instance_id="t", problem_statement="x")
    reason = sandbox_source_problem(bare, "metadata.remote_env_info.image")
    assert reason is not None
    assert "set metadata.remote_env_info.image (a sandbox image) or metadata.repo" in reason
    gone = Task(instance_id="t", problem_statement="x", repo=str(tmp_path / "gone"))
    assert sandbox_source_problem(gone, "metadata.image") == (
        f"metadata.repo {tmp_path / 'gone'} does not exist on this machine"
    )
    remote = Task(instance_id="t", problem_statement="x", repo="https://example.com/r.tar.gz")
    assert sandbox_source_problem(remote, "metadata.image") is None
    assert sandbox_source_problem(attrs.evolve(gone, repo=str(tmp_path)), "x") is None
    assert (
        sandbox_source_problem(Task(instance_id="t", problem_statement="x", image="i"), "x") is None
    )


def test_error_grades_say_what_happened():
    """Refused, failed and timed-out grades carry no reward and a message naming the cause."""
    refused = cannot_grade("no grading method")
    assert (refused.reward, refused.applied_cleanly) == (0.0, False)
    assert refused.error == "cannot grade: no grading method"
    failed = grader_failed(RuntimeError("image pull denied"))
    assert (failed.reward, failed.applied_cleanly) == (0.0, False)
    assert failed.error == "grader failed: RuntimeError: image pull denied"
    details = {"exit_code": 124}
    late = grading_timed_out(2.5, details)
    assert late.reward == 0.0 and late.applied_cleanly and late.details == details
    assert late.error == "grading timed out after 2.5s (raise AGENTRL_GRADE_TIMEOUT)"


async def test_a_sandbox_factory_that_raises_becomes_a_grader_failed_grade(tmp_path):
    """An error outside the diff's control (the sandbox cannot be built) is Grade.error."""
    grader = ScaleSWEGrader()
    task = grader.parse_task(
        {"metadata": {"instance_id": "a", "repo": str(tmp_path), "eval_cmd": "true"}}
    )
    assert grader.check(task) is None

    def broken_factory(task: Task):
        raise RuntimeError("no sandbox backend")

    grade = await grader.grade(task, "", broken_factory)
    assert (grade.reward, grade.applied_cleanly) == (0.0, False)
    assert grade.error == "grader failed: RuntimeError: no sandbox backend"


async def test_a_task_check_turns_down_is_graded_without_a_sandbox():
    """A task with no grading method is refused before any sandbox is built."""
    grader = ScaleSWEGrader()
    task = grader.parse_task({"metadata": {"instance_id": "a", "image": "img"}})

    def unused_factory(task: Task):
        raise AssertionError("a refused task must not build a sandbox")

    grade = await grader.grade(task, "", unused_factory)
    assert grade.error is not None and grade.error.startswith("cannot grade: no grading method")
    assert (grade.reward, grade.applied_cleanly) == (0.0, False)
