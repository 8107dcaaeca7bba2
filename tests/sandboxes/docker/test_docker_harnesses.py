"""Every built-in harness solves the example task in ``docker`` sandboxes, token-exactly.

Each CLI is the host's ``agentrl install-clis`` directory bound read-only into a container
of the offline base image (Debian bookworm minbase with python3 and git); the middleware
is reached through its socket directory; the scripted engine plays the harness's own
tools (read, edit, run the tests, finish); the diff is graded in a fresh container.

- Claude Code and opencode are native binaries: nothing else is needed. Codex's native
  binary is started by a Node launcher (``bin/codex.js``), so it needs ``node`` as Qwen
  Code does (below).
- mini-swe-agent is a pip install (``--target`` dir and launcher) run by the image's own
  python3 (3.11, as the host's that installed it).
- Qwen Code is a Node.js program and the image has no ``node``. The ``node_tarball`` option
  would unpack one under ``{state_dir}/node``, but a docker sandbox's writable mounts are
  tmpfs, which Docker mounts ``noexec``, so an unpacked ``node`` cannot run. The host's own
  ``node`` is bound read-only at ``{state_dir}/node/bin/node`` instead (a bind keeps its
  source's mount flags); the image has the glibc and libstdc++ it links against.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from typing import Any

import attrs
import pytest
from cli_support import host_install_of
from mini_support import mini_solution, trained_runs_are_the_outputs
from rollout_support import (
    SANDBOX_PORT,
    claude_solution,
    codex_solution,
    opencode_solution,
    qwen_code_solution,
    textstats_task,
)

from agentrl.graders.scaleswe import ScaleSWEGrader
from agentrl.harnesses.base import DEFAULT_STATE_DIR, Harness
from agentrl.harnesses.claude_code import ClaudeCodeHarness
from agentrl.harnesses.codex import CodexHarness
from agentrl.harnesses.mini_swe_agent import MiniSweAgentHarness
from agentrl.harnesses.opencode import OpencodeHarness
from agentrl.harnesses.qwen_code import QwenCodeHarness
from agentrl.rollout import RolloutConfig, run_rollout
from agentrl.sandboxes.docker import DockerSandbox
from agentrl.types import Outcome

pytestmark = pytest.mark.slow


def host_node_bind() -> dict[str, str]:
    """``{host node: {state_dir}/node/bin/node}``: this host's Node for the container's PATH."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not on PATH; install Node.js >= 20 (the agent CLIs need it)")
    return {os.path.realpath(node): f"{DEFAULT_STATE_DIR}/node/bin/node"}


@attrs.frozen
class Case:
    """One harness: its class, the scripted solution in its tool names, what else it needs."""

    harness: type[Harness]
    solution: Callable[[], list[str]]
    options: dict[str, Any] = attrs.field(factory=dict)
    needs_node: bool = False


CASES = {
    "claude_code": Case(ClaudeCodeHarness, claude_solution),
    "codex": Case(CodexHarness, codex_solution, needs_node=True),
    "mini_swe_agent": Case(MiniSweAgentHarness, mini_solution, {"model_attempts": 1}),
    "opencode": Case(OpencodeHarness, opencode_solution),
    "qwen_code": Case(QwenCodeHarness, qwen_code_solution, needs_node=True),
}


@pytest.mark.parametrize("name", sorted(CASES))
async def test_each_harness_solves_the_example_task_in_containers(
    name, docker_options, agentrl_middleware, scripted_engine
):
    """The CLI fixes the bug in one container and a fresh container grades it: reward 1.0 in
    4 turns, one sample that trains exactly every token the engine sampled, with its
    log-prob, and both containers closed."""
    case = CASES[name]
    binds, cli_path = host_install_of(case.harness)
    if case.needs_node:
        binds = {**binds, **host_node_bind()}
    options = {
        **docker_options,
        "services": {SANDBOX_PORT: agentrl_middleware.unix_path},
        "ro_binds": binds,
    }
    built: list[DockerSandbox] = []

    def factory(task):
        sandbox = DockerSandbox.from_task(task, **options)
        built.append(sandbox)
        return sandbox

    for reply in case.solution():
        scripted_engine.queue(reply)
    harness = case.harness(cli_path=cli_path, extra_args=(), extra_env={}, **case.options)
    result = await run_rollout(
        textstats_task(),
        harness=harness,
        grader=ScaleSWEGrader(),
        sandbox_factory=factory,
        middleware=agentrl_middleware,
        config=RolloutConfig(agent_time_budget=180, eval_timeout=120, middleware_port=SANDBOX_PORT),
    )
    assert result.outcome is Outcome.SOLVED, (result.error, result.agent_log[-3000:])
    assert result.reward == 1.0 and result.turns == 4
    assert "+    for token in text.split():" in result.diff
    assert "5 passed" in result.agent_log
    assert trained_runs_are_the_outputs(result, scripted_engine)
    assert len(built) == 2 and len({box.container_id for box in built}) == 2
    assert all(box._closed for box in built)
