"""Real opencode rollouts on the textstats example task in the local sandbox.

The CLI is the host's ``agentrl install-clis`` directory bound read-only into bubblewrap;
the scripted engine plays the policy; the diff is graded in a fresh sandbox.
"""

from __future__ import annotations

import pytest
from cli_support import host_install_of
from rollout_support import (
    CORE,
    SANDBOX_PORT,
    opencode_solution,
    textstats_task,
    tool_call,
)

from agentrl.graders.scaleswe import ScaleSWEGrader
from agentrl.harnesses.opencode import OpencodeHarness
from agentrl.rollout import RolloutConfig, RolloutResult, run_rollout
from agentrl.sandboxes.local import LocalSandbox
from agentrl.testing.scripted_engine import ScriptedReply
from agentrl.types import Outcome

pytestmark = pytest.mark.slow


@pytest.fixture
def opencode_install() -> tuple[dict[str, str], str]:
    """Binds and cli_path of the installed opencode (fails when it is missing)."""
    return host_install_of(OpencodeHarness)


async def rollout(install, middleware, **harness_options) -> RolloutResult:
    binds, cli_path = install
    options = {
        "services": {SANDBOX_PORT: middleware.unix_path},
        "ro_binds": binds,
        "host_python": True,
    }
    harness = OpencodeHarness(cli_path=cli_path, extra_args=(), extra_env={}, **harness_options)
    return await run_rollout(
        textstats_task(),
        harness=harness,
        grader=ScaleSWEGrader(),
        sandbox_factory=lambda task: LocalSandbox.from_task(task, **options),
        middleware=middleware,
        config=RolloutConfig(agent_time_budget=180, eval_timeout=120, middleware_port=SANDBOX_PORT),
    )


async def test_opencode_solves_the_example_task(
    opencode_install, agentrl_middleware, scripted_engine
):
    """opencode reads the bug, fixes it with edit, runs the tests with bash: reward 1.0.

    One linear session: one sample whose trained tokens are exactly every engine output,
    in order, with their log-probs.
    """
    for reply in opencode_solution():
        scripted_engine.queue(reply)
    result = await rollout(opencode_install, agentrl_middleware)

    assert result.outcome is Outcome.SOLVED, (result.error, result.agent_log[-2000:])
    assert result.reward == 1.0 and result.agent_exit_code == 0 and result.turns == 4
    assert scripted_engine.pending() == 0
    assert "+    for token in text.split():" in result.diff and ".opencode" not in result.diff
    assert '"tool":"bash"' in result.agent_log and "5 passed" in result.agent_log
    served = scripted_engine.served
    assert len(result.samples) == 1
    sample = result.samples[0]
    trained = [
        (token, logprob)
        for token, mask, logprob in zip(
            sample.tokens[sample.prompt_length :],
            sample.loss_mask,
            sample.rollout_logprobs,
            strict=True,
        )
        if mask
    ]
    assert trained == [pair for g in served for pair in zip(g.output_ids, g.logprobs, strict=True)]
    assert sample.reward == 1.0


async def test_opencode_with_a_failing_engine_is_an_infra_error(
    opencode_install, agentrl_middleware, scripted_engine
):
    """The engine errors after the first turn and opencode gives up: infra_error, removed."""
    scripted_engine.queue(tool_call("read", filePath=CORE))
    scripted_engine.responder = lambda body, headers: ScriptedReply(
        status=500, error="CUDA error: an illegal memory access was encountered"
    )
    result = await rollout(opencode_install, agentrl_middleware)

    assert result.outcome is Outcome.INFRA_ERROR and result.remove_sample, result.error
    assert "failed in the middleware or engine" in result.error
    assert result.agent_exit_code not in (0, -1)


async def test_opencode_stopped_at_its_step_limit_is_unsolved(
    opencode_install, agentrl_middleware, scripted_engine
):
    """With max_steps=1 opencode stops after one tool round trip, nothing fixed: unsolved,
    reward 0.0, and its turns still train."""
    scripted_engine.queue(tool_call("read", filePath=CORE))
    scripted_engine.queue("I ran out of steps.")
    result = await rollout(opencode_install, agentrl_middleware, max_steps=1)

    assert result.outcome is Outcome.UNSOLVED, (result.error, result.agent_log[-2000:])
    assert result.reward == 0.0 and not result.remove_sample and result.samples
    assert result.turns == 2 and result.diff == ""
