"""End-to-end rollouts of the real mini-swe-agent (from PyPI) in the real local sandbox.

The scripted SGLang engine answers as a Qwen3 policy would, in the ``hermes`` tool-call
format, calling mini-swe-agent's one tool, ``bash``. Everything else is real: the
middleware's OpenAI Chat Completions adapter, the Qwen3 tokenizer and template,
bubblewrap, the pip-installed CLI run by this machine's python3, git, the scaleswe grader
and the textstats example task.
"""

from __future__ import annotations

import pytest
from cli_support import host_install_of
from mini_support import mini_solution, trained_runs_are_the_outputs
from rollout_support import (
    SANDBOX_PORT,
    textstats_task,
    tool_call,
)

from agentrl.graders.scaleswe import ScaleSWEGrader
from agentrl.harnesses.mini_swe_agent import MiniSweAgentHarness
from agentrl.rollout import RolloutConfig, RolloutResult, run_rollout
from agentrl.sandboxes.local import LocalSandbox
from agentrl.testing.scripted_engine import ScriptedReply
from agentrl.types import Outcome

pytestmark = pytest.mark.slow


def mini_install() -> tuple[dict[str, str], str]:
    """The binds and launcher of the installed mini-swe-agent (fails when it is missing)."""
    return host_install_of(MiniSweAgentHarness)


async def rollout(middleware, **harness_options) -> RolloutResult:
    binds, cli_path = mini_install()
    options = {
        "services": {SANDBOX_PORT: middleware.unix_path},
        "ro_binds": binds,
        "host_python": True,
    }
    harness = MiniSweAgentHarness(
        cli_path=cli_path, extra_args=(), extra_env={}, **{"model_attempts": 1, **harness_options}
    )
    return await run_rollout(
        textstats_task(),
        harness=harness,
        grader=ScaleSWEGrader(),
        sandbox_factory=lambda task: LocalSandbox.from_task(task, **options),
        middleware=middleware,
        config=RolloutConfig(agent_time_budget=180, eval_timeout=120, middleware_port=SANDBOX_PORT),
    )


async def test_mini_swe_agent_solves_the_example_task(agentrl_middleware, scripted_engine):
    """Reads, fixes with python through bash, runs the tests, submits: reward 1.0, exit 0,
    one sample that trains every sampled token with its log-prob."""
    for reply in mini_solution():
        scripted_engine.queue(reply)
    result = await rollout(agentrl_middleware)

    assert result.outcome is Outcome.SOLVED, (result.error, result.agent_log[-3000:])
    assert result.reward == 1.0 and result.agent_exit_code == 0
    assert result.turns == 4 and scripted_engine.pending() == 0
    assert "+    for token in text.split():" in result.diff
    assert "5 passed" in result.agent_log
    assert trained_runs_are_the_outputs(result, scripted_engine)


async def test_a_policy_that_kills_the_cli_is_an_agent_error(agentrl_middleware, scripted_engine):
    """The policy's command kills mini-swe-agent itself: agent_error, its turn still trains."""
    scripted_engine.queue(tool_call("bash", command="kill -9 $PPID"))
    result = await rollout(agentrl_middleware)

    assert result.outcome is Outcome.AGENT_ERROR, (result.error, result.agent_log[-2000:])
    assert result.agent_exit_code not in (0, -1, None)
    assert not result.remove_sample and result.turns == 1
    assert trained_runs_are_the_outputs(result, scripted_engine)


async def test_the_step_limit_ends_the_run_early_and_unsolved(agentrl_middleware, scripted_engine):
    """With step_limit 1, mini stops after one call (exit 0, LimitsExceeded): unsolved."""
    scripted_engine.queue(tool_call("bash", command="cat textstats/core.py"))
    result = await rollout(agentrl_middleware, step_limit=1)

    assert result.outcome is Outcome.UNSOLVED, (result.error, result.agent_log[-2000:])
    assert result.agent_exit_code == 0 and result.turns == 1 and result.reward == 0.0
    assert "LimitsExceeded" in result.agent_log
    assert trained_runs_are_the_outputs(result, scripted_engine)


async def test_an_engine_that_fails_mid_run_is_an_infra_error(agentrl_middleware, scripted_engine):
    """The engine fails on the second call; mini gives up (exit 1): infra_error, removed."""
    scripted_engine.queue(tool_call("bash", command="cat textstats/core.py"))
    scripted_engine.responder = lambda body, headers: ScriptedReply(
        status=500, error="CUDA error: an illegal memory access was encountered"
    )
    result = await rollout(agentrl_middleware)

    assert result.outcome is Outcome.INFRA_ERROR and result.remove_sample, result.error
    assert "failed in the middleware or engine" in result.error
    assert result.agent_exit_code not in (0, -1)
