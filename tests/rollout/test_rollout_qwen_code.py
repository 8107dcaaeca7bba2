"""End-to-end rollouts of the real Qwen Code CLI in the real local sandbox.

As in ``test_rollout.py``: the scripted SGLang engine answers with what a Qwen3 policy would
sample (``hermes`` tool calls naming Qwen Code's real tools), and everything else is real:
the middleware's Chat Completions adapter, the Qwen3 tokenizer and template, bubblewrap,
Qwen Code from npm (``agentrl install-clis``), git, the scaleswe grader, the example task.
"""

from __future__ import annotations

import time

import pytest
from cli_support import host_install_of
from rollout_support import (
    CORE,
    SANDBOX_PORT,
    qwen_code_solution,
    textstats_task,
    tool_call,
)
from test_rollout import assert_spliced_into_one_sample, assert_trained_tokens_were_sampled

from agentrl.graders.scaleswe import ScaleSWEGrader
from agentrl.harnesses.qwen_code import QwenCodeHarness
from agentrl.rollout import RolloutConfig, run_rollout
from agentrl.sandboxes.local import LocalSandbox
from agentrl.types import Outcome

pytestmark = pytest.mark.slow


def qwen_sandboxes(middleware) -> tuple[list[LocalSandbox], callable, str]:
    """A local-sandbox factory binding the host's Qwen Code install, and its cli_path."""
    binds, cli_path = host_install_of(QwenCodeHarness)
    built: list[LocalSandbox] = []
    options = {
        "services": {SANDBOX_PORT: middleware.unix_path},
        "ro_binds": binds,
        "host_python": True,  # this interpreter (and its pytest), bound read-only
    }

    def factory(task) -> LocalSandbox:
        sandbox = LocalSandbox.from_task(task, **options)
        built.append(sandbox)
        return sandbox

    return built, factory, cli_path


async def rollout(middleware, harness_options=None, **config):
    built, factory, cli_path = qwen_sandboxes(middleware)
    harness = QwenCodeHarness(
        cli_path=cli_path, extra_args=(), extra_env={}, **(harness_options or {})
    )
    values = {"agent_time_budget": 180, "eval_timeout": 120, "middleware_port": SANDBOX_PORT}
    started = time.monotonic()
    result = await run_rollout(
        textstats_task(),
        harness=harness,
        grader=ScaleSWEGrader(),
        sandbox_factory=factory,
        middleware=middleware,
        config=RolloutConfig(**{**values, **config}),
    )
    return result, built, time.monotonic() - started


async def test_qwen_code_solves_the_example_task(agentrl_middleware, scripted_engine):
    """Qwen Code reads the bug, fixes it with edit, runs the tests: reward 1.0, token-exact.

    One sample whose trained tokens are exactly every sampled token with its log-prob; every
    turn after the first is spliced onto the chain.
    """
    for reply in qwen_code_solution():
        scripted_engine.queue(reply)
    result, built, seconds = await rollout(agentrl_middleware)
    print(f"\nqwen_code local rollout: {seconds:.1f}s wall, timings {result.timings}")

    assert result.outcome is Outcome.SOLVED, (result.error, result.agent_log[-2000:])
    assert result.reward == 1.0 and not result.remove_sample
    assert result.agent_exit_code == 0 and result.turns == 4
    assert scripted_engine.pending() == 0
    assert "+    for token in text.split():" in result.diff
    assert ".qwen" not in result.diff and "PROBLEM_STATEMENT" not in result.diff
    assert '"type":"result"' in result.agent_log and "5 passed" in result.agent_log
    assert result.sampled_tokens == sum(len(s.output_ids) for s in scripted_engine.served)
    assert all(s.reward == 1.0 for s in result.samples)
    assert_spliced_into_one_sample(result, scripted_engine)
    assert_trained_tokens_were_sampled(result, scripted_engine, result.session_id)
    assert len(built) == 2 and all(sandbox._closed for sandbox in built)


async def test_qwen_code_stopped_by_its_turn_limit_is_an_agent_error(
    agentrl_middleware, scripted_engine
):
    """max_turns=1: Qwen Code stops after one turn with an error exit: agent_error, trainable."""
    scripted_engine.queue(tool_call("read_file", file_path=CORE))
    scripted_engine.queue(tool_call("read_file", file_path="/workspace/README.md"))
    result, _, _ = await rollout(agentrl_middleware, harness_options={"max_turns": 1})

    assert result.outcome is Outcome.AGENT_ERROR, (result.error, result.agent_log[-2000:])
    assert result.agent_exit_code not in (0, -1, None)
    assert not result.remove_sample and result.samples and result.turns == 1
    assert "max" in result.agent_log.lower() and "turn" in result.agent_log.lower()


async def test_qwen_code_killed_at_its_time_budget_is_a_timeout(
    agentrl_middleware, scripted_engine
):
    """A shell command that outlasts the budget: the CLI is killed, outcome timeout."""
    scripted_engine.queue(tool_call("run_shell_command", command="sleep 600"))
    result, _, seconds = await rollout(agentrl_middleware, agent_time_budget=20)

    assert result.outcome is Outcome.TIMEOUT, (result.error, result.agent_log[-2000:])
    assert result.agent_exit_code == -1 and seconds < 120
