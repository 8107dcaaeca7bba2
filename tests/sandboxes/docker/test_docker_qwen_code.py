"""A real Qwen Code rollout in a ``docker`` sandbox: the scripted engine, the example task.

Qwen Code is a Node.js program and the offline base image (Debian bookworm minbase with
python3 and git) has no ``node``. The harness looks for Node on its ``PATH``, which starts
with ``{state_dir}/bin:{state_dir}/npm/bin:{state_dir}/node/bin``. The ``node_tarball``
option unpacks a Node there, but a docker sandbox's writable mounts (``/tmp``, ``/run``,
the homes) are tmpfs, which Docker mounts ``noexec``: an unpacked ``node`` cannot run
("Permission denied"). So the host's own ``node`` binary is bound read-only at
``{state_dir}/node/bin/node`` (a bind keeps its source's mount flags); the image has the
glibc and libstdc++ it links against. The CLI itself is the host's ``agentrl install-clis``
directory, bound read-only too.
"""

from __future__ import annotations

import os
import shutil
import time

import pytest
from rollout_support import CLI_DIR, SANDBOX_PORT, qwen_code_solution, textstats_task

from agentrl.graders.scaleswe import ScaleSWEGrader
from agentrl.harnesses.base import DEFAULT_STATE_DIR
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


async def test_qwen_code_solves_the_example_task_in_containers(
    docker_options, agentrl_middleware, scripted_engine
):
    """Qwen Code, on the host's Node bound in, fixes the bug; a fresh container grades it:
    reward 1.0, every sampled token trained once."""
    if not (CLI_DIR / "bin" / "qwen").exists():
        pytest.fail(f"Qwen Code is not installed in {CLI_DIR}; run `agentrl install-clis`")
    binds, qwen = QwenCodeHarness.host_install(CLI_DIR)
    options = {
        **docker_options,
        "services": {SANDBOX_PORT: agentrl_middleware.unix_path},
        "ro_binds": {**binds, **host_node_bind()},
    }
    built: list[DockerSandbox] = []

    def factory(task):
        sandbox = DockerSandbox.from_task(task, **options)
        built.append(sandbox)
        return sandbox

    for reply in qwen_code_solution():
        scripted_engine.queue(reply)
    harness = QwenCodeHarness(cli_path=qwen, extra_args=(), extra_env={})
    started = time.monotonic()
    result = await run_rollout(
        textstats_task(),
        harness=harness,
        grader=ScaleSWEGrader(),
        sandbox_factory=factory,
        middleware=agentrl_middleware,
        config=RolloutConfig(agent_time_budget=180, eval_timeout=120, middleware_port=SANDBOX_PORT),
    )
    print(f"\nqwen_code docker rollout: {time.monotonic() - started:.1f}s, {result.timings}")
    assert result.outcome is Outcome.SOLVED, (result.error, result.agent_log[-2000:])
    assert result.reward == 1.0 and result.turns == 4
    assert "+    for token in text.split():" in result.diff
    assert "5 passed" in result.agent_log
    served = [s for s in scripted_engine.served if s.output_ids]
    trained = [
        t
        for s in result.samples
        for t, m in zip(s.tokens[s.prompt_length :], s.loss_mask, strict=True)
        if m
    ]
    assert len(result.samples) == 1
    assert trained == [t for s in served for t in s.output_ids]
    assert len(built) == 2 and len({box.container_id for box in built}) == 2
    assert all(box._closed for box in built)
