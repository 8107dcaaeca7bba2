"""A real mini-swe-agent rollout in a ``docker`` sandbox: the pip install bound read-only,
run by the image's own python3, graded in a fresh container."""

from __future__ import annotations

import pytest
from mini_support import mini_solution, trained_runs_are_the_outputs
from rollout_support import CLI_DIR, SANDBOX_PORT, textstats_task

from agentrl.graders.scaleswe import ScaleSWEGrader
from agentrl.harnesses.mini_swe_agent import MiniSweAgentHarness
from agentrl.rollout import RolloutConfig, run_rollout
from agentrl.sandboxes.docker import DockerSandbox
from agentrl.types import Outcome

pytestmark = pytest.mark.slow


async def test_mini_swe_agent_solves_the_example_task_in_containers(
    docker_options, agentrl_middleware, scripted_engine
):
    """mini-swe-agent fixes the bug in one container; a fresh one grades it: reward 1.0, and
    one sample trains exactly every sampled token."""
    if not (CLI_DIR / "bin" / "mini").exists():
        pytest.fail(f"mini-swe-agent is not installed in {CLI_DIR}; run `agentrl install-clis`")
    binds, mini = MiniSweAgentHarness.host_install(CLI_DIR)
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

    for reply in mini_solution():
        scripted_engine.queue(reply)
    result = await run_rollout(
        textstats_task(),
        harness=MiniSweAgentHarness(cli_path=mini, model_attempts=1, extra_args=(), extra_env={}),
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
    assert len(built) == 2 and all(box._closed for box in built)
