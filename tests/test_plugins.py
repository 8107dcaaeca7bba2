"""Plugin manager: registration, lookup errors, duplicates, blocking, tracing, observers."""

from __future__ import annotations

import json
import logging
import os
import pathlib
import subprocess
import sys
import types

import pluggy
import pytest

from agentrl import hookimpl, plugins
from agentrl.plugins import NotAvailableError, PluginError, PluginRegistry
from agentrl.types import Outcome, RolloutFinishedEvent, TurnRecordedEvent


def _plugin(name: str, **hooks) -> types.ModuleType:
    """A module-like plugin object carrying the given hook implementations."""
    module = types.ModuleType(name)
    for hook_name, function in hooks.items():
        function.__name__ = hook_name
        setattr(module, hook_name, hookimpl(function))
    return module


def _kind_class(name: str, **attrs) -> type:
    return type(f"Fake_{name}", (), {"name": name, **attrs})


@pytest.fixture
def registry():
    """A registry with the built-ins but without entry points, isolated from the process one."""
    reg = PluginRegistry(load_entrypoints=False, disabled=())
    previous = plugins.reset_registry(reg)
    yield reg
    plugins.reset_registry(previous)


@pytest.mark.parametrize(
    ("hook_name", "kind", "extra_attrs"),
    [
        ("register_engines", "engine", {}),
        ("register_adapters", "adapter", {}),
        ("register_sandboxes", "sandbox", {}),
        ("register_harnesses", "harness", {}),
        ("register_graders", "grader", {}),
        ("register_parsers", "tool_parser", {"parser_type": "tool_call"}),
        ("register_parsers", "reasoning_parser", {"parser_type": "reasoning"}),
    ],
)
def test_register_hooks_fill_typed_registries(registry, hook_name, kind, extra_attrs):
    """A class registered through a register_* hook is found by its kind and name."""
    cls = _kind_class("fake-one", **extra_attrs)
    registry.pm.register(_plugin("fakeplugin", **{hook_name: lambda register: register(cls)}))
    assert registry.get(kind, "fake-one") is cls
    assert "fake-one" in registry.available(kind)
    assert registry.owner(kind, "fake-one") == "fakeplugin"


def test_hook_register_engines(registry):
    """register_engines: an engine plugin is reachable through get_engine."""
    cls = _kind_class("fake-engine")
    registry.pm.register(_plugin("p", register_engines=lambda register: register(cls)))
    assert plugins.get_engine("fake-engine") is cls


def test_hook_register_adapters(registry):
    """register_adapters: an adapter plugin is reachable through get_adapter."""
    cls = _kind_class("fake-adapter")
    registry.pm.register(_plugin("p", register_adapters=lambda register: register(cls)))
    assert plugins.get_adapter("fake-adapter") is cls


def test_hook_register_sandboxes(registry):
    """register_sandboxes: a sandbox plugin is reachable through get_sandbox."""
    cls = _kind_class("fake-sandbox")
    registry.pm.register(_plugin("p", register_sandboxes=lambda register: register(cls)))
    assert plugins.get_sandbox("fake-sandbox") is cls


def test_hook_register_harnesses(registry):
    """register_harnesses: a harness plugin is reachable through get_harness."""
    cls = _kind_class("fake-harness")
    registry.pm.register(_plugin("p", register_harnesses=lambda register: register(cls)))
    assert plugins.get_harness("fake-harness") is cls


def test_hook_register_graders(registry):
    """register_graders: a grader plugin is reachable through get_grader."""
    cls = _kind_class("fake-grader")
    registry.pm.register(_plugin("p", register_graders=lambda register: register(cls)))
    assert plugins.get_grader("fake-grader") is cls


def test_hook_register_parsers(registry):
    """register_parsers: parser_type routes a class to the tool-call or reasoning registry."""
    tool = _kind_class("fake-p", parser_type="tool_call")
    reasoning = _kind_class("fake-p", parser_type="reasoning")

    def register_parsers(register):
        register(tool)
        register(reasoning)

    registry.pm.register(_plugin("p", register_parsers=register_parsers))
    assert plugins.get_tool_parser("fake-p") is tool
    assert plugins.get_reasoning_parser("fake-p") is reasoning


def test_parser_without_valid_type_is_rejected(registry):
    """A parser class with an unknown parser_type fails with the expected values named."""
    bad = _kind_class("bad", parser_type="sideways")
    registry.pm.register(_plugin("p", register_parsers=lambda register: register(bad)))
    with pytest.raises(PluginError, match=r"parser_type='sideways'.*reasoning.*tool_call"):
        registry.available("tool_parser")


def test_unknown_name_lists_available(registry):
    """get_sandbox('nope') names what is available instead."""
    for name in ("alpha", "beta"):
        cls = _kind_class(name)
        registry.pm.register(
            _plugin(f"p-{name}", register_sandboxes=lambda register, c=cls: register(c))
        )
    with pytest.raises(NotAvailableError) as info:
        plugins.get_sandbox("nope")
    message = str(info.value)
    assert "sandbox 'nope' is not available" in message
    assert "alpha, beta" in message


def test_known_optional_backend_names_its_extra(registry, monkeypatch):
    """Asking for a backend an extra provides, when it isn't registered, says what to install."""
    reg = PluginRegistry(builtins=(), load_entrypoints=False, disabled=())
    with pytest.raises(
        NotAvailableError, match=r"pip install 'e2b>=2.0' \(agentrl's \[e2b\] extra"
    ):
        reg.get("sandbox", "e2b")
    with pytest.raises(
        NotAvailableError, match=r"pip install 'swebench>=4.0' \(agentrl's \[swebench"
    ):
        reg.get("grader", "swebench")


def test_unknown_kind_is_a_value_error(registry):
    """A misspelled kind fails with the valid kinds listed."""
    with pytest.raises(ValueError, match=r"unknown plugin kind 'sandboxx'.*'sandbox'"):
        registry.available("sandboxx")


def test_duplicate_name_names_both_plugins(registry):
    """Two plugins registering the same sandbox name fail loudly, naming both."""
    first, second = _kind_class("twin"), _kind_class("twin")
    registry.pm.register(
        _plugin("first-plugin", register_sandboxes=lambda register: register(first))
    )
    registry.pm.register(
        _plugin("second-plugin", register_sandboxes=lambda register: register(second))
    )
    with pytest.raises(PluginError) as info:
        registry.available("sandbox")
    assert "first-plugin" in str(info.value)
    assert "second-plugin" in str(info.value)
    assert "AGENTRL_DISABLE_PLUGINS" in str(info.value)


def test_class_without_name_is_rejected(registry):
    """Registering a class with no `name` says which plugin and hook did it."""
    nameless = type("Nameless", (), {})
    registry.pm.register(_plugin("sloppy", register_graders=lambda register: register(nameless)))
    with pytest.raises(PluginError, match=r"'sloppy'.*register_graders.*name"):
        registry.available("grader")


def test_failing_register_hook_names_plugin(registry):
    """An exception inside a plugin's register hook is reported with the plugin's name."""

    def register_engines(register):
        raise RuntimeError("boom")

    registry.pm.register(_plugin("broken", register_engines=register_engines))
    with pytest.raises(PluginError, match=r"'broken' failed in register_engines.*boom"):
        registry.available("engine")


def test_disable_plugins_env_blocks_by_name(monkeypatch):
    """AGENTRL_DISABLE_PLUGINS blocks a built-in plugin module by name."""
    monkeypatch.setenv("AGENTRL_DISABLE_PLUGINS", "agentrl.graders, other")
    reg = PluginRegistry(load_entrypoints=False)
    names = {reg.plugin_name(p) for p in reg.pm.get_plugins()}
    assert "agentrl.graders" not in names
    assert "agentrl.sandboxes" in names
    with pytest.raises(
        NotAvailableError, match=r"Disabled by AGENTRL_DISABLE_PLUGINS: agentrl\.graders"
    ):
        reg.get("grader", "anything")


def test_misspelled_hook_is_caught():
    """A hookimpl whose name matches no hookspec fails check_pending at startup."""
    typo = _plugin("typo", register_sandboxs=lambda register: None)
    reg = PluginRegistry(builtins=(), load_entrypoints=False, disabled=())
    reg.pm.register(typo)
    with pytest.raises(pluggy.PluginValidationError, match="register_sandboxs"):
        reg.pm.check_pending()


def test_misspelled_hook_fails_registry_start_with_advice(monkeypatch):
    """A plugin module with a misspelled hook makes the registry fail naming it and the fix."""
    typo = _plugin("typo_plugin", register_sandboxs=lambda register: None)
    monkeypatch.setitem(sys.modules, "typo_plugin", typo)
    with pytest.raises(PluginError) as info:
        PluginRegistry(builtins=("typo_plugin",), load_entrypoints=False, disabled=())
    message = str(info.value)
    assert "register_sandboxs" in message
    assert "AGENTRL_DISABLE_PLUGINS=typo_plugin" in message


def test_trace_logs_every_hook_call(caplog):
    """AGENTRL_TRACE_PLUGINS=1 logs each hook call with the plugins it reaches."""
    reg = PluginRegistry(builtins=(), load_entrypoints=False, disabled=(), trace=True)
    seen = []
    reg.pm.register(_plugin("watcher", on_rollout_finished=lambda event: seen.append(event)))
    event = RolloutFinishedEvent(
        instance_id="t-1", outcome=Outcome.SOLVED, reward=1.0, num_samples=1
    )
    with caplog.at_level(logging.INFO, logger="agentrl.plugins"):
        reg.hook.on_rollout_finished(event=event)
    assert seen == [event]
    assert any(
        "hook on_rollout_finished" in rec.message and "watcher" in rec.message
        for rec in caplog.records
    )


def test_trace_enabled_from_environment(monkeypatch, caplog):
    """The environment variable alone turns tracing on."""
    monkeypatch.setenv("AGENTRL_TRACE_PLUGINS", "1")
    reg = PluginRegistry(builtins=(), load_entrypoints=False, disabled=())
    with caplog.at_level(logging.INFO, logger="agentrl.plugins"):
        reg.hook.register_commands(cli=None)
    assert any("hook register_commands" in rec.message for rec in caplog.records)


def test_trace_logs_register_hooks_per_plugin(caplog):
    """Tracing also covers the register_* hooks, which are called one plugin at a time."""
    reg = PluginRegistry(builtins=(), load_entrypoints=False, disabled=(), trace=True)
    cls = _kind_class("traced")
    reg.pm.register(_plugin("tracer", register_sandboxes=lambda register: register(cls)))
    with caplog.at_level(logging.INFO, logger="agentrl.plugins"):
        assert reg.available("sandbox") == ["traced"]
    assert any(
        "hook register_sandboxes" in rec.message and "tracer" in rec.message
        for rec in caplog.records
    )


def test_wrapper_on_a_per_plugin_hook_is_rejected(registry):
    """A wrapper implementation of a register_* hook fails naming the plugin and the option."""

    def register_graders(register):
        yield

    module = types.ModuleType("wrapping")
    register_graders.__name__ = "register_graders"
    module.register_graders = hookimpl(wrapper=True)(register_graders)
    registry.pm.register(module)
    with pytest.raises(PluginError, match=r"'wrapping' implements register_graders as a wrapper"):
        registry.available("grader")


def test_hook_on_turn_recorded(registry):
    """on_turn_recorded: observers receive the frozen event object through notify()."""
    seen = []
    registry.pm.register(_plugin("obs", on_turn_recorded=lambda event: seen.append(event)))
    event = TurnRecordedEvent(
        session_id="s", turn_index=0, prompt_tokens=10, output_tokens=3, finish_reason="stop"
    )
    plugins.notify("on_turn_recorded", event)
    assert seen == [event]
    with pytest.raises(AttributeError):
        event.turn_index = 5  # frozen


def test_hook_on_rollout_finished(registry, caplog):
    """on_rollout_finished: a failing observer is logged and does not break the caller."""
    seen = []

    def broken(event):
        raise RuntimeError("observer bug")

    registry.pm.register(_plugin("bad-obs", on_rollout_finished=broken))
    registry.pm.register(_plugin("good-obs", on_rollout_finished=lambda event: seen.append(event)))
    event = RolloutFinishedEvent(
        instance_id="t", outcome=Outcome.UNSOLVED, reward=0.0, num_samples=1
    )
    with caplog.at_level(logging.ERROR):
        plugins.notify("on_rollout_finished", event)
    assert "observer hook on_rollout_finished failed" in caplog.text
    assert seen == [event]


def test_failing_observer_does_not_silence_the_next(registry, caplog):
    """An observer that raises before another is reached still lets the other see the event."""
    seen = []

    def broken(event):
        raise RuntimeError("observer bug")

    # pluggy calls the last registered implementation first: the broken one runs first.
    registry.pm.register(_plugin("good-obs", on_rollout_finished=lambda event: seen.append(event)))
    registry.pm.register(_plugin("bad-obs", on_rollout_finished=broken))
    event = RolloutFinishedEvent(
        instance_id="t", outcome=Outcome.UNSOLVED, reward=0.0, num_samples=1
    )
    with caplog.at_level(logging.ERROR):
        plugins.notify("on_rollout_finished", event)
    assert seen == [event]
    assert "failed in plugin 'bad-obs'" in caplog.text


def test_hook_register_commands(registry):
    """register_commands: a plugin adds a subcommand to the agentrl CLI."""
    import click
    from click.testing import CliRunner

    from agentrl.cli import cli

    @click.command("hello-plugin")
    def hello():
        click.echo("hello from a plugin")

    registry.pm.register(_plugin("cmds", register_commands=lambda cli: cli.add_command(hello)))
    try:
        registry.hook.register_commands(cli=cli)
        result = CliRunner().invoke(cli, ["hello-plugin"])
    finally:
        cli.commands.pop("hello-plugin", None)
    assert result.exit_code == 0, result.output
    assert result.output == "hello from a plugin\n"


def test_builtins_are_registered_like_third_party(registry):
    """Built-in plugin modules go through the same manager and are marked as built-in."""
    infos = {info.name: info for info in registry.plugins()}
    for module_name in plugins.BUILTIN_PLUGINS:
        assert infos[module_name].builtin
        assert infos[module_name].distribution == "agentrl"


def test_typed_lookups_return_the_contract_classes(registry):
    """Each ``get_*`` returns a subclass of its kind's contract."""
    from agentrl.adapters.base import Adapter
    from agentrl.engines.base import Engine
    from agentrl.graders.base import Grader
    from agentrl.harnesses.base import Harness
    from agentrl.parsers.base import ReasoningParser, ToolCallParser
    from agentrl.sandboxes.base import Sandbox

    assert issubclass(plugins.get_engine("sglang"), Engine)
    assert issubclass(plugins.get_adapter("anthropic"), Adapter)
    assert issubclass(plugins.get_sandbox("local"), Sandbox)
    assert issubclass(plugins.get_harness("codex"), Harness)
    assert issubclass(plugins.get_grader("scaleswe"), Grader)
    assert issubclass(plugins.get_tool_parser("hermes"), ToolCallParser)
    assert issubclass(plugins.get_reasoning_parser("qwen3"), ReasoningParser)


def test_graders_are_listed_plugins_first(registry):
    """``get_graders`` lists every grader in hook order: a plugin's before the built-ins'."""
    grader = _kind_class("plugin-grader")
    registry.pm.register(
        _plugin("grader_plugin", register_graders=lambda register: register(grader))
    )
    names = [cls.name for cls in plugins.get_graders()]
    assert names[0] == "plugin-grader"
    assert set(names) == {"plugin-grader", "scaleswe", "swebench"}


BROKEN_ERROR = "needs libfoo, which is not installed"


def _broken_distribution(root: pathlib.Path) -> pathlib.Path:
    """A real installed-looking distribution in ``root`` whose `agentrl` entry point's module
    raises ImportError on import, next to a working one that registers a sandbox."""
    for dist, version, ep_name, module, body in (
        (
            "broken-dist",
            "0.1",
            "broken",
            "broken_plugin_mod",
            f"raise ImportError({BROKEN_ERROR!r})",
        ),
        (
            "working-dist",
            "2.3.4",
            "working",
            "working_plugin_mod",
            "from agentrl import hookimpl\n"
            "class Box:\n    name = 'working-box'\n"
            "@hookimpl\ndef register_sandboxes(register):\n    register(Box)\n",
        ),
    ):
        info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(f"[agentrl]\n{ep_name} = {module}\n")
        (root / f"{module}.py").write_text(body + "\n")
    return root


@pytest.fixture
def broken_on_path(tmp_path, monkeypatch):
    """The broken and working distributions importable in this process (sys.path)."""
    root = _broken_distribution(tmp_path / "site")
    monkeypatch.syspath_prepend(str(root))
    yield root
    for module in ("broken_plugin_mod", "working_plugin_mod"):
        sys.modules.pop(module, None)


def test_entry_point_that_fails_to_import_is_recorded_not_raised(broken_on_path, caplog):
    """A plugin module raising ImportError leaves the registry usable; the others still load."""
    with caplog.at_level(logging.WARNING, logger="agentrl.plugins"):
        reg = PluginRegistry(builtins=(), disabled=())
    assert reg.get("sandbox", "working-box").__module__ == "working_plugin_mod"
    failure = reg.failures["broken"]
    assert failure.distribution == "broken-dist" and failure.version == "0.1"
    assert failure.error == f"ImportError: {BROKEN_ERROR}"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "'broken' (entry point broken = broken_plugin_mod in broken-dist 0.1)" in warnings[0]
    assert BROKEN_ERROR in warnings[0]
    assert "AGENTRL_DISABLE_PLUGINS=broken" in warnings[0]


def test_lookup_of_a_missing_name_mentions_the_failed_plugin(broken_on_path):
    """Asking for a name nobody registered says which plugin failed to load and why."""
    reg = PluginRegistry(builtins=(), disabled=())
    with pytest.raises(NotAvailableError) as info:
        reg.get("sandbox", "docker")
    assert f"failed to load and may provide it: 'broken' (ImportError: {BROKEN_ERROR})" in str(
        info.value
    )


def test_failed_plugin_is_listed_and_versions_still_shown(broken_on_path):
    """plugins() lists the broken entry point with its error and the working one's version."""
    infos = {info.name: info for info in PluginRegistry(builtins=(), disabled=()).plugins()}
    assert infos["broken"].error == f"ImportError: {BROKEN_ERROR}"
    assert infos["broken"].registered == {}
    assert (infos["working"].distribution, infos["working"].version) == ("working-dist", "2.3.4")
    assert infos["working"].registered == {"sandbox": ("working-box",)}
    assert infos["working"].error is None


def test_blocked_broken_plugin_is_not_imported(broken_on_path, caplog):
    """AGENTRL_DISABLE_PLUGINS=broken skips the entry point: no import, no warning, no entry."""
    with caplog.at_level(logging.WARNING, logger="agentrl.plugins"):
        reg = PluginRegistry(builtins=(), disabled={"broken"})
    assert reg.failures == {}
    assert "broken_plugin_mod" not in sys.modules
    assert not caplog.records
    assert "broken" not in {info.name for info in reg.plugins()}


def _agentrl(*args: str, pythonpath: pathlib.Path) -> subprocess.CompletedProcess:
    """The installed `agentrl` console command with ``pythonpath`` (and these sources) first."""
    command = pathlib.Path(sys.executable).with_name("agentrl")
    assert command.exists(), f"{command} is missing: install agentrl (pip install -e .)"
    src = pathlib.Path(plugins.__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pythonpath), str(src)])}
    env.pop("AGENTRL_DISABLE_PLUGINS", None)
    return subprocess.run(
        [str(command), *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_broken_entry_point_does_not_break_the_command_line(tmp_path):
    """With a plugin whose module raises ImportError installed, `agentrl --help`, `plugins`
    and a command needing no plugin work, each warning once on stderr naming the entry point."""
    root = _broken_distribution(tmp_path / "site")
    warning = "plugin 'broken' (entry point broken = broken_plugin_mod in broken-dist 0.1)"
    helped = _agentrl("--help", pythonpath=root)
    assert helped.returncode == 0, helped.stderr
    assert "check-tasks" in helped.stdout
    listed = _agentrl("plugins", "--json", pythonpath=root)
    assert listed.returncode == 0, listed.stderr
    by_name = {entry["name"]: entry for entry in json.loads(listed.stdout)}
    assert by_name["broken"]["error"] == f"ImportError: {BROKEN_ERROR}"
    assert by_name["working"]["version"] == "2.3.4"
    checked = _agentrl("check-tasks", str(tmp_path / "missing.jsonl"), pythonpath=root)
    assert checked.returncode == 1, checked.stderr
    assert "cannot open task file" in checked.stderr
    for result in (helped, listed, checked):
        assert result.stderr.count(warning) == 1, result.stderr
        assert "AGENTRL_DISABLE_PLUGINS=broken" in result.stderr
        assert "Traceback" not in result.stderr
    table = _agentrl("plugins", pythonpath=root)
    assert table.returncode == 0, table.stderr
    assert "failed to load" in table.stdout


def test_command_needing_the_broken_plugin_fails_in_one_line(tmp_path):
    """A command asking for a sandbox nobody registered fails in one line naming the plugin
    that failed to load, not with a traceback: a usage error (exit 2), reported before the
    (empty) tasks file is read."""
    root = _broken_distribution(tmp_path / "site")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("")
    result = _agentrl("check-tasks", str(tasks), "--sandbox", "modal", pythonpath=root)
    assert result.returncode == 2, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.stderr
    assert "sandbox 'modal' is not available" in errors[0]
    assert f"'broken' (ImportError: {BROKEN_ERROR})" in errors[0]
    assert "Traceback" not in result.stderr
