"""Fixtures of the verl tests."""

from __future__ import annotations

import shutil
import tempfile

import pytest
import yaml

from agentrl.harnesses.claude_code import ClaudeCodeHarness


@pytest.fixture
def loop_config(tmp_path):
    """An agent_loop_config_path file: the shipped entry, set for the local sandbox."""
    from cli_support import host_install_of

    binds, claude = host_install_of(ClaudeCodeHarness)
    short = tempfile.mkdtemp(prefix="arl-")
    entry = {
        "name": "agentrl",
        "_target_": "agentrl.verl.loop.AgentrlAgentLoop",
        "harness": "claude_code",
        "sandbox": "local",
        "grader": "scaleswe",
        "tool_parser": "hermes",
        "reasoning_parser": "qwen3",
        "unix_socket": f"{short}/mw.sock",
        "port": 18001,
        "sandbox_options": {"ro_binds": binds, "host_python": True},
        "harness_options": {"cli_path": claude},
        "rollout": {"agent_time_budget": 120, "eval_timeout": 120, "boot_retries": 0},
    }
    path = tmp_path / "agent_loop.yaml"
    path.write_text(yaml.safe_dump([entry]))
    yield path, entry
    shutil.rmtree(short, ignore_errors=True)
