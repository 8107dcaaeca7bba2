"""The `agentrl` command line: plugin listing and conventions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import click
import pytest
from click.testing import CliRunner

from agentrl import __version__, hookimpl, plugins
from agentrl.cli import cli, main

#: A registry's built-ins with only agentrl's own commands (`agentrl plugins` among them).
COMMANDS_ONLY = ("agentrl.cli.commands",)


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agentrl.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_plugins_json_is_valid_and_complete():
    """`agentrl plugins --json` prints a JSON list with every built-in and its registrations."""
    result = _run("plugins", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    names = {entry["name"] for entry in data}
    assert {"agentrl.engines", "agentrl.sandboxes", "agentrl.graders"} <= names
    for entry in data:
        assert set(entry) == {"name", "distribution", "version", "builtin", "registered", "error"}
        assert entry["error"] is None
        assert isinstance(entry["registered"], dict)
    builtin = next(e for e in data if e["name"] == "agentrl.sandboxes")
    assert builtin["version"] == __version__


def test_plugins_table_lists_plugins():
    """The default output is a table naming each plugin."""
    result = CliRunner().invoke(cli, ["plugins"])
    assert result.exit_code == 0, result.output
    assert "agentrl.sandboxes" in result.output


def test_plugins_table_prints_names_literally():
    """Names in square brackets are shown as text, not swallowed as rich markup."""
    registry = plugins.PluginRegistry(builtins=COMMANDS_ONLY, load_entrypoints=False, disabled=())
    module = types.ModuleType("brackets")
    box = type("Box", (), {"name": "box[extra]"})
    module.register_sandboxes = hookimpl(lambda register: register(box))
    registry.pm.register(module, name="plugin[one]")
    previous = plugins.reset_registry(registry)
    try:
        result = CliRunner().invoke(cli, ["plugins"], env={"COLUMNS": "200"})
    finally:
        plugins.reset_registry(previous)
    assert result.exit_code == 0, result.output
    assert "plugin[one]" in result.output
    assert "sandbox: box[extra]" in result.output


def test_version_and_help():
    """--version and -h follow the usual conventions."""
    runner = CliRunner()
    assert __version__ in runner.invoke(cli, ["--version"]).output
    helped = runner.invoke(cli, ["-h"])
    assert helped.exit_code == 0
    assert "plugins" in helped.output


def test_python_dash_m_agentrl_is_the_command():
    """``python -m agentrl`` runs the same command as the ``agentrl`` script (its exit code too)."""
    run = [sys.executable, "-m", "agentrl"]
    version = subprocess.run([*run, "--version"], capture_output=True, text=True, check=False)
    assert version.returncode == 0 and f"agentrl, version {__version__}" in version.stdout
    wrong = subprocess.run([*run, "no-such-command"], capture_output=True, text=True, check=False)
    assert wrong.returncode == 2 and "No such command" in wrong.stderr


def test_setup_commands_are_registered():
    """`agentrl --help` lists the commands a new user needs: install-clis, examples, demo."""
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for command in ("install-clis", "examples", "demo", "rollout"):
        assert f"  {command} " in result.output, command


BUILTIN_COMMANDS = [
    "check-tasks",
    "demo",
    "examples",
    "images",
    "install-clis",
    "plugins",
    "preflight",
    "rollout",
    "serve",
    "tasks",
    "view",
]


def test_builtin_commands_come_through_the_hook():
    """Every built-in command comes from agentrl.cli.commands' register_commands, nowhere else.

    A registry holding only that plugin fills an empty group with all of them; the other
    built-in plugins add none.
    """
    only = plugins.PluginRegistry(builtins=COMMANDS_ONLY, load_entrypoints=False, disabled=())
    group = click.Group("agentrl")
    only.hook.register_commands(cli=group)
    assert sorted(group.commands) == BUILTIN_COMMANDS
    others = tuple(name for name in plugins.BUILTIN_PLUGINS if name not in COMMANDS_ONLY)
    rest = plugins.PluginRegistry(builtins=others, load_entrypoints=False, disabled=())
    bare = click.Group("agentrl")
    rest.hook.register_commands(cli=bare)
    assert bare.commands == {}


def test_disabling_the_command_plugin_leaves_no_command():
    """AGENTRL_DISABLE_PLUGINS=agentrl.cli.commands blocks the built-in commands like any plugin's."""
    result = _run("plugins", env={**os.environ, "AGENTRL_DISABLE_PLUGINS": "agentrl.cli.commands"})
    assert result.returncode == 2
    assert "No such command 'plugins'" in result.stderr


def test_loading_the_registry_imports_no_command_module():
    """Building the registry and listing plugins (as a slime job does) imports no command
    module, nor click."""
    probe = (
        "import sys\n"
        "from agentrl.plugins import get_registry\n"
        "get_registry().plugins()\n"
        "print(sorted(m for m in sys.modules if m.startswith('agentrl.cli.')), 'click' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['agentrl.cli.commands'] False"


def test_unknown_command_exits_2():
    """An unknown subcommand is a usage error (exit 2) with a message, not a traceback."""
    result = _run("no-such-command")
    assert result.returncode == 2
    assert "No such command" in result.stderr
    assert "Traceback" not in result.stderr


def test_broken_plugin_is_one_line_not_a_traceback(capsys):
    """Two plugins registering one name make `agentrl plugins` exit 2 with the plugin error."""
    registry = plugins.PluginRegistry(builtins=COMMANDS_ONLY, load_entrypoints=False, disabled=())
    for owner in ("first", "second"):
        module = types.ModuleType(owner)
        twin = type("Twin", (), {"name": "twin"})

        def register_sandboxes(register, cls=twin):
            register(cls)

        module.register_sandboxes = hookimpl(register_sandboxes)
        registry.pm.register(module, name=owner)
    previous = plugins.reset_registry(registry)
    try:
        with pytest.raises(SystemExit) as info:
            main(["plugins"])
    finally:
        plugins.reset_registry(previous)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("agentrl: plugin error: sandbox 'twin' is registered twice")
    assert "'first'" in err and "'second'" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("check-tasks", "{tasks}", "--sandbox", "nope"),
            "Invalid value for '--sandbox': sandbox 'nope' is not available",
        ),
        (
            ("check-tasks", "{tasks}", "--grader", "nope"),
            "grader 'nope' is not available (plugin may not be installed); available: ",
        ),
        (
            ("serve", "--engine", "nope", "--tokenizer", "{tasks}"),
            "Invalid value for '--engine': engine 'nope' is not available",
        ),
    ],
)
def test_unknown_plugin_names_exit_2_before_anything_else(tmp_path, args, message):
    """check-tasks and serve: an unknown plugin name is a usage error (exit 2) listing the
    choices, reported before the tasks file (not valid JSON here) is read or the tokenizer
    (not a directory here) is loaded."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("{not json\n")
    result = _run(*(arg.format(tasks=tasks) for arg in args))
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert "not valid JSON" not in result.stderr and "tokenizer" not in result.stderr


def test_check_tasks_on_an_empty_file_exits_1_naming_it(tmp_path):
    """check-tasks on an empty tasks file exits 1 saying the file holds no task, instead of
    exit 0 with "0 tasks"."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    result = _run("check-tasks", str(empty))
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"no tasks in {empty}" in result.stderr
    assert "0 tasks" not in result.stderr and "Traceback" not in result.stderr


def test_counts_are_said_in_the_singular_for_one(tmp_path):
    """check-tasks on one task says "1 task", not "1 tasks"; the shared wording says
    "1 turn" and "0 turns" alike for every command."""
    from rollout_support import example_task_file

    from agentrl.wording import count

    assert (count(1, "turn"), count(0, "turn"), count(2, "sandbox", "sandboxes")) == (
        "1 turn",
        "0 turns",
        "2 sandboxes",
    )
    result = _run("check-tasks", str(example_task_file(tmp_path)), "--runs", "1")
    assert result.returncode == 0, result.stderr
    assert "1 task (auto): 1 well-formed or unchecked" in result.stderr, result.stderr
