"""The same rollout through both trainer integrations: verl's row equals slime's sample.

One scripted Claude Code rollout (the same engine replies, so the same sampled tokens and
log-probs) runs once through ``agentrl.slime.generate`` (slime's contract, with the
stand-in ``Sample`` of tests/support/slime_stub) and once through verl's agent loop (real
verl, as in test_verl_agent_loop). The session has one chain, so verl loses nothing: the
full token sequence, the trained positions, their log-probs and the reward agree.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import types

import pytest
from slime_stub.sample import Sample
from verl_support import PROMPT, script_solution, serve, task_row, verl_row

import agentrl.slime as slime_mod
from agentrl.testing.scripted_engine import ScriptedEngine

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
]


async def _slime_samples(monkeypatch, entry, tokenizer, tokenizer_dir) -> list:
    """The rollout through agentrl.slime, configured as slime's launcher would for `entry`."""
    env = {
        "AGENTRL_HARNESS": "claude_code",
        "AGENTRL_SANDBOX": "local",
        "AGENTRL_TRAIN_PROTOCOL": "scaleswe",
        "AGENTRL_UNIX_SOCKET": entry["unix_socket"] + ".slime",
        "AGENTRL_PORT": "18001",
        "AGENTRL_CLI_PATH": entry["harness_options"]["cli_path"],
        "AGENTRL_SANDBOX_OPTIONS": json.dumps(entry["sandbox_options"]),
        "AGENTRL_AGENT_TIME_BUDGET": "120",
        "AGENTRL_EVAL_TIMEOUT": "120",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    row = task_row()
    async with ScriptedEngine(tokenizer, responder=script_solution(tokenizer)) as engine:
        host, port = engine.url.removeprefix("http://").split(":")
        args = types.SimpleNamespace(
            hf_checkpoint=str(tokenizer_dir),
            sglang_router_ip=host,
            sglang_router_port=int(port),
            rollout_max_context_len=PROMPT + 4096,
            sglang_tool_call_parser="hermes",
            sglang_reasoning_parser="qwen3",
        )
        sample = Sample(index=0, group_index=0, prompt=row["prompt"], label=row["label"])
        sample.metadata = row["metadata"]
        try:
            return await slime_mod.generate(args, sample, {"temperature": 1.0, "top_p": 1.0})
        finally:
            slime_mod.shutdown_service()


async def test_verl_row_equals_slime_sample_for_the_same_rollout(
    loop_config, monkeypatch, qwen_tokenizer, qwen_tokenizer_dir
):
    """Tokens, mask, log-probs and reward of verl's output match slime's one sample."""
    path, entry = loop_config
    for name in [n for n in os.environ if n.startswith(("AGENTRL_", "SWE_", "ADAPTER_", "SLIME_"))]:
        monkeypatch.delenv(name)
    (slime,) = await _slime_samples(monkeypatch, entry, qwen_tokenizer, qwen_tokenizer_dir)
    (out,), _, _, _ = await serve(
        qwen_tokenizer,
        qwen_tokenizer_dir,
        path,
        script_solution(qwen_tokenizer),
        [verl_row(task_row())],
        prompt_length=PROMPT,
        response_length=4096,
    )
    n_prompt = int(out.attention_mask[0, :PROMPT].sum())
    n_resp = int(out.attention_mask[0, PROMPT:].sum())
    prompt = out.prompt_ids[0, PROMPT - n_prompt :].tolist()
    response = out.response_ids[0, :n_resp].tolist()
    mask = out.response_mask[0, :n_resp].tolist()
    logprobs = out.response_logprobs[0, :n_resp].tolist()
    assert prompt + response == slime.tokens
    assert (n_resp, mask) == (slime.response_length, slime.loss_mask)
    assert logprobs == pytest.approx(slime.rollout_log_probs, abs=1e-6)
    assert out.reward_score == slime.reward == 1.0
    logging.getLogger(__name__).info(
        "verl: prompt=%d response=%d mask_sum=%d reward=%s | slime: tokens=%d "
        "response_length=%d mask_sum=%d reward=%s",
        n_prompt,
        n_resp,
        sum(mask),
        out.reward_score,
        len(slime.tokens),
        slime.response_length,
        sum(slime.loss_mask),
        slime.reward,
    )
