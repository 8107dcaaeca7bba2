"""The ``local`` sandbox's host Python, whatever path the interpreter was started from.

Each test starts ``agentrl check-tasks`` with an interpreter path as a user would type it
(through ``..``, through a symbolic link) and lets it grade a task for real in bubblewrap:
the grader's ``python`` must be found inside, and be this interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"


#: The repository's check, run as ``python check.py``: passes when the patch wrote ``yes``
#: and the ``python`` found on the sandbox's PATH is this interpreter (same base install).
CHECK = """\
import sys
ok = open("answer.txt").read().strip() == "yes"
sys.exit(0 if ok and sys.base_prefix == {base!r} else 1)
"""
GOLD = """\
diff --git a/answer.txt b/answer.txt
--- a/answer.txt
+++ b/answer.txt
@@ -1 +1 @@
-no
+yes
"""


def _task_file(tmp_path: Path) -> Path:
    """One scaleswe row: a repository holding ``answer.txt`` (``no``), a gold patch making
    it ``yes``, and an eval command that runs ``python`` from PATH (``CHECK``)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "answer.txt").write_text("no\n")
    (repo / "check.py").write_text(CHECK.format(base=os.path.realpath(sys.base_prefix)))
    (tmp_path / "gold.diff").write_text(GOLD)
    metadata = {
        "instance_id": "which-python",
        "problem_statement": "answer.txt should say yes",
        "repo": str(repo),
        "workdir": "/workspace",
        "eval_cmd": "python check.py",
        "gold_patch_path": str(tmp_path / "gold.diff"),
    }
    path = tmp_path / "task.jsonl"
    path.write_text(json.dumps({"metadata": metadata}) + "\n")
    return path


def _check_tasks(python: str, cwd: Path, task_file: Path) -> dict:
    """Run ``python -m agentrl.cli check-tasks --json`` from ``cwd``; the task's JSON result.

    This process's import path is handed down, so the started interpreter (whichever
    virtualenv it belongs to, or none) imports agentrl and its dependencies from here.
    """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), *filter(None, sys.path)])}
    proc = subprocess.run(
        [python, "-m", "agentrl.cli", "check-tasks", str(task_file), "--runs", "1", "--json"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    (result,) = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return result


def _layouts(tmp_path: Path) -> dict[str, tuple[str, Path]]:
    """Interpreter paths by case: (the path as typed, the directory it is typed in)."""
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "venv").symlink_to(sys.prefix, target_is_directory=True)
    links = tmp_path / "links"
    links.mkdir()
    (links / "python").symlink_to(sys.executable)
    venv_python = Path(sys.prefix, "bin", Path(sys.executable).name)
    return {
        "venv through ..": (os.path.relpath(venv_python, work), work),
        "linked venv through ..": ("../venv/bin/python", work),
        "linked interpreter": (str(links / "python"), work),
        "linked interpreter through ..": ("../links/python", work),
    }


@pytest.mark.parametrize(
    "case",
    [
        "venv through ..",
        "linked venv through ..",
        "linked interpreter",
        "linked interpreter through ..",
    ],
)
def test_a_grade_finds_python_whatever_path_started_the_interpreter(tmp_path, case):
    """Started as ``../…/venv/bin/python``, through a linked venv directory, or through a
    link to the interpreter in a directory of its own (absolute or through ``..``): the
    gold patch grades 1 and the empty patch 0 in the local sandbox, so check-tasks calls
    the task well-formed, where an unbound PATH entry made every grade exit 127
    (``python: command not found``) and the task "broken"."""
    python, cwd = _layouts(tmp_path)[case]
    result = _check_tasks(python, cwd, _task_file(tmp_path))
    assert result["status"] == "ok", result
    assert result["gold_rewards"] == [1.0] and result["empty_rewards"] == [0.0], result
