"""A real third-party plugin package (tests/example_plugin), installed, found by entry point.

`make test` installs it (`pip install ./tests/example_plugin`); these tests fail, rather than
skip, when it is missing, because discovery through the entry point is what they prove.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest

from agentrl.plugins import NotAvailableError, PluginRegistry
from agentrl.types import Task

INSTALL_HINT = "install it first: pip install ./tests/example_plugin"


def _entry_point():
    eps = importlib.metadata.entry_points(group="agentrl")
    matches = [ep for ep in eps if ep.name == "example"]
    assert matches, f"the example plugin's entry point is not installed; {INSTALL_HINT}"
    return matches[0]


def _plugins_json(**env: str) -> list[dict]:
    result = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "plugins", "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_entry_point_is_declared_by_the_distribution():
    """The plugin is declared in the `agentrl` entry-point group by its own distribution."""
    ep = _entry_point()
    assert ep.value == "agentrl_example_plugin"
    assert ep.dist is not None and ep.dist.name == "agentrl-example-plugin"


def test_discovered_without_code_change():
    """A fresh registry finds the `example` sandbox through the entry point alone."""
    _entry_point()
    registry = PluginRegistry(disabled=())
    cls = registry.get("sandbox", "example")
    assert cls.__module__ == "agentrl_example_plugin"
    assert registry.owner("sandbox", "example") == "example"


def test_listed_with_distribution_and_version():
    """`agentrl plugins --json` lists the plugin with its distribution and version."""
    _entry_point()
    entry = next(e for e in _plugins_json() if e["name"] == "example")
    assert entry["distribution"] == "agentrl-example-plugin"
    assert entry["version"] == importlib.metadata.version("agentrl-example-plugin")
    assert entry["registered"] == {"sandbox": ["example"]}
    assert entry["builtin"] is False


def test_blocked_by_environment():
    """AGENTRL_DISABLE_PLUGINS=example removes it from listing and lookup."""
    _entry_point()
    names = {e["name"] for e in _plugins_json(AGENTRL_DISABLE_PLUGINS="example")}
    assert "example" not in names
    with pytest.raises(NotAvailableError, match="'example' is not available"):
        PluginRegistry(disabled={"example"}).get("sandbox", "example")


async def test_example_sandbox_works_through_the_contract():
    """The plugin's sandbox runs commands and moves files through the Sandbox contract."""
    _entry_point()
    cls = PluginRegistry(disabled=()).get("sandbox", "example")
    task = Task(instance_id="t", problem_statement="p")
    async with cls.from_task(task) as sandbox:
        await sandbox.write_file("/note.txt", "hello")
        result = await sandbox.exec("cat note.txt && echo err >&2")
        assert result.exit_code == 0
        assert result.stdout == "hello"
        assert result.stderr == "err\n"
        assert await sandbox.read_file("/note.txt") == "hello"


def test_error_advice_names_the_entry_point():
    """A broken entry-point plugin is named by its entry point, the name blocking takes."""
    import agentrl_example_plugin

    from agentrl.plugins import _entry_point_name

    _entry_point()
    assert _entry_point_name(agentrl_example_plugin) == "example"
