"""`agentrl tasks import` reports every record it cannot import (record, column, reason),
writes the rest with --skip-invalid, refuses repeated ids unless --dedupe, refuses empty
sources; SWE-bench as published gets its eval script from swebench's own specs; SWE-rebench
and R2E-Gym rows import to gradable tasks."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import types

import pytest
from click.testing import CliRunner

from agentrl.cli.tasks import tasks_group
from agentrl.graders.swebench import SWEBenchGrader
from agentrl.graders.tasks import load_tasks

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "datasets"
LITE = DATA / "swebench_lite.jsonl"


def import_(*args: str) -> types.SimpleNamespace:
    result = CliRunner().invoke(tasks_group, ["import", *args], catch_exceptions=False)
    return types.SimpleNamespace(code=result.exit_code, output=result.output)


def smith_record(number: int) -> dict:
    """A well-formed SWE-smith record (the schema of huggingface.co/datasets/SWE-bench/SWE-smith)."""
    return {
        "instance_id": f"o__r.0123abcd.func_pm__{number}",
        "repo": "swesmith/o__r.0123abcd",
        "patch": "diff --git a/a.py b/a.py\n--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n",
        "FAIL_TO_PASS": [f"tests/test_a.py::test_{number}"],
        "PASS_TO_PASS": [],
        "created_at": "2025-03-14T00:00:00",
        "image_name": "swesmith.x86_64.o__r.0123abcd",
        "problem_statement": f"bug {number}",
    }


def write_jsonl(path: pathlib.Path, records: list[dict]) -> pathlib.Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_every_bad_record_of_a_500_record_import_is_reported(tmp_path):
    """500 records, three bad in three ways: all three are listed with record number, id,
    column and reason, nothing is written; --skip-invalid writes the 497 others and says
    how many it skipped."""
    records = [smith_record(n) for n in range(500)]
    del records[9]["patch"]  # a missing column
    records[250]["FAIL_TO_PASS"] = "not a list"  # a bad value
    records[499]["image_name"] = None  # no image, and the repo is not a SWE-smith mirror
    records[499]["repo"] = "someone/plain-repo"
    source = write_jsonl(tmp_path / "smith.jsonl", records)
    out = tmp_path / "out.jsonl"
    refused = import_("swe-smith", str(source), "--out", str(out))
    assert refused.code == 1
    assert "3 of its records cannot be imported" in refused.output
    assert "record 10 (o__r.0123abcd.func_pm__9): column 'patch' is missing" in refused.output
    assert "record 251 (o__r.0123abcd.func_pm__250): column 'FAIL_TO_PASS'" in refused.output
    assert "record 500 (o__r.0123abcd.func_pm__499): column 'repo'" in refused.output
    assert "pass --skip-invalid to write the 497 records that import" in refused.output
    assert not out.exists()
    written = import_("swe-smith", str(source), "--out", str(out), "--skip-invalid")
    assert written.code == 0, written.output
    assert "wrote 497 swe-smith tasks" in written.output
    assert "skipped 3 invalid records" in written.output
    assert "skipped: record 251 (o__r.0123abcd.func_pm__250)" in written.output
    assert len(load_tasks(out, grader="auto")) == 497


def test_repeated_instance_ids_refuse_the_import_unless_dedupe(tmp_path):
    """A repeated instance_id is an error naming both records, even with --skip-invalid;
    --dedupe keeps the first and lists the dropped one, so the file loads."""
    records = [smith_record(1), smith_record(2), smith_record(1)]
    records[2]["problem_statement"] = "the second copy"
    source = write_jsonl(tmp_path / "smith.jsonl", records)
    out = tmp_path / "out.jsonl"
    for extra in ((), ("--skip-invalid",)):
        refused = import_("swe-smith", str(source), "--out", str(out), *extra)
        assert refused.code == 1
        assert (
            "record 3 (o__r.0123abcd.func_pm__1): column 'instance_id' repeats record 1's value"
            in refused.output
        )
        assert "pass --dedupe" in refused.output and not out.exists()
    kept = import_("swe-smith", str(source), "--out", str(out), "--dedupe")
    assert kept.code == 0, kept.output
    assert "dropped duplicate: record 3 (o__r.0123abcd.func_pm__1)" in kept.output
    assert "dropped 1 records repeating an instance_id" in kept.output
    tasks = [row.task for row in load_tasks(out, grader="auto")]
    assert [t.problem_statement for t in tasks] == ["bug 1", "bug 2"]


@pytest.mark.parametrize("content", ["", "\n\n", "[]"])
def test_an_empty_source_is_refused(tmp_path, content):
    """A source with no record is an error, and no empty task file is written."""
    source = tmp_path / ("empty.json" if content == "[]" else "empty.jsonl")
    source.write_text(content)
    out = tmp_path / "out.jsonl"
    result = import_("swe-smith", str(source), "--out", str(out))
    assert result.code == 1 and "no records in" in result.output
    assert not out.exists()


def test_a_malformed_source_line_is_reported_at_its_line_and_column(tmp_path):
    """A JSONL source line cut short is reported at the end of that line, where the error is."""
    line = json.dumps(smith_record(1))
    source = tmp_path / "s.jsonl"
    source.write_text(json.dumps(smith_record(0)) + "\n" + line[:-1] + "\n")
    result = import_("swe-smith", str(source), "--out", str(tmp_path / "out.jsonl"))
    assert result.code == 1
    assert f"s.jsonl:2:{len(line)}: not valid JSON" in result.output


# -- SWE-bench as published: eval scripts from swebench's per-repository specs -------------


def _installed_swebench_major() -> int:
    import importlib.metadata

    return int(importlib.metadata.version("swebench").split(".")[0])


@pytest.fixture(scope="module")
def swebench4(tmp_path_factory) -> pathlib.Path:
    """swebench 4.1.0 (the last release with per-repository specs), from PyPI, on a path
    of its own: imported first, it shadows the venv's swebench in a subprocess."""
    target = tmp_path_factory.mktemp("swebench4")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(target),
            "swebench==4.1.0",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"cannot install swebench 4.1.0: {result.stderr[-2000:]}"
    return target


def run_with_swebench4(swebench4: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(swebench4), str(ROOT / "src")]))
    return subprocess.run(
        [sys.executable, "-m", "agentrl.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )


def test_published_swebench_rows_say_what_swebench_5_cannot_build(tmp_path):
    """The 12 published columns under the installed swebench 5.x: every record is reported,
    naming the missing eval_script, why 5.x cannot build one and how to get it."""
    if _installed_swebench_major() < 5:
        pytest.fail("this test is about swebench 5.x, the version the swebench extra installs")
    out = tmp_path / "lite.jsonl"
    result = import_("swebench", str(LITE), "--out", str(out))
    assert result.code == 1 and not out.exists()
    for number, instance in ((1, "django__django-11099"), (2, "sympy__sympy-20590")):
        assert f"record {number} ({instance}): column 'eval_script' is missing" in result.output
    assert "MAP_REPO_VERSION_TO_SPECS" in result.output
    assert "pip install 'swebench>=4,<5'" in result.output


@pytest.mark.slow
def test_published_swebench_rows_import_gradable_with_swebench_4_specs(tmp_path, swebench4):
    """Imported where swebench 4.x is installed, the published rows carry the eval script,
    log parser and eval type swebench 4.x builds; the installed swebench 5.x then finds
    nothing missing (only the image, absent on this machine). An unknown repo/version pair
    is reported per record."""
    records = [json.loads(line) for line in LITE.read_text().splitlines()]
    unknown = dict(records[1], instance_id="sympy__sympy-99999", version="0.1")
    source = write_jsonl(tmp_path / "lite.jsonl", [*records, unknown])
    out = tmp_path / "out.jsonl"
    result = run_with_swebench4(swebench4, "tasks", "import", "swebench", str(source))
    assert result.returncode == 2, result.stderr  # --out is required
    result = run_with_swebench4(
        swebench4, "tasks", "import", "swebench", str(source), "--out", str(out), "--skip-invalid"
    )
    assert result.returncode == 0, result.stderr
    assert "record 3 (sympy__sympy-99999): column 'version' '0.1' is not a version of" in (
        result.stderr
    )
    rows = load_tasks(out, grader="swebench")
    grader = SWEBenchGrader()
    for row in rows:
        instance = row.task.grading["instance"]
        assert ">>>>> Start Test Output" in instance["eval_script"]
        reason = grader.check(row.task)
        assert reason is None or "does not exist" in reason or "image" in reason, reason
    django, sympy = (row.task.grading["instance"] for row in rows)
    assert (
        "./tests/runtests.py" in django["eval_script"]
        and "auth_tests.test_validators" in (django["eval_script"])
    )
    assert (django["log_parser"], sympy["log_parser"]) == ("parse_log_django", "parse_log_sympy")
    assert django["eval_type"] == "pass_and_fail"


# -- SWE-rebench ---------------------------------------------------------------------------


def test_swe_rebench_rows_build_their_eval_script_from_install_config(tmp_path):
    """SWE-rebench records (SWE-bench's columns plus install_config, requirements,
    environment, meta, docker_image) become swebench rows whose eval script runs
    install_config.test_cmd on the test patch's files; the installed swebench finds nothing
    missing. Images: the record's docker_image, else swerebench/sweb.eval.x86_64.<id>."""
    out = tmp_path / "rebench.jsonl"
    result = import_("swe-rebench", str(DATA / "swe_rebench.jsonl"), "--out", str(out))
    assert result.code == 0, result.output
    assert "grader swebench" in result.output
    rows = load_tasks(out, grader="auto")
    assert [r.task.grader for r in rows] == ["swebench", "swebench"]
    django, sympy = rows
    assert django.task.image == "swerebench/sweb.eval.x86_64.django_1776_django-16100:latest"
    assert sympy.task.image == "swerebench/sweb.eval.x86_64.sympy_1776_sympy-24100:latest"
    instance = django.task.grading["instance"]
    assert (
        "pytest --no-header -rA --tb=no -p no:cacheprovider tests/auth_tests/test_validators.py"
        in instance["eval_script"]
    )
    assert instance["log_parser"] == "parse_log_pytest"
    assert instance["install_config"]["python"] == "3.9"
    for row in rows:
        reason = SWEBenchGrader().check(row.task)
        assert reason is None or "image" in reason, reason


def test_swe_rebench_without_a_test_command_is_reported(tmp_path):
    """A record whose install_config has no test_cmd names that column and why."""
    record = json.loads(DATA.joinpath("swe_rebench.jsonl").read_text().splitlines()[0])
    del record["install_config"]["test_cmd"]
    source = write_jsonl(tmp_path / "r.jsonl", [record])
    result = import_("swe-rebench", str(source), "--out", str(tmp_path / "out.jsonl"))
    assert result.code == 1
    assert "column 'install_config' has no test_cmd" in result.output


# -- R2E-Gym -------------------------------------------------------------------------------


def test_r2e_gym_rows_import_as_eval_command_rows(tmp_path):
    """R2E-Gym records (no instance_id) become scaleswe rows named <repo>__<commit>, in the
    record's docker_image; a record that expects a test to fail is reported (and skipped
    with --skip-invalid)."""
    out = tmp_path / "r2e.jsonl"
    source = str(DATA / "r2e_gym.json")
    refused = import_("r2e-gym", source, "--out", str(out))
    assert refused.code == 1
    assert (
        "record 3 (pillow__2c3d4e5f60718293a4b5c6d7e8f90123456789ab): column "
        "'expected_output_json' expects 1 tests not to pass" in refused.output
    )
    result = import_("r2e-gym", source, "--out", str(out), "--skip-invalid")
    assert result.code == 0, result.output
    assert "wrote 2 r2e-gym tasks" in result.output and "grader scaleswe" in result.output
    tasks = [row.task for row in load_tasks(out, grader="auto")]
    assert [t.instance_id for t in tasks] == [
        "pandas__0a1b2c3d4e5f60718293a4b5c6d7e8f901234567",
        "scrapy__1b2c3d4e5f60718293a4b5c6d7e8f90123456789",
    ]
    assert tasks[0].image == "namanjain12/pandasnew:0a1b2c3d4e5f60718293a4b5c6d7e8f901234567"
    assert all(t.grader == "scaleswe" and t.workdir == "/testbed" for t in tasks)
    assert "run_tests.sh" in tasks[0].grading["eval_cmd"]


R2E_TESTS = """
import pytest


class TestSeries:
    def test_rename(self):
        assert FIXED

    def test_rename_axis_inplace(self):
        assert True


def test_rename_set_name():
    assert True
"""


@pytest.mark.parametrize(
    ("fixed", "expected", "code"),
    [
        (True, {"TestSeries.test_rename": "PASSED"}, 1),  # a test ran that was not expected
        (
            True,
            {
                "TestSeries.test_rename": "PASSED",
                "TestSeries.test_rename_axis_inplace": "PASSED",
                "test_rename_set_name": "PASSED",
            },
            0,
        ),
        (
            False,
            {
                "TestSeries.test_rename": "PASSED",
                "TestSeries.test_rename_axis_inplace": "PASSED",
                "test_rename_set_name": "PASSED",
            },
            1,
        ),
    ],
)
def test_r2e_comparison_reads_real_pytest_output_as_r2e_gym_does(tmp_path, fixed, expected, code):
    """The comparison the eval command runs reads a real `pytest -rA` run (R2E-Gym's
    run_tests.sh) the way R2E-Gym's parse_log_pytest does, and exits 0 only when every
    test's status is the expected one."""
    import base64

    from agentrl.graders.datasets.r2egym import COMPARE

    (tmp_path / "r2e_tests").mkdir()
    (tmp_path / "r2e_tests" / "test_1.py").write_text(R2E_TESTS.replace("FIXED", str(fixed)))
    log = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "r2e_tests"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    ).stdout
    assert "short test summary info" in log
    compare = tmp_path / "compare.py"
    compare.write_text(COMPARE)
    encoded = base64.b64encode(json.dumps(expected).encode()).decode()
    verdict = subprocess.run(
        [sys.executable, str(compare), encoded],
        input=log,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert verdict.returncode == code, verdict.stdout


@pytest.mark.parametrize("content", ["dup", "empty"])
def test_rollout_refuses_repeated_ids_and_empty_task_files_before_any_stack(
    tmp_path, monkeypatch, content
):
    """`agentrl rollout` on a task file with a repeated instance id (which would write two
    rollouts.jsonl lines for one key) or with no row fails naming the problem, and no
    stack is built."""
    from agentrl.cli import rollout as rollout_cli
    from agentrl.cli.rollout import rollout_command

    tasks = tmp_path / "tasks.jsonl"
    row = '{{"metadata": {{"instance_id": "{}", "eval_cmd": "true"}}}}\n'
    tasks.write_text(
        row.format("a") + row.format("b") + row.format("a") if content == "dup" else ""
    )
    built: list[int] = []
    monkeypatch.setattr(rollout_cli, "run_stack", lambda *a, **k: built.append(1))
    result = CliRunner().invoke(
        rollout_command,
        [
            str(tasks),
            "--grader",
            "scaleswe",
            "--cli-dir",
            str(tmp_path),
            "--out",
            str(tmp_path / "run"),
        ],
    )
    assert result.exit_code == 1, result.output
    expected = f"'a' at {tasks}:1, {tasks}:3" if content == "dup" else f"no tasks in {tasks}"
    assert expected in result.output
    assert built == [] and not (tmp_path / "run" / "rollouts.jsonl").exists()
