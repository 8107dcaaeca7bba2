"""The grader contract's helpers: the grading time budget and path resolution."""

from __future__ import annotations

import pathlib

import pytest

from agentrl.graders.base import DEFAULT_GRADE_TIMEOUT, grade_timeout
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
