"""`agentrl examples`: where the bundled example tasks are, and a copy that still works."""

from __future__ import annotations

import pathlib

from click.testing import CliRunner

from agentrl.cli import cli
from agentrl.cli.demo import example_tasks_dir
from agentrl.graders.scaleswe import ScaleSWEGrader
from agentrl.graders.swebench import SWEBenchGrader
from agentrl.graders.tasks import gold_patch, load_tasks


def test_lists_the_bundled_task_files_and_what_to_run():
    """The listing names the directory, each JSONL file with its tasks, and the next step."""
    result = CliRunner().invoke(cli, ["examples"], terminal_width=200)
    assert result.exit_code == 0, result.output
    where = example_tasks_dir().resolve()
    assert f"example tasks in {where}/" in result.stdout
    assert "scaleswe.jsonl" in result.stdout and "swebench.jsonl" in result.stdout
    assert "textstats-1, intervals-1, slugkit-1" in result.stdout
    assert f"agentrl check-tasks {where}/scaleswe.jsonl" in result.stdout


SCRIPTS = ("run_script_path", "parser_script_path")


def _inside(path: str | None, root: pathlib.Path) -> bool:
    return path is not None and pathlib.Path(path).resolve().is_relative_to(root.resolve())


def test_a_copy_is_self_contained(tmp_path):
    """Copied tasks load from the copy: repos, gold patches and scripts resolve inside it."""
    dest = tmp_path / "tasks"
    result = CliRunner().invoke(cli, ["examples", "--copy", str(dest)], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert f"agentrl check-tasks {dest}/scaleswe.jsonl" in result.stdout
    assert not list(dest.rglob("__pycache__"))
    for file, grader in (
        ("scaleswe.jsonl", ScaleSWEGrader()),
        ("swebench.jsonl", SWEBenchGrader()),
    ):
        rows = load_tasks(dest / file, grader=grader)
        assert rows
        for row in rows:
            task = row.task
            assert _inside(task.repo, dest) and pathlib.Path(task.repo).is_dir(), task.repo
            paths = [task.metadata.get("gold_patch_path")]
            paths += [(task.grading.get("swepro") or {}).get(key) for key in SCRIPTS]
            for path in filter(None, paths):
                assert _inside(path, dest) and pathlib.Path(path).is_file(), path
            assert gold_patch(task)
            assert grader.check(task) is None, task.instance_id


def test_copy_refuses_to_overwrite_unless_forced(tmp_path):
    """A second copy over the first is refused, changing nothing; --force overwrites."""
    dest = tmp_path / "tasks"
    runner = CliRunner()
    assert runner.invoke(cli, ["examples", "--copy", str(dest)]).exit_code == 0
    edited = dest / "scaleswe.jsonl"
    edited.write_text("mine\n")
    result = runner.invoke(cli, ["examples", "--copy", str(dest)])
    assert result.exit_code == 1
    assert "already holds" in result.stderr and "--force" in result.stderr
    assert edited.read_text() == "mine\n"
    result = runner.invoke(cli, ["examples", "--copy", str(dest), "--force"])
    assert result.exit_code == 0, result.output
    assert edited.read_text() == (example_tasks_dir() / "scaleswe.jsonl").read_text()
