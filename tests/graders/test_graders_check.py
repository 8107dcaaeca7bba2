"""`agentrl check-tasks`: gold and empty patches graded per task, broken tasks reported."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import types

import pytest
from click.testing import CliRunner

from agentrl import hookimpl, plugins
from agentrl.cli.check_tasks import check_tasks_command
from agentrl.graders.base import Grader
from agentrl.graders.check import check_task, sandbox_factory_for, why_tests_did_not_run
from agentrl.graders.tasks import TaskRow
from agentrl.rollout.stack import Stack, StackOptions
from agentrl.types import Grade, Task

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "tasks"


def run_cli(*args: str, cwd: pathlib.Path = ROOT) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.endswith(("_PROTOCOL", "_GRADER"))}
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
    result = run_cli("check-tasks", str(path), "--json", "--runs", "1", "--grader", "scaleswe")
    assert result.returncode == 1, result.stdout + result.stderr
    by_id = {r["instance_id"]: r for r in map(json.loads, result.stdout.splitlines())}
    assert by_id["gold-fails"]["status"] == "broken"
    assert by_id["gold-fails"]["reasons"] == [
        "the gold patch does not solve the task: the tests ran and failed (exit 1)"
    ]
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
        gold=[Grade(reward=1.0, solved=True), Grade(reward=0.0, solved=False)],
        empty=[Grade(reward=0.0, solved=False)] * 2,
    )
    result = await check_task(_row(), grader, sandbox_factory=None, runs=2)
    assert result.broken
    assert result.reasons == ("flaky: the gold patch solved 1 of 2 runs",)
    assert result.gold_rewards == (1.0, 0.0)


async def test_grader_errors_and_unapplied_gold_are_broken():
    """A grader error or a gold patch that does not apply is reported as such."""
    errors = ScriptedGrader(
        gold=[Grade(reward=0.0, solved=False, error="sandbox died")],
        empty=[Grade(reward=0.0, solved=False)],
    )
    result = await check_task(_row(), errors, sandbox_factory=None, runs=1)
    assert result.reasons == ("grader error on the gold patch: sandbox died",)
    unapplied = ScriptedGrader(
        gold=[Grade(reward=0.0, solved=False, applied_cleanly=False)],
        empty=[Grade(reward=0.0, solved=False)],
    )
    result = await check_task(_row(), unapplied, sandbox_factory=None, runs=1)
    assert result.reasons == ("the gold patch does not apply",)
    healthy = ScriptedGrader(
        gold=[Grade(reward=1.0, solved=True)], empty=[Grade(reward=0.0, solved=False)]
    )
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


@pytest.mark.slow
def test_test_command_that_cannot_run_is_not_a_failing_gold_patch(tmp_path):
    """pytest missing, a command not found and a collection error are each reported as the
    test command not running, with the cause named; tests that ran and failed (even with a
    ModuleNotFoundError inside a test) are reported as the gold patch not solving the task.
    The JSON carries the grader's output tail and -v shows it under each broken task."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "mod.py").write_text("VALUE = 1\n")
    (repo / "test_value.py").write_text(
        "import importlib\nimport mod\n\n\n"
        "def test_value():\n    assert mod.VALUE == 2\n\n\n"
        "def test_helper():\n    importlib.import_module('helper_the_fix_should_add')\n"
    )
    (repo / "test_broken_import.py").write_text("import dependency_not_installed\n")
    (tmp_path / "noop.diff").write_text(
        "--- a/mod.py\n+++ b/mod.py\n@@ -1 +1,2 @@\n VALUE = 1\n+OTHER = 2\n"
    )
    commands = {
        # -S keeps site-packages, hence pytest, out of this real interpreter's path.
        "no-pytest": "python -S -m pytest -q test_value.py",
        "not-found": "pytest-not-installed-anywhere -q",
        "uncollectable": "python -m pytest -q test_broken_import.py",
        "tests-fail": "python -m pytest -q test_value.py",
    }
    path = tmp_path / "tasks.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {
                    "metadata": {
                        "instance_id": name,
                        "repo": "repo",
                        "eval_cmd": command,
                        "gold_patch_path": "noop.diff",
                    }
                }
            )
            + "\n"
            for name, command in commands.items()
        )
    )
    result = run_cli("check-tasks", str(path), "--json", "--runs", "1", "--grader", "scaleswe")
    assert result.returncode == 1, result.stdout + result.stderr
    by_id = {r["instance_id"]: r for r in map(json.loads, result.stdout.splitlines())}
    cannot_run = "the test command could not run on the gold patch: "
    (reason,) = by_id["no-pytest"]["reasons"]
    assert reason.startswith(cannot_run + "pytest is missing in the sandbox's Python (")
    assert "No module named pytest" in reason
    assert "No module named pytest" in by_id["no-pytest"]["output_tail"]
    (reason,) = by_id["not-found"]["reasons"]
    assert reason.startswith(cannot_run + "a command was not found (exit 127): ")
    assert "pytest-not-installed-anywhere: command not found" in reason
    (reason,) = by_id["uncollectable"]["reasons"]
    assert reason.startswith(cannot_run + "a module is missing: ")
    assert "No module named 'dependency_not_installed'" in reason
    assert "error during collection" in by_id["uncollectable"]["output_tail"]
    assert by_id["tests-fail"]["reasons"] == [
        "the gold patch does not solve the task: the tests ran and failed (exit 1)"
    ]
    assert "2 failed" in by_id["tests-fail"]["output_tail"]

    verbose = run_cli("check-tasks", str(path), "-v", "--runs", "1", "--grader", "scaleswe")
    assert verbose.returncode == 1, verbose.stderr
    broken_line, tail_line = verbose.stderr.split("broken: no-pytest", 1)[1].splitlines()[:2]
    assert "pytest is missing" in broken_line
    assert tail_line.startswith("    | ") and "No module named pytest" in tail_line


def test_grader_output_decides_ran_or_could_not_run():
    """Exit codes 127/126 and runner-less output mean the tests did not run; a runner summary
    counting passed or failed tests means they ran, whatever the failures say."""

    def grade(exit_code, tail):
        return Grade(
            reward=0.0, solved=False, details={"exit_code": exit_code, "output_tail": tail}
        )

    assert why_tests_did_not_run(grade(1, "== 1 failed, 3 passed in 0.2s ==")) is None
    ran = "E   ModuleNotFoundError: No module named 'foo'\n1 failed in 0.1s\n"
    assert why_tests_did_not_run(grade(1, ran)) is None
    assert why_tests_did_not_run(grade(1, "FAILED (failures=1)\nRan 2 tests in 0.01s\n")) is None
    assert why_tests_did_not_run(grade(127, "")) == "a command was not found (exit 127)"
    assert why_tests_did_not_run(grade(126, "sh: 1: ./run_tests.sh: Permission denied")) == (
        "a command could not be executed (exit 126): sh: 1: ./run_tests.sh: Permission denied"
    )
    assert why_tests_did_not_run(grade(2, "sh: 1: pytest: not found")).startswith(
        "pytest is missing in the sandbox's Python (sh: 1: pytest: not found)"
    )
    no_tests = "collected 0 items\n\n=== no tests ran in 0.01s ===\n"
    assert why_tests_did_not_run(grade(5, no_tests)) == (
        "the tests could not be collected, none ran: === no tests ran in 0.01s ==="
    )
    swebench = Grade(
        reward=0.0,
        solved=False,
        details={"eval_exit_code": 0, "log_tail": "No module named pytest"},
    )
    assert "pytest is missing" in why_tests_did_not_run(swebench)


async def test_broken_task_keeps_the_failing_grades_output_tail():
    """The output tail of the grade that broke the task is kept (and serialized); a healthy
    task keeps none."""
    failing = Grade(
        reward=0.0,
        solved=False,
        details={"exit_code": 1, "output_tail": "AssertionError\n1 failed"},
    )
    grader = ScriptedGrader(gold=[failing], empty=[Grade(reward=0.0, solved=False)])
    result = await check_task(_row(), grader, sandbox_factory=None, runs=1)
    assert result.reasons == (
        "the gold patch does not solve the task: the tests ran and failed (exit 1)",
    )
    assert result.to_dict()["output_tail"] == "AssertionError\n1 failed"
    healthy = ScriptedGrader(
        gold=[Grade(reward=1.0, solved=True)], empty=[Grade(reward=0.0, solved=False)]
    )
    result = await check_task(_row(), healthy, sandbox_factory=None, runs=1)
    assert result.to_dict()["output_tail"] is None


class NoOptionsGrader(Grader):
    """A plugin grader whose constructor takes no options at all, no timeout either."""

    name = "no-options"

    def __init__(self) -> None:
        self.built = True

    def parse_task(self, row):
        return Task(
            instance_id=row["id"],
            problem_statement="",
            grader=self.name,
            metadata={"gold_patch": row["gold"]},
        )

    async def grade(self, task, diff, sandbox_factory):
        return Grade(reward=1.0 if diff else 0.0, solved=bool(diff))


class NoTimeoutGrader(NoOptionsGrader):
    """The same, under its own name, for check-tasks (options are warned about once per class)."""

    name = "no-timeout"


class AnyOptionsGrader(NoOptionsGrader):
    """A plugin grader that takes whatever options it is given as keyword arguments."""

    name = "any-options"

    def __init__(self, **options) -> None:
        self.options = options


class UngradableGrader(NoOptionsGrader):
    """A plugin grader whose check() turns tasks down with a hint in square brackets."""

    name = "ungradable"

    def check(self, task):
        return "the backend is not installed; install it with: pip install 'agentrl[swebench]'"


@pytest.fixture
def grader_plugins():
    """A registry with the built-ins plus fake grader plugins registered through the manager."""
    registry = plugins.PluginRegistry(load_entrypoints=False, disabled=())

    @hookimpl
    def register_graders(register):
        for cls in (NoOptionsGrader, NoTimeoutGrader, AnyOptionsGrader, UngradableGrader):
            register(cls)

    module = types.ModuleType("fake_graders")
    module.register_graders = register_graders
    registry.pm.register(module)
    previous = plugins.reset_registry(registry)
    yield registry
    plugins.reset_registry(previous)


def _plugin_tasks(tmp_path: pathlib.Path, instance_id: str = "plugin-1") -> str:
    path = tmp_path / "plugin-tasks.jsonl"
    path.write_text(json.dumps({"id": instance_id, "gold": "diff --git a/x b/x\n"}) + "\n")
    return str(path)


def test_check_tasks_builds_a_plugin_grader_without_timeout(grader_plugins, tmp_path, caplog):
    """`check-tasks --timeout 5` with a plugin grader taking no timeout grades the task
    (the option is left out with a warning) instead of crashing with a TypeError."""
    result = CliRunner().invoke(
        check_tasks_command,
        [_plugin_tasks(tmp_path), "--protocol", "no-timeout", "--timeout", "5", "--json"],
    )
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert (record["status"], record["gold_rewards"], record["empty_rewards"]) == (
        "ok",
        [1.0, 1.0],
        [0.0, 0.0],
    )
    assert "takes no 'timeout' option; ignoring it" in caplog.text


def test_stack_builds_plugin_graders_the_same_way(grader_plugins):
    """Stack.make_grader goes through Grader.from_options: a grader without a timeout
    parameter is built, one taking **options receives the rollout's grading budget."""
    stack = Stack(
        StackOptions(
            engine_url="http://127.0.0.1:9", tokenizer="/tok", rollout={"eval_timeout": 42}
        )
    )
    assert isinstance(stack.make_grader("no-options"), NoOptionsGrader)
    assert stack.make_grader("any-options").options == {"timeout": 42}


def test_table_shows_bracketed_text_literally(grader_plugins, tmp_path):
    """Task ids and reasons are printed through rich as text: `agentrl[swebench]` and
    `[bold]` survive instead of being read as markup."""
    result = CliRunner().invoke(
        check_tasks_command,
        [_plugin_tasks(tmp_path, "[bold]task"), "--protocol", "ungradable"],
        env={"COLUMNS": "400"},
    )
    assert result.exit_code == 1, result.output
    assert "pip install 'agentrl[swebench]'" in result.stdout
    assert "[bold]task" in result.stdout


def test_sandbox_factory_asks_the_backend_how_to_bind_host_python(grader_plugins):
    """Grading sandboxes get the backend's own ``with_host_python`` options (the local
    sandbox's ``host_python``; a plugin's whatever it declares), none without --host-python."""
    from types import MappingProxyType

    from agentrl.sandboxes.local import LocalSandbox

    class HostPythonSandbox(LocalSandbox):
        """A plugin backend whose host-Python option is spelt its own way."""

        name = "host-python"
        with_host_python = MappingProxyType({"pids": 77})

    @hookimpl
    def register_sandboxes(register):
        register(HostPythonSandbox)

    module = types.ModuleType("host_python_sandbox")
    module.register_sandboxes = register_sandboxes
    grader_plugins.pm.register(module)
    task = Task(instance_id="t", problem_statement="")
    assert sandbox_factory_for("host-python")(task).options.pids == 77
    assert sandbox_factory_for("host-python", host_python=False)(task).options.pids == 1024
    assert sandbox_factory_for("host-python", options={"pids": 5})(task).options.pids == 5
    bound = sandbox_factory_for("local")(task).env
    assert bound["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] == "1"
    assert (
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD"
        not in sandbox_factory_for("local", host_python=False)(task).env
    )
