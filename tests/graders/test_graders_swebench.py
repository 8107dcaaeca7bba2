"""The swebench grader: the installed swebench's test spec, ladder and report, on the local sandbox."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import textwrap

import attrs
import pytest

from agentrl.graders.check import sandbox_factory_for
from agentrl.graders.patching import is_protected, swebench_ladder
from agentrl.graders.swebench import (
    SWEBenchGrader,
    _test_exit_code,
    eval_report,
    load_make_test_spec,
    paths_in_test_patch,
)
from agentrl.graders.tasks import gold_patch, load_tasks
from agentrl.types import Task

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "tasks"


@pytest.fixture(scope="module")
def factory():
    return sandbox_factory_for("local")


@pytest.fixture(scope="module")
def task() -> Task:
    (row,) = load_tasks(EXAMPLES / "swebench.jsonl", grader="swebench")
    return row.task


def with_instance(task: Task, **changes) -> Task:
    instance = {**task.grading["instance"], **changes}
    for key, value in changes.items():
        if value is None:
            del instance[key]
    return attrs.evolve(task, grading={"instance": instance})


# -- building the spec -------------------------------------------------------------------


def test_installed_swebench_make_test_spec_location():
    """swebench 5.x keeps make_test_spec in swebench.harness.utils; it is found there."""
    import swebench

    function, module = load_make_test_spec()
    assert callable(function)
    if swebench.__version__.startswith("5."):
        assert module == "swebench.harness.utils"
    else:
        assert module == "swebench.harness.test_spec.test_spec"


def test_example_instance_builds(task):
    """The example instance carries its eval script and log parser, so 5.x builds it."""
    assert SWEBenchGrader().check(task) is None
    spec = SWEBenchGrader().build_test_spec(task)
    assert spec.FAIL_TO_PASS == ["tests/test_version.py::test_compare_numeric_components"]
    assert len(spec.PASS_TO_PASS) == 3
    assert ">>>>> Start Test Output" in spec.eval_script
    assert "SWEBENCH_TEST_EXIT_CODE=$?" in spec.eval_script


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"eval_script": None}, "missing: eval_script"),
        ({"log_parser": "parse_log_nonexistent"}, "parse_log_nonexistent"),
        ({"FAIL_TO_PASS": "[]"}, "no FAIL_TO_PASS"),
        ({"eval_type": "sometimes"}, "eval_type 'sometimes' is not one of"),
        ({"version": {"not": "a string"}, "FAIL_TO_PASS": 3}, "no FAIL_TO_PASS"),
        ({"eval_script": "#!/bin/bash\npytest\n"}, "does not bracket its test output"),
    ],
)
def test_unbuildable_instances_are_reported_by_check(task, changes, expected):
    """check() explains why the installed swebench cannot grade an instance."""
    reason = SWEBenchGrader().check(with_instance(task, **changes))
    assert reason is not None and expected in reason


async def test_unbuildable_instance_grades_as_grader_error(task, factory):
    """grade() on an instance check() rejects is a grader error, not an unsolved task."""
    grade = await SWEBenchGrader().grade(with_instance(task, eval_script=None), "", factory)
    assert grade.error is not None and grade.error.startswith("cannot grade:")
    assert not grade.solved


def test_missing_swebench_is_reported(task, monkeypatch):
    """Without the swebench package, check() says how to install it."""
    load_make_test_spec.cache_clear()
    for name in ("swebench.harness.test_spec.test_spec", "swebench.harness.test_spec"):
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "swebench.harness.utils", None)
    try:
        reason = SWEBenchGrader().check(task)
    finally:
        load_make_test_spec.cache_clear()
    assert (
        reason is not None and "pip install 'swebench>=4.0' (agentrl's [swebench] extra)" in reason
    )


def test_ladder_comes_from_the_installed_swebench():
    """The apply ladder is swebench's own GIT_APPLY_CMDS."""
    from swebench.harness.run_evaluation import GIT_APPLY_CMDS

    ladder = swebench_ladder()
    assert ladder == tuple(GIT_APPLY_CMDS)
    assert ladder[0] == "git apply --verbose"
    assert any(cmd.startswith("patch --batch") for cmd in ladder)


def test_protected_paths_are_what_git_reads_in_the_test_patch(task):
    """Old and new names of a rename (one holding " b/"), a plain unified deletion and a
    name with glob characters come from git's own parser; SWE-bench's runners are added."""
    test_patch = (
        "--- a/tests/gone.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n"
        "diff --git a/tests/old.py b/tests/x b/new.py\nsimilarity index 100%\n"
        "rename from tests/old.py\nrename to tests/x b/new.py\n"
        "diff --git a/tests/t[1].py b/tests/t[1].py\nnew file mode 100644\n--- /dev/null\n"
        "+++ b/tests/t[1].py\n@@ -0,0 +1 @@\n+y\n"
    )
    assert set(paths_in_test_patch(test_patch)) == {
        "tests/old.py",
        "tests/x b/new.py",
        "tests/gone.py",
        "tests/t[1].py",
    }
    patterns = SWEBenchGrader().protected_paths(with_instance(task, test_patch=test_patch))
    assert is_protected("tests/t[1].py", patterns) and not is_protected("tests/t1.py", patterns)
    assert is_protected("tests/runtests.py", patterns) and is_protected("bin/test", patterns)
    example = SWEBenchGrader().protected_paths(task)
    assert is_protected("tests/test_version.py", example)
    assert not is_protected("semver_lite/version.py", example)


def test_test_patch_paths_without_git_on_this_machine(tmp_path, monkeypatch):
    """Without git on the host, the (dataset's) test patch's own headers are read."""
    monkeypatch.setenv("PATH", str(tmp_path))
    test_patch = "--- a/tests/only_here.py\n+++ b/tests/only_here.py\n@@ -1 +1 @@\n-a\n+b\n"
    assert paths_in_test_patch(test_patch) == ("tests/only_here.py",)


# -- reading real pytest output ----------------------------------------------------------


def test_log_parsing_on_real_pytest_output(tmp_path, task):
    """A real `pytest -rA` run between the markers is parsed into F2P/P2P outcomes."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_mix.py").write_text(
        textwrap.dedent(
            """
            import pytest

            def test_ok():
                assert True

            def test_broken():
                assert 1 == 2

            @pytest.mark.skip(reason="not here")
            def test_skipped():
                pass

            @pytest.mark.parametrize("n", [1, 2])
            def test_param(n):
                assert n == 1
            """
        )
    )
    script = (
        "set -uxo pipefail\n"
        ": '>>>>> Start Test Output'\n"
        f"{sys.executable} -m pytest -rA -p no:cacheprovider tests/test_mix.py\n"
        "SWEBENCH_TEST_EXIT_CODE=$?\n"
        ": '>>>>> End Test Output'\n"
        'echo ">>>>> Test Exit Code: $SWEBENCH_TEST_EXIT_CODE"\n'
    )
    run = subprocess.run(
        ["bash", "-c", script + " 2>&1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
    )
    log = run.stdout + run.stderr
    assert "FAILED tests/test_mix.py::test_broken" in log
    spec_task = with_instance(
        task,
        FAIL_TO_PASS=json.dumps(
            ["tests/test_mix.py::test_param[1]", "tests/test_mix.py::test_broken"]
        ),
        PASS_TO_PASS=json.dumps(["tests/test_mix.py::test_ok", "tests/test_mix.py::test_param[2]"]),
    )
    spec = SWEBenchGrader().build_test_spec(spec_task)
    info = eval_report(spec, task.instance_id, "diff", log)
    assert info["patch_successfully_applied"] is True
    assert info["resolved"] is False
    status = info["tests_status"]
    assert status["FAIL_TO_PASS"] == {
        "success": ["tests/test_mix.py::test_param[1]"],
        "failure": ["tests/test_mix.py::test_broken"],
    }
    assert status["PASS_TO_PASS"] == {
        "success": ["tests/test_mix.py::test_ok"],
        "failure": ["tests/test_mix.py::test_param[2]"],
    }


def test_the_test_exit_code_is_the_scripts_last_line():
    """Lines like the eval script's exit-code line printed by the tests themselves come
    before the script's own; the last one is the test command's exit code."""
    log = (
        ">>>>> Start Test Output\nFAILED t.py::a\n>>>>> Test Exit Code: 0\n"
        ">>>>> End Test Output\n+ echo '>>>>> Test Exit Code: 1'\n>>>>> Test Exit Code: 1\n"
    )
    assert _test_exit_code(log) == 1
    assert _test_exit_code("no marker") is None


# -- grading in the local sandbox --------------------------------------------------------


@pytest.mark.slow
async def test_gold_patch_resolves(task, factory):
    """The gold patch resolves the instance: reward 1.0, F2P 1/1, P2P 3/3."""
    grade = await SWEBenchGrader(timeout=120).grade(task, gold_patch(task), factory)
    assert grade.error is None, grade.details
    assert grade.reward == 1.0 and grade.applied_cleanly
    assert grade.details["patch_method"] == "git apply --verbose"
    assert grade.details["fail_to_pass"] == {"passed": 1, "total": 1}
    assert grade.details["pass_to_pass"] == {"passed": 3, "total": 3}
    assert "log_tail" not in grade.details
    assert grade.details["verdict"] == {
        "channel": "swebench log + grader report",
        "report": {
            "processes": 1,
            "sessions": 1,
            "finalized": 1,
            "exit_statuses": [0],
            "outcomes": {"passed": 4},
        },
        "reasons": [],
    }


@pytest.mark.slow
async def test_empty_patch_does_not_resolve(task, factory):
    """The empty patch leaves the F2P test failing: reward 0.0, no error."""
    grade = await SWEBenchGrader(timeout=120).grade(task, "", factory)
    assert grade.error is None, grade.details
    assert grade.reward == 0.0 and grade.applied_cleanly
    assert grade.details["fail_to_pass"] == {"passed": 0, "total": 1}
    assert grade.details["pass_to_pass"] == {"passed": 3, "total": 3}


@pytest.mark.slow
async def test_patch_editing_the_tests_gains_nothing(task, factory):
    """A diff that guts the test file is undone by the eval script's checkout: 0.0."""
    cheat = (
        "diff --git a/tests/test_version.py b/tests/test_version.py\n"
        "--- a/tests/test_version.py\n+++ b/tests/test_version.py\n"
        "@@ -16,3 +16,7 @@ def test_compare_equal_and_prerelease():\n"
        '     assert compare("1.0.0", "1.0.0") == 0\n'
        '     assert compare("1.0.0-rc.1", "1.0.0") == -1\n'
        '     assert compare("2.0.0", "1.9.9") == 1\n'
        "+\n+\n+def test_compare_numeric_components():\n+    pass\n"
    )
    grade = await SWEBenchGrader(timeout=120).grade(task, cheat, factory)
    assert grade.error is None, grade.details
    assert grade.applied_cleanly
    assert grade.reward == 0.0
    assert grade.details["fail_to_pass"] == {"passed": 0, "total": 1}


@pytest.mark.slow
async def test_malformed_diff_is_not_applied(task, factory):
    """A diff no rung of swebench's ladder applies is 0.0 and not applied."""
    grade = await SWEBenchGrader(timeout=120).grade(task, "--- nothing\n+++ here\n@@\n", factory)
    assert grade.error is None
    assert grade.reward == 0.0 and not grade.applied_cleanly
    assert "apply_log" in grade.details


@pytest.mark.slow
async def test_nothing_parsed_keeps_the_log_tail(task, factory):
    """When the eval log has no test results, the Grade carries the log's tail."""
    script = "#!/bin/bash\nset -uxo pipefail\n: '>>>>> Start Test Output'\necho no tests here\n: '>>>>> End Test Output'\n"
    grade = await SWEBenchGrader(timeout=60).grade(
        with_instance(task, eval_script=script), "", factory
    )
    assert grade.error is None
    assert grade.reward == 0.0
    assert grade.details["tests_found"] is False
    assert "no tests here" in grade.details["log_tail"]


@pytest.mark.slow
async def test_grading_timeout_is_a_grader_error(task, factory):
    """An eval script that outruns the budget gives a grader error, not 0.0."""
    script = "#!/bin/bash\n: '>>>>> Start Test Output'\nsleep 60\n: '>>>>> End Test Output'\n"
    grade = await SWEBenchGrader(timeout=2).grade(
        with_instance(task, eval_script=script), "", factory
    )
    assert grade.error is not None and "timed out after 2s" in grade.error
    assert not grade.solved
