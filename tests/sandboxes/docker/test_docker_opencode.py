"""A real opencode rollout in a ``docker`` sandbox: the scripted engine, the example task.

The base image has no Node: opencode is a native binary, bound read-only from the host's
``agentrl install-clis`` directory; the middleware is reached through its socket
directory; the agent's diff is graded in a fresh container.
"""

from __future__ import annotations

import pytest
from rollout_support import CLI_DIR, SANDBOX_PORT, opencode_solution, textstats_task

from agentrl.graders.scaleswe import ScaleSWEGrader
from agentrl.harnesses.opencode import OpencodeHarness
from agentrl.rollout import RolloutConfig, run_rollout
from agentrl.sandboxes.docker import DockerSandbox
from agentrl.types import Outcome

pytestmark = pytest.mark.slow


async def test_opencode_solves_the_example_task_in_containers(
    docker_options, agentrl_middleware, scripted_engine
):
    """opencode fixes the bug in one container; a fresh container grades it: reward 1.0,
    every sampled token trained once."""
    if not (CLI_DIR / "bin" / "opencode").exists():
        pytest.fail(f"opencode is not installed in {CLI_DIR}; run `agentrl install-clis`")
    binds, opencode = OpencodeHarness.host_install(CLI_DIR)
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

    for reply in opencode_solution():
        scripted_engine.queue(reply)
    result = await run_rollout(
        textstats_task(),
        harness=OpencodeHarness(cli_path=opencode, extra_args=(), extra_env={}),
        grader=ScaleSWEGrader(),
        sandbox_factory=factory,
        middleware=agentrl_middleware,
        config=RolloutConfig(agent_time_budget=180, eval_timeout=120, middleware_port=SANDBOX_PORT),
    )
    assert result.outcome is Outcome.SOLVED, (result.error, result.agent_log[-2000:])
    assert result.reward == 1.0 and result.turns == 4
    assert "+    for token in text.split():" in result.diff
    assert "5 passed" in result.agent_log
    assert sum(sum(s.loss_mask) for s in result.samples) == sum(
        len(g.output_ids) for g in scripted_engine.served
    )
    assert len(built) == 2 and len({box.container_id for box in built}) == 2
    assert all(box._closed for box in built)
