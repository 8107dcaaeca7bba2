"""The scaleswe grader on the real local (bubblewrap) sandbox, with the example tasks."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time

import attrs
import pytest
from diff_support import make_diff

from agentrl.graders.check import sandbox_factory_for
from agentrl.graders.scaleswe import ScaleSWEGrader
from agentrl.graders.tasks import gold_patch, load_tasks
from agentrl.sandboxes.local import LocalSandbox
from agentrl.types import Task

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "tasks"


@pytest.fixture(scope="module")
def factory():
    return sandbox_factory_for("local")


@pytest.fixture(scope="module")
def examples() -> dict[str, Task]:
    return {
        row.task.instance_id: row.task
        for row in load_tasks(EXAMPLES / "scaleswe.jsonl", grader="scaleswe")
    }


def make_repo(root: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    return root


def scaleswe_task(repo: pathlib.Path, **metadata) -> Task:
    grader = ScaleSWEGrader()
    row = {"prompt": "p", "metadata": {"instance_id": "t", "repo": str(repo), **metadata}}
    return grader.parse_task(row)


@pytest.mark.parametrize("instance_id", ["textstats-1", "intervals-1", "slugkit-1"])
async def test_gold_patch_solves(instance_id, examples, factory):
    """The gold patch of each example (eval_cmd, f2p_script, swepro) earns 1.0."""
    task = examples[instance_id]
    grade = await ScaleSWEGrader(timeout=120).grade(task, gold_patch(task), factory)
    assert grade.error is None, grade.details
    assert grade.reward == 1.0 and grade.solved and grade.applied_cleanly
    assert grade.details["patch_method"].startswith("git apply --3way")
    if instance_id == "slugkit-1":
        assert grade.details["fail_to_pass"] == {"passed": 3, "total": 3}
        assert grade.details["pass_to_pass"] == {"passed": 3, "total": 3}


@pytest.mark.parametrize("instance_id", ["textstats-1", "intervals-1", "slugkit-1"])
async def test_empty_patch_is_unsolved(instance_id, examples, factory):
    """The empty diff is a no-op that applies, and the still-broken code earns 0.0."""
    task = examples[instance_id]
    grade = await ScaleSWEGrader(timeout=120).grade(task, "", factory)
    assert grade.error is None, grade.details
    assert grade.reward == 0.0 and grade.applied_cleanly
    assert grade.details["patch_method"] == "empty"
    assert grade.details["exit_code"] != 0


async def test_patch_editing_the_tests_gains_nothing(examples, factory, tmp_path):
    """A diff that rewrites the failing tests is applied, its test edits are undone: 0.0."""
    task = examples["textstats-1"]
    repo = pathlib.Path(task.repo)
    original = (repo / "tests" / "test_core.py").read_text()
    cheat = make_diff(repo, tmp_path, {"tests/test_core.py": "def test_nothing():\n    pass\n"})
    grade = await ScaleSWEGrader(timeout=120).grade(task, cheat, factory)
    assert grade.error is None
    assert grade.reward == 0.0 and grade.applied_cleanly
    assert grade.details["restored_test_files"] == ["tests/test_core.py"]
    assert (repo / "tests" / "test_core.py").read_text() == original


async def test_conftest_that_exits_early_gains_nothing(examples, factory, tmp_path):
    """A new conftest.py that would make pytest exit 0 is removed before the tests run."""
    task = examples["textstats-1"]
    cheat = make_diff(
        pathlib.Path(task.repo), tmp_path, {"conftest.py": "import os\nos._exit(0)\n"}
    )
    grade = await ScaleSWEGrader(timeout=120).grade(task, cheat, factory)
    assert grade.reward == 0.0 and grade.error is None
    assert grade.details["restored_test_files"] == ["conftest.py"]


async def test_fix_with_test_edits_still_counts(examples, factory):
    """A correct fix that also edits tests is graded on the fix against the original tests."""
    task = examples["textstats-1"]
    edit_tests = (
        "diff --git a/tests/test_core.py b/tests/test_core.py\n"
        "--- a/tests/test_core.py\n+++ b/tests/test_core.py\n"
        "@@ -1,2 +1,3 @@\n from textstats import average_word_length, most_common, "
        "word_count, words\n+import sys\n \n"
    )
    grade = await ScaleSWEGrader(timeout=120).grade(task, gold_patch(task) + edit_tests, factory)
    assert grade.error is None, grade.details
    assert grade.reward == 1.0
    assert grade.details["restored_test_files"] == ["tests/test_core.py"]


async def test_hack_only_edit_is_suspicious_and_the_tests_do_not_run(examples, factory, tmp_path):
    """A package that calls ``os._exit(0)`` on import would make pytest exit 0: the guard
    finds the line, the grade is 0 with the finding, and no test command ran."""
    task = examples["textstats-1"]
    repo = pathlib.Path(task.repo)
    init = (repo / "textstats" / "__init__.py").read_text()
    hack = make_diff(repo, tmp_path, {"textstats/__init__.py": init + "import os\nos._exit(0)\n"})
    grade = await ScaleSWEGrader(timeout=120).grade(task, hack, factory)
    assert grade.error is None and not grade.solved and grade.reward == 0.0
    line = len(init.splitlines()) + 2
    assert grade.suspicious == (f"textstats/__init__.py:{line}: os._exit(0)  [os-exit]",)
    assert "exit_code" not in grade.details
    allowed = attrs.evolve(task, metadata={**task.metadata, "guard_allow": ["os-exit"]})
    grade = await ScaleSWEGrader(timeout=120).grade(allowed, hack, factory)
    assert grade.suspicious == () and grade.details["exit_code"] == 0, "what the guard stops"


async def test_dropped_runner_config_is_recorded_with_its_reason(examples, factory, tmp_path):
    """The gold fix plus a pytest.ini that loads a plugin: the ini is dropped (path and
    reason recorded, and listed in restored_test_files), the fix still earns 1.0."""
    task = examples["textstats-1"]
    extra = make_diff(
        pathlib.Path(task.repo),
        tmp_path,
        {"pytest.ini": "[pytest]\naddopts = -p textstats.force\n"},
    )
    grade = await ScaleSWEGrader(timeout=120).grade(task, gold_patch(task) + extra, factory)
    assert grade.error is None and grade.reward == 1.0, grade.details
    assert grade.details["restored_test_files"] == ["pytest.ini"]
    (dropped,) = grade.details["dropped"]
    assert dropped["path"] == "pytest.ini" and "pytest" in dropped["reason"]


@pytest.mark.parametrize(
    "diff",
    [
        "this is not a diff\n",
        "diff --git a/textstats/core.py b/textstats/core.py\n--- a/textstats/core.py\n"
        "+++ b/textstats/core.py\n@@ -12,3 +12,3 @@\n-    no such line\n+    x = 1\n",
    ],
    ids=["garbage", "wrong-context"],
)
async def test_malformed_diff_is_not_applied(diff, examples, factory):
    """A diff no ladder rung can apply is reported as not applied, reward 0.0, no error."""
    grade = await ScaleSWEGrader(timeout=120).grade(examples["textstats-1"], diff, factory)
    assert grade.error is None
    assert grade.reward == 0.0 and not grade.applied_cleanly
    assert "patch -p1" in grade.details["apply_log"]


async def test_f2p_script_with_shell_metacharacters_arrives_verbatim(tmp_path, factory):
    """An f2p script full of shell metacharacters runs exactly as written (its test passes:
    1.0; the same script with a failing test: 0.0)."""
    nasty = "$HOME $(touch /tmp/pwned) `id` 'single' \"double\" \\n ; | & > < * ? ~ # ! %s {}"
    script = (
        "import os, sys\n"
        "import pytest\n"
        f"S = {nasty!r}\n"
        "def test_verbatim():\n"
        f"    assert S == ''.join(map(chr, {[ord(c) for c in nasty]!r})), S\n"
        "    assert not os.path.exists('/tmp/pwned')\n"
        "if __name__ == '__main__':\n"
        "    sys.exit(pytest.main([__file__, '-q', '-p', 'no:cacheprovider']))\n"
    )
    repo = make_repo(tmp_path / "repo", {"README.md": "x\n"})
    task = scaleswe_task(repo, remote_env_info={"f2p_script": script})
    grade = await ScaleSWEGrader(timeout=60).grade(task, "", factory)
    assert grade.error is None, grade.details
    assert grade.reward == 1.0, grade.details["output_tail"]
    failing = scaleswe_task(
        repo, remote_env_info={"f2p_script": script.replace("assert S ==", "assert S !=")}
    )
    grade = await ScaleSWEGrader(timeout=60).grade(failing, "", factory)
    assert grade.reward == 0.0 and grade.details["exit_code"] == 1


async def test_f2p_script_that_exits_0_without_pytest_is_unsolved(tmp_path, factory):
    """An f2p run that exits 0 without a pytest session (the package exited at import, or
    the script never reached pytest) is unsolved: no grader report, no pass."""
    repo = make_repo(tmp_path / "repo", {"README.md": "x\n"})
    task = scaleswe_task(repo, remote_env_info={"f2p_script": "import sys\nsys.exit(0)\n"})
    grade = await ScaleSWEGrader(timeout=60).grade(task, "", factory)
    assert grade.error is None and grade.details["exit_code"] == 0
    assert grade.reward == 0.0 and not grade.solved
    (reason,) = grade.details["verdict"]["reasons"]
    assert reason.startswith("no grader report: no pytest session ran under the grader's plugin")


async def test_a_diff_at_the_f2p_path_cannot_break_grading(examples, factory, tmp_path):
    """A diff that puts a directory where the f2p file used to be written neither errors
    the grade nor stops the gold fix from scoring 1.0."""
    task = examples["intervals-1"]
    occupy = make_diff(
        pathlib.Path(task.repo), tmp_path, {"_agentrl_f2p_test.py/__init__.py": "x = 1\n"}
    )
    grade = await ScaleSWEGrader(timeout=120).grade(task, gold_patch(task) + occupy, factory)
    assert grade.error is None, grade.details
    assert grade.solved and grade.reward == 1.0


async def test_eval_cmd_without_pytest_is_decided_by_its_exit_code(tmp_path, factory):
    """An eval_cmd that runs no pytest: exit 0 is solved, and the verdict says the exit
    code decided (eval_cmd is only as strong as its command)."""
    repo = make_repo(tmp_path / "repo", {"README.md": "x\n"})
    grade = await ScaleSWEGrader(timeout=60).grade(
        scaleswe_task(repo, eval_cmd="true"), "", factory
    )
    assert grade.solved and grade.reward == 1.0
    assert grade.details["verdict"] == {"channel": "exit code", "report": "none", "reasons": []}


async def test_eval_cmd_whose_report_is_removed_is_unsolved(examples, factory):
    """Tests that pass and then delete the grader's report directory: exit 0, but the run
    is unsolved with the reason, not a grader error."""
    task = examples["textstats-1"]
    wipe = task.grading["eval_cmd"] + " && rm -rf /tmp/agentrl-grade/*/reports"
    task = attrs.evolve(task, grading={**task.grading, "eval_cmd": wipe})
    grade = await ScaleSWEGrader(timeout=120).grade(task, gold_patch(task), factory)
    assert grade.error is None and grade.details["exit_code"] == 0
    assert not grade.solved and grade.reward == 0.0
    assert "report directory is gone" in grade.details["verdict"]["reasons"][0]


async def test_grading_timeout_is_a_grader_error(tmp_path, factory):
    """Tests that outrun the grading budget give a grader error, never a plain 0.0."""
    repo = make_repo(tmp_path / "repo", {"README.md": "x\n"})
    task = scaleswe_task(repo, eval_cmd="sleep 60")
    started = time.monotonic()
    grade = await ScaleSWEGrader(timeout=2).grade(task, "", factory)
    assert time.monotonic() - started < 30
    assert grade.error is not None and "timed out after 2s" in grade.error
    assert not grade.solved and grade.reward == 0.0


async def test_pre_commands_set_the_base_the_diff_applies_to(tmp_path, factory):
    """pre_commands run before the diff; a diff made after them applies only with them."""
    repo = make_repo(tmp_path / "repo", {"value.py": "VALUE = 1\n"})
    pre = ["sed -i 's/VALUE = 1/VALUE = 2/' value.py"]
    changed = make_repo(tmp_path / "changed", {"value.py": "VALUE = 2\n"})
    diff = make_diff(changed, tmp_path, {"value.py": "VALUE = 3\n"})
    check = 'python -c "import value, sys; sys.exit(0 if value.VALUE == 3 else 1)"'
    with_pre = scaleswe_task(repo, eval_cmd=check, pre_commands=pre)
    grade = await ScaleSWEGrader(timeout=60).grade(with_pre, diff, factory)
    assert grade.error is None and grade.reward == 1.0, grade.details
    assert grade.details["pre_commands_exit"] == 0
    without = scaleswe_task(repo, eval_cmd=check)
    grade = await ScaleSWEGrader(timeout=60).grade(without, diff, factory)
    assert not grade.applied_cleanly and grade.reward == 0.0


async def test_prepare_runs_pre_commands_in_an_agent_sandbox(tmp_path):
    """Grader.prepare brings a fresh sandbox to the task's base (git baseline + pre_commands)."""
    repo = make_repo(tmp_path / "repo", {"value.py": "VALUE = 1\n"})
    task = scaleswe_task(repo, eval_cmd="true", pre_commands="echo ran > marker.txt")
    async with LocalSandbox.from_task(task) as sandbox:
        details = await ScaleSWEGrader().prepare(sandbox, task)
        assert details == {"pre_commands_exit": 0}
        assert (await sandbox.read_file(f"{task.workdir}/marker.txt")).strip() == "ran"
        log = await sandbox.exec("git log --format=%s", workdir=task.workdir)
        assert log.stdout.strip() == "baseline"
    assert not (repo / "marker.txt").exists()


async def test_swepro_parser_without_result_is_a_grader_error(tmp_path, factory):
    """A swepro parser that writes no result.json is a grader error, not an unsolved task."""
    repo = make_repo(tmp_path / "repo", {"README.md": "x\n"})
    run = make_repo(tmp_path / "assets", {"run.sh": "echo PASSED t::a\n", "parser.py": "pass\n"})
    task = scaleswe_task(
        repo,
        swepro={
            "run_script_path": str(run / "run.sh"),
            "parser_script_path": str(run / "parser.py"),
            "fail_to_pass": ["t::a"],
        },
    )
    grade = await ScaleSWEGrader(timeout=60).grade(task, "", factory)
    assert grade.error is not None and "result.json" in grade.error


async def test_protocol_mismatch_is_a_grader_error(tmp_path, factory):
    """Grading a SWE-bench-shaped row as scaleswe returns an error naming the mismatch."""
    row = json.loads((EXAMPLES / "swebench.jsonl").read_text().splitlines()[0])
    task = ScaleSWEGrader().parse_task(row)
    grade = await ScaleSWEGrader().grade(task, "", factory)
    assert grade.error is not None and "protocol mismatch" in grade.error
    assert not grade.solved


async def test_sandbox_failure_is_a_grader_error(examples):
    """A sandbox that cannot start gives a grader error instead of a reward of 0."""
    task = examples["textstats-1"]
    broken = sandbox_factory_for("local", options={"bwrap": "/nonexistent/bwrap"})
    grade = await ScaleSWEGrader().grade(task, gold_patch(task), broken)
    assert grade.error is not None and "bubblewrap" in grade.error
    assert not grade.solved


async def test_failed_boot_is_retried_with_a_new_sandbox(examples, factory):
    """A sandbox that fails to boot is replaced (nothing ran in it); a third failure is final."""
    task = examples["textstats-1"]
    broken = sandbox_factory_for("local", options={"bwrap": "/nonexistent/bwrap"})
    built = []

    def flaky_factory(t):
        built.append(t.instance_id)
        return broken(t) if len(built) == 1 else factory(t)

    grade = await ScaleSWEGrader(timeout=120).grade(task, gold_patch(task), flaky_factory)
    assert grade.error is None and grade.reward == 1.0
    assert len(built) == 2

    def always_broken(t):
        built.append(t.instance_id)
        return broken(t)

    built.clear()
    grade = await ScaleSWEGrader().grade(task, gold_patch(task), always_broken)
    assert grade.error is not None and len(built) == 3


def test_registered_as_a_plugin(agentrl_registry):
    """Both graders are registered by the built-in graders plugin."""
    assert agentrl_registry.get("grader", "scaleswe") is ScaleSWEGrader
    assert agentrl_registry.owner("grader", "swebench") == "agentrl.graders"


def test_looking_up_graders_does_not_import_swebench():
    """Registering and constructing the graders leaves the swebench package unimported."""
    code = (
        "import sys\n"
        "from agentrl.plugins import get_grader\n"
        "get_grader('swebench')(); get_grader('scaleswe')()\n"
        "assert 'swebench' not in sys.modules, sorted(m for m in sys.modules if 'sweb' in m)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
