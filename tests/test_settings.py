"""The settings table: documented, the only reader of agentrl's variables, typed and exact."""

from __future__ import annotations

import ast
import logging
import pathlib
import re

import attrs
import pytest

from agentrl import settings, settings_doc
from agentrl.settings import SETTINGS, SettingsError

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "agentrl"
DOCS = ROOT / "docs"
SETTINGS_MODULE = SRC / "settings.py"
OUR_PREFIX = re.compile(r"^(AGENTRL|SWE|SLIME)_[A-Z0-9_]+$")
#: Documented AGENTRL_ names that are written into a CLI's environment, never read.
WRITTEN_ONLY = {"AGENTRL_TOKEN", "AGENTRL_SESSION_TOKEN"}
#: The E2B double's process marker (agentrl.testing's own) and where CI's vLLM server runs
#: (tests/support/vllm_server.py): read by tests, not by agentrl.
TEST_ONLY = {"AGENTRL_E2B_DOUBLE_SANDBOX_ID", "AGENTRL_TEST_VLLM_DIR"}


#: Files agentrl ships into sandboxes and never imports itself: the grader's pytest plugin
#: reads the variables the grader sets for it, in the test process.
SANDBOX_SIDE = {SRC / "graders" / "_pytest_report_plugin.py"}


def _modules() -> list[pathlib.Path]:
    return sorted(p for p in SRC.rglob("*.py") if p != SETTINGS_MODULE and p not in SANDBOX_SIDE)


def _package(path: pathlib.Path) -> str:
    """``agentrl.x`` for a top-level module, else the package the module sits in."""
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts if len(parts) == 2 else parts[:-1])


def _is_os_environ(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "environ"
        and isinstance(node.value, ast.Name)
        and node.value.id == "os"
    )


def _is_environment(node: ast.AST) -> bool:
    """``os.environ``, or a mapping named like one (``env``, ``environ``)."""
    return _is_os_environ(node) or (isinstance(node, ast.Name) and node.id in ("env", "environ"))


def _ours(node: ast.AST) -> bool:
    """A string literal naming one of agentrl's variables."""
    return isinstance(node, ast.Constant) and bool(OUR_PREFIX.match(str(node.value)))


def _call_read(node: ast.Call) -> str | None:
    func = node.func
    if not isinstance(func, ast.Attribute) or func.attr not in ("get", "getenv", "pop"):
        return None
    if not node.args or (isinstance(func.value, ast.Name) and func.value.id == "settings"):
        return None  # the reader itself
    key = node.args[0]
    if _ours(key):
        return f".{func.attr}({key.value!r})"
    environment = _is_environment(func.value) or func.attr == "getenv"
    if environment and not isinstance(key, ast.Constant):
        return f"an environment .{func.attr}(<computed name>)"
    return None


def _direct_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for each place that reads one of our variables without the table."""
    found = []
    for node in ast.walk(tree):
        what = None
        if isinstance(node, ast.Call):
            what = _call_read(node)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            if _ours(node.slice):
                what = f"[{node.slice.value!r}]"
            elif _is_os_environ(node.value) and not isinstance(node.slice, ast.Constant):
                what = "os.environ[<computed name>]"
        elif isinstance(node, ast.Compare) and _ours(node.left):
            if isinstance(node.ops[0], ast.In | ast.NotIn) and _is_environment(node.comparators[0]):
                what = f"{node.left.value!r} in ..."
        if what:
            found.append((node.lineno, what))
    return found


def _constants(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


# -- the table and its documentation ------------------------------------------------------


def test_docs_table_is_the_generated_one():
    """docs/settings.md holds exactly the table the code generates."""
    text = (DOCS / "settings.md").read_text()
    assert text == settings_doc.replace_table(text), (
        "docs/settings.md is out of date with agentrl.settings.SETTINGS; regenerate it with "
        "`python -m agentrl.settings_doc --write docs/settings.md`"
    )


def test_no_module_reads_our_variables_directly():
    """Only agentrl.settings reads AGENTRL_/SWE_/SLIME_ variables; every other module asks
    it (an environment read by a computed name would hide one, so it counts too)."""
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in _modules()
        for line, what in _direct_reads(ast.parse(path.read_text()))
    ]
    assert not offenders, "read these through agentrl.settings.get:\n" + "\n".join(offenders)


def test_the_scan_catches_direct_reads():
    """The scan above flags each way of reading a variable directly (so it cannot pass
    vacuously), and lets writes and other variables through."""
    code = """
import os
os.environ.get("AGENTRL_X")
os.getenv("SWE_Y", "")
env.get("SLIME_Z")
os.environ["AGENTRL_W"]
"AGENTRL_V" in os.environ
environ.get(name, "")
env["AGENTRL_OUT"] = "1"
os.environ.get("XDG_CACHE_HOME")
settings.get("AGENTRL_X", env)
"AGENTRL_MARKER" in result.stdout
"""
    lines = [line for line, _ in _direct_reads(ast.parse(code))]
    assert lines == [3, 4, 5, 6, 7, 8]


def test_every_setting_is_read_by_its_packages():
    """Each row's name appears in the code of exactly the packages its ``readers`` lists:
    no dead rows, and the docs' sections name the right owner."""
    names: dict[str, set[str]] = {}
    for path in _modules():
        for constant in _constants(path) & {s.name for s in SETTINGS}:
            names.setdefault(constant, set()).add(_package(path))
    wrong = {
        s.name: (sorted(s.readers), sorted(names.get(s.name, ())))
        for s in SETTINGS
        if set(s.readers) != names.get(s.name, set())
    }
    assert not wrong, f"readers (table, code) disagree: {wrong}"


def test_every_documented_variable_is_in_the_table():
    """Every AGENTRL_ name in docs/ or the README is a setting (or one of its aliases)."""
    known = {name for s in SETTINGS for name in s.names}
    documented = set()
    for path in [*DOCS.glob("*.md"), ROOT / "README.md"]:
        documented |= set(re.findall(r"\bAGENTRL_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    missing = sorted(documented - known - WRITTEN_ONLY - TEST_ONLY)
    assert not missing, f"documented but not in agentrl.settings.SETTINGS: {missing}"
    assert "AGENTRL_EVAL_TIMEOUT" in documented  # the scan found the docs


def test_table_is_well_formed():
    """Names are unique across names and aliases, fallbacks exist, help is one line."""
    all_names = [name for s in SETTINGS for name in s.names]
    assert len(all_names) == len(set(all_names))
    by_name = {s.name: s for s in SETTINGS}
    for s in SETTINGS:
        assert s.fallback is None or s.fallback in by_name, s.name
        assert s.help and "\n" not in s.help, s.name
        assert s.readers, s.name


def test_settings_module_is_layer_zero():
    """agentrl.settings imports only the standard library and attrs."""
    tree = ast.parse(SETTINGS_MODULE.read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"__future__", "json", "logging", "os", "pathlib", "shlex", "sys"} | {
        "collections",
        "typing",
        "attrs",
    }


def test_table_defaults_match_the_classes_that_use_them():
    """A default in the table is the default of the field it fills (so the docs are true)."""
    from agentrl.graders.base import DEFAULT_GRADE_TIMEOUT
    from agentrl.graders.tasks import DEFAULT_PROTOCOL
    from agentrl.rollout import config as rollout_config
    from agentrl.sandboxes.base import DEFAULT_MAX_OUTPUT_BYTES
    from agentrl.sandboxes.e2b import options as e2b_options
    from agentrl.slime import config as slime_config

    pairs = [
        (slime_config.SlimeConfig, slime_config._FIELD_SETTINGS),
        (rollout_config.RolloutConfig, rollout_config._ENV_SETTINGS),
        (e2b_options.E2BOptions, e2b_options._SETTINGS),
    ]
    checked = 0
    for cls, fields in pairs:
        defaults = attrs.fields_dict(cls)
        for field, name in fields.items():
            table = settings.setting(name)
            if table.default is None or table.default == ():
                continue
            assert defaults[field].default == table.default, (cls.__name__, field, name)
            checked += 1
    assert checked >= 20
    assert settings.get("AGENTRL_SANDBOX_MAX_OUTPUT_BYTES", {}) == DEFAULT_MAX_OUTPUT_BYTES
    assert settings.get("AGENTRL_GRADE_TIMEOUT", {}) == DEFAULT_GRADE_TIMEOUT
    assert settings.get("AGENTRL_TRAIN_GRADER", {}) == DEFAULT_PROTOCOL


def test_builtin_harness_variables_are_table_rows():
    """The built-in harnesses' extra-argument/environment variables are rows of the table."""
    from agentrl.harnesses.claude_code import ClaudeCodeHarness
    from agentrl.harnesses.codex import CodexHarness

    for harness in (ClaudeCodeHarness, CodexHarness):
        for names, kind in ((harness.extra_args_vars, "args"), (harness.extra_env_vars, "env")):
            row = settings.chain(names, kind)
            assert row is settings.setting(names[0]) and row.type == kind


# -- the reader ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "raw", "value"),
    [
        ("AGENTRL_EVAL_TIMEOUT", " 300 ", 300.0),
        ("AGENTRL_PORT", "19000", 19000),
        ("AGENTRL_TRACE_PLUGINS", "1", True),
        ("AGENTRL_TRACE_PLUGINS", "Off", False),
        ("AGENTRL_CLI_DIR", "/opt/clis", pathlib.Path("/opt/clis")),
        ("AGENTRL_DISABLE_PLUGINS", "a, b,,", ("a", "b")),
        ("AGENTRL_SANDBOX_OPTIONS", '{"ro_binds": {}}', {"ro_binds": {}}),
        ("AGENTRL_CODEX_EXTRA_ARGS", "-c 'a=b c'", ("-c", "a=b c")),
        ("AGENTRL_CODEX_EXTRA_ARGS", '["--x", 5]', ("--x", "5")),
        ("AGENTRL_CODEX_EXTRA_ENV", '{"A": "1", "B": 2}', {"A": "1", "B": "2"}),
        ("AGENTRL_HARNESS", "  codex\n", "codex"),
    ],
)
def test_values_are_parsed_by_type(name, raw, value):
    """Each type parses its written form (whitespace around a value is dropped)."""
    assert settings.get(name, {name: raw}) == value


def test_unset_and_blank_give_the_default():
    """Unset and blank are the same: the table's default, or the caller's."""
    assert settings.get("AGENTRL_EVAL_TIMEOUT", {}) == 600.0
    assert settings.get("AGENTRL_EVAL_TIMEOUT", {"AGENTRL_EVAL_TIMEOUT": "  "}) == 600.0
    assert settings.get("AGENTRL_EVAL_TIMEOUT", {}, default=None) is None
    assert settings.get("AGENTRL_MAX_TURNS", {}) is None


def test_the_agentrl_name_wins_then_aliases_in_order(caplog):
    """AGENTRL_* beats every alias; among aliases the listed order; a blank one is skipped;
    a disagreement is logged naming both."""
    env = {"SWE_TRAIN_PROTOCOL": "c", "AGENTRL_TRAIN_PROTOCOL": "b", "AGENTRL_TRAIN_GRADER": "a"}
    with caplog.at_level(logging.WARNING, logger="agentrl.settings"):
        assert settings.get("AGENTRL_TRAIN_GRADER", env) == "a"
    assert "AGENTRL_TRAIN_GRADER='a' and AGENTRL_TRAIN_PROTOCOL='b' disagree" in caplog.text
    env["AGENTRL_TRAIN_GRADER"] = ""
    assert settings.get("AGENTRL_TRAIN_GRADER", env) == "b"
    del env["AGENTRL_TRAIN_PROTOCOL"]
    assert settings.get("AGENTRL_TRAIN_GRADER", env) == "c"
    caplog.clear()
    assert (
        settings.get(
            "AGENTRL_EVAL_TIMEOUT", {"AGENTRL_EVAL_TIMEOUT": "5", "SWE_EVAL_TIMEOUT_SEC": "5"}
        )
        == 5
    )
    assert "disagree" not in caplog.text


def test_the_environment_is_the_default_mapping(monkeypatch):
    """Without ``env`` the process environment is read, at call time."""
    monkeypatch.setenv("SWE_EVAL_TIMEOUT_SEC", "42")
    monkeypatch.delenv("AGENTRL_EVAL_TIMEOUT", raising=False)
    assert settings.get("AGENTRL_EVAL_TIMEOUT") == 42.0


def test_fallback_and_zero_as_unset():
    """AGENTRL_GRADE_TIMEOUT falls back to AGENTRL_EVAL_TIMEOUT (alias included);
    AGENTRL_ROLLOUT_GUARD=0 means unset (derive it)."""
    assert settings.get("AGENTRL_GRADE_TIMEOUT", {"SWE_EVAL_TIMEOUT_SEC": "50"}) == 50.0
    assert (
        settings.get(
            "AGENTRL_GRADE_TIMEOUT", {"AGENTRL_GRADE_TIMEOUT": "7", "AGENTRL_EVAL_TIMEOUT": "9"}
        )
        == 7.0
    )
    assert settings.get("AGENTRL_GRADE_TIMEOUT", {}, default=None) is None
    assert settings.get("AGENTRL_ROLLOUT_GUARD", {"SWE_ROLLOUT_GUARD_SEC": "0"}) is None
    assert settings.get("AGENTRL_ROLLOUT_GUARD", {"SWE_ROLLOUT_GUARD_SEC": "900"}) == 900.0


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"AGENTRL_PORT": "eighteen"}, "AGENTRL_PORT='eighteen' is not an integer"),
        ({"SWE_EVAL_TIMEOUT_SEC": "soon"}, "SWE_EVAL_TIMEOUT_SEC='soon' is not a number"),
        (
            {"SWE_BOOT_CONCURRENCY": "0"},
            "AGENTRL_BOOT_CONCURRENCY must be positive, got '0' (from SWE_BOOT_CONCURRENCY)",
        ),
        ({"AGENTRL_BOOT_RETRIES": "-1"}, "AGENTRL_BOOT_RETRIES must be non-negative, got '-1'"),
        ({"AGENTRL_TRACE_PLUGINS": "maybe"}, "AGENTRL_TRACE_PLUGINS='maybe' is not a boolean"),
        ({"AGENTRL_SANDBOX_OPTIONS": "{"}, "AGENTRL_SANDBOX_OPTIONS is not valid JSON"),
        (
            {"AGENTRL_SANDBOX_OPTIONS": "[1]"},
            "AGENTRL_SANDBOX_OPTIONS must be a JSON object, got list",
        ),
        (
            {"SLIME_AGENT_CC_EXTRA_ARGS": '{"x": 1}'},
            "SLIME_AGENT_CC_EXTRA_ARGS must be a JSON list of strings",
        ),
        (
            {"AGENTRL_CODEX_EXTRA_ARGS": "'unclosed"},
            'AGENTRL_CODEX_EXTRA_ARGS="\'unclosed" is not a valid command line',
        ),
    ],
)
def test_a_bad_value_names_the_variable_and_the_value(env, message):
    """A malformed value is a SettingsError (a ValueError) saying which variable holds what."""
    (name,) = env
    row = next(s for s in SETTINGS if name in s.names)
    with pytest.raises(SettingsError) as caught:
        settings.get(row.name, env)
    assert message in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_unknown_names_and_plugin_chains():
    """Asking for a name the table lacks says where to add it; ``chain`` reads a plugin's
    own variables with the same rules."""
    with pytest.raises(KeyError, match=r"not in agentrl\.settings\.SETTINGS"):
        settings.get("AGENTRL_NO_SUCH_THING", {})
    with pytest.raises(KeyError):
        settings.get("SWE_EVAL_TIMEOUT_SEC", {})  # an alias is not a setting of its own
    own = settings.chain(("MY_PLUGIN_ARGS", "OLD_PLUGIN_ARGS"), "args")
    assert own.read({"OLD_PLUGIN_ARGS": "--a b", "MY_PLUGIN_ARGS": " "}) == ("--a", "b")


# -- the grader names ---------------------------------------------------------------------


def test_grader_names_new_first_then_the_old_ones():
    """AGENTRL_TRAIN_GRADER / AGENTRL_EVAL_GRADER win over the *_PROTOCOL names, which keep
    their old order (AGENTRL_ before SWE_), in the CLI's selection and in slime's config."""
    from agentrl.graders.tasks import select_grader
    from agentrl.slime.config import SlimeConfig

    env = {
        "AGENTRL_TRAIN_GRADER": "a",
        "AGENTRL_TRAIN_PROTOCOL": "b",
        "SWE_TRAIN_PROTOCOL": "c",
        "AGENTRL_EVAL_PROTOCOL": "e",
        "SWE_EVAL_PROTOCOL": "f",
    }
    assert select_grader(env=env) == "a"
    assert select_grader(evaluation=True, env=env) == "e"
    config = SlimeConfig.from_env(env)
    assert (config.grader_name(False), config.grader_name(True)) == ("a", "e")
    env["AGENTRL_EVAL_GRADER"] = "d"
    assert select_grader(evaluation=True, env=env) == "d"
    assert select_grader(env={"SWE_TRAIN_PROTOCOL": "c"}) == "c"
    assert select_grader(evaluation=True, env={}) == "scaleswe"
