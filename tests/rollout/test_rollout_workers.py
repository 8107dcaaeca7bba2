"""Rollouts through a sharded middleware: the real Claude Code CLI, two worker processes.

Everything but the model is real (the local sandbox, the CLI, the scaleswe grader); the
model is the scripted SGLang server, which the workers reach over HTTP.
"""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile

import pytest
from rollout_support import CLI_DIR, SANDBOX_PORT, claude_solution, textstats_task
from shard_support import alive, recipe

from agentrl.graders.scaleswe import ScaleSWEGrader
from agentrl.harnesses.claude_code import ClaudeCodeHarness
from agentrl.rollout import RolloutConfig, run_rollout
from agentrl.sandboxes.local import LocalSandbox
from agentrl.serve.shards import ShardedMiddleware
from agentrl.testing.scripted_engine import ScriptedReply
from agentrl.types import Outcome

pytestmark = pytest.mark.slow


@pytest.fixture
async def sharded(agentrl_scripted_engine, agentrl_qwen_tokenizer_dir):
    """Two workers behind a front on a unix socket (bound into each sandbox)."""
    with tempfile.TemporaryDirectory(prefix="agentrl-sm-") as scratch:
        sm = ShardedMiddleware(
            workers=2, build=recipe(agentrl_scripted_engine.url, agentrl_qwen_tokenizer_dir)
        )
        await sm.start(host=None, unix_path=f"{scratch}/front.sock")
        try:
            yield sm
        finally:
            await sm.close()


async def rollout(sm, **config):
    if not (CLI_DIR / "bin" / "claude").exists():
        pytest.fail(f"the agent CLIs are not installed in {CLI_DIR}; run `agentrl install-clis`")
    binds, cli_path = ClaudeCodeHarness.host_install(CLI_DIR)
    options = {"services": {SANDBOX_PORT: sm.unix_path}, "ro_binds": binds, "host_python": True}
    values = {"agent_time_budget": 180, "eval_timeout": 120, "middleware_port": SANDBOX_PORT}
    return await run_rollout(
        textstats_task(),
        harness=ClaudeCodeHarness(cli_path=cli_path, extra_args=(), extra_env={}),
        grader=ScaleSWEGrader(),
        sandbox_factory=lambda task: LocalSandbox.from_task(task, **options),
        middleware=sm,
        config=RolloutConfig(**{**values, **config}),
        session_id="sharded-0",
    )


async def test_claude_code_solves_the_task_through_two_workers(sharded, agentrl_scripted_engine):
    """The rollout's turns reach a worker through the front; the outcome, turn facts and
    samples are what the in-process middleware gives (every sampled token trained)."""
    for reply in claude_solution():
        agentrl_scripted_engine.queue(reply)
    result = await rollout(sharded)
    assert result.outcome is Outcome.SOLVED, result.error
    assert result.turns == 4 and len(result.turn_facts) == 4
    sampled = sum(len(s.output_ids) for s in agentrl_scripted_engine.served)
    assert result.sampled_tokens == sampled
    assert sum(sum(s.loss_mask) for s in result.samples) == sampled
    assert all(s.reward == 1.0 for s in result.samples)


async def test_a_worker_killed_mid_rollout_is_an_infra_error(sharded, agentrl_scripted_engine):
    """SIGKILL the session's worker while a turn waits on the engine: the rollout ends as
    an infra_error (never a reward-0 sample that trains), well within its time budget."""
    first, *_ = claude_solution()
    agentrl_scripted_engine.queue(first)
    agentrl_scripted_engine.queue_reply(ScriptedReply(text="never sent", delay=120))
    task = asyncio.create_task(rollout(sharded, agent_time_budget=90))
    await agentrl_scripted_engine.wait_for(
        lambda: len(agentrl_scripted_engine.generate_requests) >= 2, timeout=120
    )
    victim = sharded.pids[sharded.session("sharded-0").worker]
    os.kill(victim, signal.SIGKILL)
    result = await asyncio.wait_for(task, 150)
    assert result.outcome is Outcome.INFRA_ERROR, (result.outcome, result.error)
    assert result.remove_sample and not result.samples
    assert not alive(victim)
