"""`agentrl tasks import`: each published schema becomes rows the claiming grader parses and
`agentrl check-tasks` grades; filters, errors, and `agentrl rollout --instance/--limit`."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import types

import pytest
from click.testing import CliRunner

from agentrl.cli.rollout import rollout_command
from agentrl.cli.tasks import tasks_group
from agentrl.graders.tasks import detect_grader, load_tasks

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "datasets"
PRO_SCRIPTS = DATA / "swebench_pro_run_scripts"


def run_cli(*args: str, cwd: pathlib.Path = ROOT) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.endswith(("_PROTOCOL", "_GRADER"))}
    return subprocess.run(
        [sys.executable, "-m", "agentrl.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


def import_(*args: str) -> types.SimpleNamespace:
    result = CliRunner().invoke(tasks_group, ["import", *args], catch_exceptions=False)
    return types.SimpleNamespace(code=result.exit_code, output=result.output)


@pytest.fixture
def verified_parquet(tmp_path) -> pathlib.Path:
    """The Verified fixture written as parquet, the format the hub serves."""
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    path = tmp_path / "verified.parquet"
    pq.write_table(
        pa.Table.from_pylist(json.loads((DATA / "swebench_verified.json").read_text())), path
    )
    return path


@pytest.fixture
def gym_dataset_dir(tmp_path) -> pathlib.Path:
    """The SWE-Gym fixture saved as a Hugging Face datasets directory (save_to_disk)."""
    datasets = pytest.importorskip("datasets")
    rows = json.loads((DATA / "swe_gym.json").read_text())["train"]
    path = tmp_path / "swe-gym"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(path)
    return path


def _sources(verified_parquet, gym_dataset_dir) -> dict[str, tuple[list[str], str, int]]:
    """dataset -> (import arguments, the grader that must claim the rows, row count)."""
    return {
        "verified": (["swebench", str(verified_parquet)], "swebench", 3),
        "rebench": (["swe-rebench", str(DATA / "swe_rebench.jsonl")], "swebench", 2),
        "gym": (["swe-gym", str(gym_dataset_dir)], "swebench", 2),
        "smith": (["swe-smith", str(DATA / "swe_smith.jsonl")], "scaleswe", 2),
        "pro": (
            ["swebench-pro", str(DATA / "swebench_pro.json"), "--scripts-dir", str(PRO_SCRIPTS)],
            "scaleswe",
            2,
        ),
        "r2e": (["r2e-gym", str(DATA / "r2e_gym.json"), "--skip-invalid"], "scaleswe", 2),
    }


@pytest.mark.parametrize("name", ["verified", "rebench", "gym", "smith", "pro", "r2e"])
def test_each_schema_imports_to_rows_its_grader_claims(
    name, tmp_path, verified_parquet, gym_dataset_dir
):
    """Every fixture imports; each row is claimed by the grader named for its dataset and
    parses with it; every row names its instance image."""
    args, grader, count = _sources(verified_parquet, gym_dataset_dir)[name]
    out = tmp_path / f"{name}.jsonl"
    result = import_(*args, "--out", str(out))
    assert result.code == 0, result.output
    assert f"wrote {count} " in result.output and f"grader {grader}" in result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [detect_grader(row) for row in rows] == [grader] * count
    tasks = [r.task for r in load_tasks(out, grader="auto")]
    assert all(task.grader == grader and task.image for task in tasks)


def test_check_tasks_accepts_every_imported_file(tmp_path, verified_parquet, gym_dataset_dir):
    """`agentrl check-tasks` loads each output and its grader's check passes every row; on
    this machine (no Docker images) what stops grading is only the instance image, named.
    R2E-Gym publishes no gold patch, so its rows are left unchecked, saying so."""
    files = {}
    for name, (args, _, _) in _sources(verified_parquet, gym_dataset_dir).items():
        files[name] = tmp_path / f"{name}.jsonl"
        result = import_(*args, "--out", str(files[name]))
        assert result.code == 0, result.output
    result = run_cli("check-tasks", *map(str, files.values()), "--json", "--runs", "1")
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(records) == 13, result.stderr
    for record in records:
        reasons = " ".join(record["reasons"])
        if record["source"].startswith(str(files["r2e"])):
            assert record["status"] == "unchecked" and "no gold patch" in reasons, record
            continue
        image = next(
            json.loads(line)["metadata"]["image"]
            for path in files.values()
            for line in path.read_text().splitlines()
            if json.loads(line)["label"] == record["instance_id"]
        )
        assert f"the task's image {image!r} does not exist" in reasons, record


def test_instance_then_limit_select_rows(tmp_path):
    """--instance keeps the named ids (in dataset order), --limit then cuts to N."""
    out = tmp_path / "v.jsonl"
    result = import_(
        "swebench",
        str(DATA / "swebench_verified.json"),
        "--out",
        str(out),
        "--instance",
        "sympy__sympy-20590",
        "--instance",
        "django__django-11099",
        "--limit",
        "1",
    )
    assert result.code == 0, result.output
    assert [json.loads(line)["label"] for line in out.read_text().splitlines()] == [
        "django__django-11099"
    ]


def test_unknown_instance_missing_column_and_existing_out_are_errors(tmp_path):
    """A mistyped id lists near matches; a missing column names it and the schema; an
    existing --out is kept unless --force."""
    source = str(DATA / "swebench_verified.json")
    out = tmp_path / "v.jsonl"
    bad = import_("swebench", source, "--out", str(out), "--instance", "django__django-1109")
    assert bad.code == 1 and "did you mean django__django-11099" in bad.output
    assert not out.exists()
    smith_as_swebench = import_("swebench", str(DATA / "swe_smith.jsonl"), "--out", str(out))
    assert smith_as_swebench.code == 1
    for column in ("base_commit", "test_patch", "version"):
        assert f"column {column!r} is missing" in smith_as_swebench.output
    assert "the swebench schema" in smith_as_swebench.output
    out.write_text("keep\n")
    refused = import_("swebench", source, "--out", str(out))
    assert refused.code == 1 and "pass --force" in refused.output
    assert out.read_text() == "keep\n"
    assert import_("swebench", source, "--out", str(out), "--force").code == 0
    assert len(out.read_text().splitlines()) == 3


def test_a_datasets_directory_without_the_library_names_the_extra(
    gym_dataset_dir, tmp_path, monkeypatch
):
    """Without the datasets library, a datasets directory is refused naming the extra."""
    monkeypatch.setitem(sys.modules, "datasets", None)
    result = import_("swe-gym", str(gym_dataset_dir), "--out", str(tmp_path / "g.jsonl"))
    assert result.code == 1
    assert "needs the datasets library" in result.output and "[datasets] extra" in result.output


# -- rows graded for real, on the local sandbox -------------------------------------------


def _git(repo: pathlib.Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


CALC_BUGGY = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
CALC_FIXED = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n"
TESTS = "from calc import add, mul\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n"
NEW_TEST = "\n\ndef test_add():\n    assert add(2, 3) == 5\n"


def _repo(tmp_path: pathlib.Path, calc: str, tests: str) -> tuple[pathlib.Path, str]:
    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    (repo / "calc.py").write_text(calc)
    (repo / "tests" / "test_calc.py").write_text(tests)
    (repo / "conftest.py").write_text("")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "Initial commit")
    return repo, _git(repo, "rev-parse", "HEAD").strip()


def _diff(repo: pathlib.Path, path: str, content: str) -> str:
    """The git diff that turns ``path`` into ``content`` (the tree is left unchanged)."""
    before = (repo / path).read_text()
    (repo / path).write_text(content)
    diff = _git(repo, "diff")
    (repo / path).write_text(before)
    return diff


def _on_local_sandbox(out: pathlib.Path, repo: pathlib.Path) -> None:
    """Point imported rows at a host repository instead of their image: the one change the
    local sandbox needs, since it runs no Docker image."""
    rows = []
    for line in out.read_text().splitlines():
        row = json.loads(line)
        row["metadata"].pop("image")
        row["metadata"].get("remote_env_info", {}).pop("image", None)
        row["metadata"]["repo"] = str(repo)
        rows.append(json.dumps(row))
    out.write_text("\n".join(rows) + "\n")


def _check_ok(out: pathlib.Path) -> None:
    result = run_cli("check-tasks", str(out), "--json", "--runs", "1")
    (record,) = [json.loads(line) for line in result.stdout.splitlines()]
    assert record["status"] == "ok", (record, result.stderr)
    assert record["gold_rewards"] == [1.0] and record["empty_rewards"] == [0.0]


@pytest.mark.slow
def test_a_swe_gym_row_grades_with_its_generated_pytest_eval_script(tmp_path):
    """SWE-Gym has no eval script; the one the importer writes applies the test patch and
    runs pytest so swebench's parser reads it: gold solves, empty does not."""
    repo, base = _repo(tmp_path, CALC_BUGGY, TESTS)
    record = {
        "instance_id": "local__calc-1",
        "repo": "local/calc",
        "base_commit": base,
        "version": "0.1",
        "patch": _diff(repo, "calc.py", CALC_FIXED),
        "test_patch": _diff(repo, "tests/test_calc.py", TESTS + NEW_TEST),
        "problem_statement": "add subtracts",
        "hints_text": "",
        "created_at": "2024-01-01T00:00:00Z",
        "FAIL_TO_PASS": ["tests/test_calc.py::test_add"],
        "PASS_TO_PASS": ["tests/test_calc.py::test_mul"],
    }
    (tmp_path / "gym.json").write_text(json.dumps({"train": [record]}))
    out = tmp_path / "gym.jsonl"
    assert import_("swe-gym", str(tmp_path / "gym.json"), "--out", str(out)).code == 0
    _on_local_sandbox(out, repo)
    _check_ok(out)


@pytest.mark.slow
def test_a_swe_smith_row_plants_its_bug_and_grades_by_node_id(tmp_path):
    """The pre_commands plant the bug out of git's sight, the reversed bug patch is the gold
    fix, and the eval command passes only when the FAIL_TO_PASS test does."""
    repo, _ = _repo(tmp_path, CALC_FIXED, TESTS + NEW_TEST)
    record = {
        "instance_id": "local__calc.abcdef12.func_basic__1",
        "repo": "swesmith/local__calc.abcdef12",
        "patch": _diff(repo, "calc.py", CALC_BUGGY),
        "FAIL_TO_PASS": ["tests/test_calc.py::test_add"],
        "PASS_TO_PASS": ["tests/test_calc.py::test_mul"],
        "created_at": "2025-03-14T00:00:00",
        "image_name": "swesmith.x86_64.local__calc.abcdef12",
        "problem_statement": "add subtracts",
    }
    (tmp_path / "smith.jsonl").write_text(json.dumps(record) + "\n")
    out = tmp_path / "smith.jsonl.out"
    assert import_("swe-smith", str(tmp_path / "smith.jsonl"), "--out", str(out)).code == 0
    _on_local_sandbox(out, repo)
    _check_ok(out)


@pytest.mark.slow
def test_a_swebench_pro_row_grades_with_its_run_script_and_parser(tmp_path):
    """The Pro row runs the instance's run_script.sh on the selected files and reads
    parser.py's result: gold solves, empty does not."""
    repo, base = _repo(tmp_path, CALC_BUGGY, TESTS + NEW_TEST)
    iid = "instance_local__calc-0123456789abcdef-vnan"
    scripts = tmp_path / "run_scripts" / iid
    scripts.mkdir(parents=True)
    (scripts / "run_script.sh").write_text(
        'IFS="," read -r -a files <<< "$1"\ncd /app\n'
        'python -m pytest -p no:cacheprovider -v "${files[@]}"\n'
    )
    (scripts / "parser.py").write_text((next(PRO_SCRIPTS.iterdir()) / "parser.py").read_text())
    record = {
        "repo": "local/calc",
        "instance_id": iid,
        "base_commit": base,
        "patch": _diff(repo, "calc.py", CALC_FIXED),
        "test_patch": "",
        "problem_statement": "add subtracts",
        "fail_to_pass": "['tests/test_calc.py::test_add']",
        "pass_to_pass": "['tests/test_calc.py::test_mul']",
        "before_repo_set_cmd": f"git reset --hard {base}\ngit checkout {base} -- tests/test_calc.py",
        "selected_test_files_to_run": "['tests/test_calc.py']",
        "dockerhub_tag": "local.calc-local__calc-0123456789abcdef",
    }
    (tmp_path / "pro.json").write_text(json.dumps([record]))
    out = tmp_path / "pro.jsonl"
    args = ["--scripts-dir", str(tmp_path / "run_scripts")]
    assert import_("swebench-pro", str(tmp_path / "pro.json"), "--out", str(out), *args).code == 0
    _on_local_sandbox(out, repo)
    _check_ok(out)


# -- agentrl rollout --instance / --limit ---------------------------------------------------


def test_rollout_runs_only_the_instances_and_limit_asked_for(tmp_path, monkeypatch):
    """rollout --instance/--limit hand the stack only the chosen tasks; an unknown id is an
    error naming near matches, before any stack is built."""
    from agentrl.cli import rollout as rollout_cli
    from agentrl.rollout.stack import StackOptions

    out = tmp_path / "v.jsonl"
    assert import_("swebench", str(DATA / "swebench_verified.json"), "--out", str(out)).code == 0
    ran: list[list[str]] = []

    def fake_run_stack(options, tasks, out_dir, **kw):
        ran.append([task.instance_id for task in tasks])
        return types.SimpleNamespace(outcomes={}, done=len(tasks))

    monkeypatch.setattr(rollout_cli, "run_stack", fake_run_stack)
    monkeypatch.setattr(rollout_cli, "print_summary", lambda *a, **k: None)
    monkeypatch.setattr(StackOptions, "check", lambda self: None)
    base = [
        str(out),
        "--grader",
        "swebench",
        "--cli-dir",
        str(tmp_path),
        "--out",
        str(tmp_path / "run"),
    ]
    runner = CliRunner()
    result = runner.invoke(
        rollout_command,
        [*base, "--instance", "sympy__sympy-20590", "--instance", "astropy__astropy-12907"],
    )
    assert result.exit_code == 0, result.output
    result = runner.invoke(rollout_command, [*base, "--limit", "2"])
    assert result.exit_code == 0, result.output
    assert ran == [
        ["astropy__astropy-12907", "sympy__sympy-20590"],
        ["astropy__astropy-12907", "django__django-11099"],
    ]
    result = runner.invoke(rollout_command, [*base, "--instance", "sympy__sympy-2059"])
    assert result.exit_code == 1 and "did you mean sympy__sympy-20590" in result.output
    assert len(ran) == 2


@pytest.mark.slow
def test_a_swe_rebench_row_grades_with_the_eval_script_its_install_config_gives(tmp_path):
    """The eval script built from install_config.test_cmd applies the test patch and runs
    that command on its files so swebench's parse_log_pytest reads it: gold solves, empty
    does not."""
    repo, base = _repo(tmp_path, CALC_BUGGY, TESTS)
    record = {
        "instance_id": "local__calc-2",
        "repo": "local/calc",
        "base_commit": base,
        "version": "0.1",
        "patch": _diff(repo, "calc.py", CALC_FIXED),
        "test_patch": _diff(repo, "tests/test_calc.py", TESTS + NEW_TEST),
        "problem_statement": "add subtracts",
        "hints_text": "",
        "created_at": "2024-01-01T00:00:00Z",
        "environment_setup_commit": base,
        "FAIL_TO_PASS": '["tests/test_calc.py::test_add"]',
        "PASS_TO_PASS": '["tests/test_calc.py::test_mul"]',
        "install_config": {
            "python": "3.11",
            "install": "pip install -e .",
            "test_cmd": "python -m pytest --no-header -rA --tb=no -p no:cacheprovider",
        },
        "requirements": "pytest\n",
        "environment": "",
        "meta": {"has_test_patch": True},
    }
    (tmp_path / "rebench.jsonl").write_text(json.dumps(record) + "\n")
    out = tmp_path / "rebench.out.jsonl"
    result = import_("swe-rebench", str(tmp_path / "rebench.jsonl"), "--out", str(out))
    assert result.code == 0, result.output
    _on_local_sandbox(out, repo)
    _check_ok(out)


R2E_TESTS = (
    "from calc import add, mul\n\n\nclass TestCalc:\n    def test_add(self):\n"
    "        assert add(2, 3) == 5\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n"
)


@pytest.mark.slow
def test_an_r2e_gym_row_grades_by_comparing_run_tests_output_with_its_expected_map(tmp_path):
    """The pre_commands hide r2e_tests/ and run_tests.sh; the eval command puts them back,
    runs run_tests.sh and compares its pytest summary with expected_output_json: the fix
    (given as the gold patch, which R2E-Gym does not publish as a diff) solves, the empty
    patch does not."""
    repo, base = _repo(tmp_path, CALC_BUGGY, TESTS)
    (repo / "r2e_tests").mkdir()
    (repo / "r2e_tests" / "test_1.py").write_text(R2E_TESTS)
    (repo / "run_tests.sh").write_text("python -m pytest -rA -p no:cacheprovider r2e_tests\n")
    record = {
        "repo_name": "calc",
        "docker_image": f"namanjain12/calcnew:{base}",
        "commit_hash": base,
        "problem_statement": "add subtracts",
        "expected_output_json": json.dumps({"TestCalc.test_add": "PASSED", "test_mul": "PASSED"}),
        "modified_files": ["calc.py"],
    }
    (tmp_path / "r2e.json").write_text(json.dumps([record]))
    out = tmp_path / "r2e.jsonl"
    result = import_("r2e-gym", str(tmp_path / "r2e.json"), "--out", str(out))
    assert result.code == 0, result.output
    _on_local_sandbox(out, repo)
    row = json.loads(out.read_text())
    row["metadata"]["gold_patch"] = _diff(repo, "calc.py", CALC_FIXED)
    out.write_text(json.dumps(row) + "\n")
    _check_ok(out)
