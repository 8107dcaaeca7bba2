"""Hostile dataset records: what an imported row may make a shell or the host do."""

from __future__ import annotations

import json
import pathlib
import subprocess

import pytest

from agentrl.graders.datasets import DatasetError, ImportOptions, import_rows, pytest_eval_script


def test_test_ids_with_shell_syntax_reach_pytest_verbatim(tmp_path):
    """Attack: a SWE-smith test id carrying ``$(…)``, backticks and ``;``. Bound: the eval
    command hands each id to pytest as one literal argument and runs nothing else."""
    marker = tmp_path / "pwned"
    evil = [
        f"tests/test_a.py::test_x[$(touch {marker})]",
        f"tests/test_a.py::test_y[`touch {marker}`]",
        f"tests/test_a.py::test_z[a; touch {marker}]",
    ]
    record = {
        "instance_id": "o__r.0123abcd.x__1",
        "repo": "swesmith/o__r.0123abcd",
        "patch": "",
        "FAIL_TO_PASS": evil,
        "PASS_TO_PASS": [],
        "problem_statement": "",
    }
    (tmp_path / "s.jsonl").write_text(json.dumps(record) + "\n")
    with pytest.raises(DatasetError, match="'patch' is empty"):
        import_rows("swe-smith", tmp_path / "s.jsonl")
    record["patch"] = "diff --git a/x b/x\n"
    (tmp_path / "s.jsonl").write_text(json.dumps(record) + "\n")
    (row,) = import_rows("swe-smith", tmp_path / "s.jsonl")
    command = row["metadata"]["eval_cmd"].replace("python -m pytest", "printf '%s\\n'", 1)
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=10)
    assert not marker.exists()
    printed = result.stdout.splitlines()
    assert printed[-3:] == evil


def test_a_test_patch_holding_the_heredoc_delimiter_stays_data(tmp_path):
    """Attack: a test patch with a line equal to the eval script's here-document delimiter,
    followed by a command. Bound: the delimiter is chosen so the whole patch stays input to
    ``git apply``; the command after it never runs."""
    marker = tmp_path / "pwned"
    patch = (
        "diff --git a/tests/t.py b/tests/t.py\n--- a/tests/t.py\n+++ b/tests/t.py\n"
        f"@@ -1 +1,3 @@\n x\n+EOF_AGENTRL_TEST_PATCH\n+touch {marker}\n"
    )
    script = pytest_eval_script("HEAD", patch)
    body = script.split("git apply -v - <<'", 1)[1]
    delimiter, _, rest = body.partition("'\n")
    assert delimiter != "EOF_AGENTRL_TEST_PATCH"
    assert rest.split(f"\n{delimiter}\n", 1)[0] == patch.rstrip("\n")
    echo = script.replace("git apply -v -", "cat >/dev/null")
    shell = subprocess.run(
        ["bash", "-c", echo.split(": '>>>>> Start Test Output'")[0].split("\ncd /testbed\n")[1]],
        capture_output=True,
        text=True,
        timeout=10,
        cwd=tmp_path,
    )
    assert not marker.exists(), shell.stderr


def test_a_pro_instance_id_cannot_point_outside_the_scripts_dir(tmp_path):
    """Attack: a SWE-bench Pro instance_id of ``../secrets`` so the row would upload host
    files from outside --scripts-dir. Bound: the importer refuses the record."""
    outside = tmp_path / "secrets"
    outside.mkdir()
    (outside / "run_script.sh").write_text("cat /etc/shadow\n")
    (outside / "parser.py").write_text("")
    scripts = tmp_path / "run_scripts"
    scripts.mkdir()
    record = {
        "instance_id": "../secrets",
        "repo": "o/r",
        "base_commit": "0" * 40,
        "patch": "x",
        "problem_statement": "",
        "fail_to_pass": "['t']",
        "pass_to_pass": "[]",
        "selected_test_files_to_run": "[]",
    }
    source = pathlib.Path(tmp_path / "pro.json")
    source.write_text(json.dumps([record]))
    with pytest.raises(DatasetError, match="does not name a directory inside --scripts-dir"):
        import_rows("swebench-pro", source, options=ImportOptions(scripts_dir=str(scripts)))
