"""What a user installs: the built wheel, its metadata and extras, and CI's fresh-machine guard."""

from __future__ import annotations

import email.parser
import os
import pathlib
import re
import subprocess
import sys
import zipfile

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
PIP = (sys.executable, "-m", "pip")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    """The wheel built from this checkout, as `pip wheel .` builds it for a user."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [*PIP, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(REPO_ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("agentrl-*.whl")
    return built


def _extras(wheel: pathlib.Path) -> dict[str, set[str]]:
    """Each extra's requirement names, read from the wheel's METADATA."""
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = email.parser.Parser().parsestr(archive.read(name).decode())
    extras: dict[str, set[str]] = {}
    for requirement in metadata.get_all("Requires-Dist") or []:
        spec, _, marker = requirement.partition(";")
        found = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", marker)
        if found:
            package = re.match(r"[A-Za-z0-9_.\-]+", spec.strip()).group(0).lower()
            extras.setdefault(found.group(1), set()).add(package)
    return extras


def test_wheel_ships_license_type_marker_and_example_tasks(wheel):
    """The wheel carries the Apache-2.0 LICENSE, py.typed, the bundled example tasks, the
    graders' pytest plugin and the verl agent-loop config."""
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        licenses = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert licenses, sorted(names)[:20]
        assert "Apache License" in archive.read(licenses[0]).decode()
    assert "agentrl/py.typed" in names
    assert "agentrl/_examples/tasks/scaleswe.jsonl" in names
    assert "agentrl/_examples/tasks/swebench.jsonl" in names
    for asset in ("view.html", "view.css", "view.js"):  # `agentrl view`'s page
        assert f"agentrl/view/static/{asset}" in names
    # the grader's pytest plugin, uploaded into grading sandboxes as a file
    assert "agentrl/graders/_pytest_report_plugin.py" in names
    # the verl agent-loop config users point agent_loop_config_path at
    assert "agentrl/verl/agent_loop.yaml" in names


def test_every_extra_that_renders_chat_templates_declares_jinja2(wheel):
    """transformers renders chat templates with jinja2 but does not depend on it."""
    extras = _extras(wheel)
    rendering = [name for name, packages in extras.items() if "transformers" in packages]
    assert {"serve", "hf", "demo", "slime", "dev"} <= set(rendering)
    missing = [name for name in rendering if "jinja2" not in extras[name]]
    assert not missing, f"extras with transformers but no jinja2: {missing}"


def test_serve_extra_needs_no_torch_and_demo_reads_gguf(wheel):
    """`[serve]` is the light way to run the middleware; `[demo]` brings the GGUF reader."""
    extras = _extras(wheel)
    assert extras["serve"] == {"transformers", "tokenizers", "jinja2"}
    assert "torch" not in extras["dev"]
    assert {"torch", "gguf", "accelerate", "jinja2"} <= extras["demo"]


def test_wheel_runs_outside_the_checkout(wheel, tmp_path):
    """Installed from the wheel and run from elsewhere, agentrl finds its own files."""
    site = tmp_path / "site"
    subprocess.run(
        [*PIP, "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    probe = "import agentrl, agentrl.cli.demo as d; print(agentrl.__file__); print(d.example_tasks_dir())"
    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    module_file, tasks_dir = result.stdout.split()
    assert pathlib.Path(module_file).is_relative_to(site)
    assert pathlib.Path(tasks_dir) == site / "agentrl" / "_examples" / "tasks"
    version = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "--version"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert version.returncode == 0, version.stderr
    assert "0.1.0" in version.stdout


def _fake_tool(bin_dir: pathlib.Path, name: str, body: str) -> None:
    tool = bin_dir / name
    tool.write_text(f"#!/bin/sh\n{body}\n")
    tool.chmod(0o755)


@pytest.mark.parametrize("outside", [True, False])
def test_ci_guard_refuses_a_machine_where_agentrl_is_installed_outside_the_venv(tmp_path, outside):
    """.ci/guard fails when a python3 outside .venv can import agentrl, and passes otherwise."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if outside:
        _fake_tool(bin_dir, "python3", 'echo "/usr/lib/python3/dist-packages/agentrl/__init__.py"')
    else:
        _fake_tool(bin_dir, "python3", "echo 'No module named agentrl' >&2; exit 1")
    result = subprocess.run(
        ["bash", str(REPO_ROOT / ".ci" / "guard")],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    if outside:
        assert result.returncode == 1
        assert "importable outside .venv" in result.stderr
        assert "/usr/lib/python3/dist-packages/agentrl" in result.stderr
    else:
        assert result.returncode == 0, result.stderr
        assert "no agentrl outside .venv" in result.stdout


def test_ci_runs_the_guard_before_installing_or_testing_anything(tmp_path):
    """.ci/run stops at the guard on such a machine: no apt, no dockerd, no `make test`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    _fake_tool(bin_dir, "python3", 'echo "/usr/lib/python3/dist-packages/agentrl/__init__.py"')
    for tool in ("make", "apt-get", "dockerd", "sudo"):
        _fake_tool(bin_dir, tool, f'echo "{tool} $@" >> "{calls}"')
    result = subprocess.run(
        ["bash", str(REPO_ROOT / ".ci" / "run")],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "importable outside .venv" in result.stderr
    assert not calls.exists(), calls.read_text()
    run = (REPO_ROOT / ".ci" / "run").read_text()
    assert run.index("bash .ci/guard") < min(run.index("system-deps"), run.index("make test"))


def test_every_public_name_resolves_and_import_agentrl_stays_light():
    """Each name in ``agentrl.__all__`` loads from its module on first use (and is the object
    that module defines), while ``import agentrl`` alone pulls in none of the heavy packages."""
    code = (
        "import sys, agentrl\n"
        "heavy = {'aiohttp', 'transformers', 'torch', 'e2b', 'swebench'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
        "import importlib\n"
        "for name in agentrl.__all__:\n"
        "    value = getattr(agentrl, name)\n"
        "    if name != '__version__':\n"
        "        assert value is getattr(importlib.import_module(agentrl._EXPORTS[name]), name)\n"
        "from agentrl import Engine, Grader, Sandbox, Task, hookimpl, run_rollout\n"
        "assert set(agentrl.__all__) == {'__version__', *agentrl._EXPORTS}\n"
        "assert set(agentrl.__all__) <= set(dir(agentrl))\n"
        "print('ok', len(agentrl.__all__))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    light, ok = result.stdout.splitlines()
    assert light == "[]"
    assert ok.startswith("ok ")
    import agentrl

    for contract in ("Engine", "Adapter", "Sandbox", "Harness", "Grader"):
        assert contract in agentrl.__all__
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        agentrl.Nope  # noqa: B018


def _agentrl_modules() -> set[str]:
    """The submodule and subpackage names directly under src/agentrl."""
    package = REPO_ROOT / "src" / "agentrl"
    return {p.stem for p in package.glob("*.py")} | {
        p.name for p in package.iterdir() if (p / "__init__.py").is_file()
    }


def test_no_module_inside_agentrl_imports_from_the_public_face():
    """Internal code imports from the defining modules (``agentrl.types``, ``agentrl.hookspecs``),
    never names from ``agentrl`` itself: only ``from agentrl import <submodule>`` (and the
    package's ``__version__``) is allowed."""
    import ast

    submodules = _agentrl_modules()
    offenders = []
    for path in sorted((REPO_ROOT / "src" / "agentrl").rglob("*.py")):
        if path.name == "__init__.py" and path.parent.name == "agentrl":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "agentrl" and not node.level:
                for alias in node.names:
                    if alias.name not in submodules and alias.name != "__version__":
                        offenders.append(f"{path.relative_to(REPO_ROOT)}: {alias.name}")
    assert not offenders, offenders
