"""``agentrl.verl``: the ``agentrl`` agent loop run the way verl runs it, against real verl.

What runs for real: verl 0.9.1 (its registry, ``hydra.utils.instantiate`` of the loop,
``AgentLoopWorker._run_agent_loop``, ``_agent_loop_postprocess`` and ``_postprocess``: the
padding, masks, position ids and reward placement of every row), the Claude Code CLI,
the bubblewrap sandbox, the middleware, the Qwen3 tokenizer and the scaleswe grader. The
boundary: verl's ``AgentLoopWorker`` is a Ray actor that starts vLLM/SGLang servers on
GPUs; here its methods run in-process on a worker built with just the attributes they
read (``verl_support.agent_loop_worker``), and its ``server_manager`` is a stand-in that
speaks verl's ``generate`` contract (verl's own ``TokenOutput``) and forwards to the
scripted SGLang engine of ``agentrl.testing``.
"""

from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest
import yaml
from verl_support import (
    FIX,
    PROMPT,
    ForwardingServerManager,
    agent_loop_worker,
    import_verl,
    script_solution,
    serve,
    task_row,
    verl_config,
    verl_row,
)

from agentrl.engines.sglang import SGLangEngine
from agentrl.testing.scripted_engine import ScriptedEngine, ScriptedReply

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
]


async def test_a_verl_abort_is_continued_and_the_rollout_trains(
    loop_config, qwen_tokenizer, qwen_tokenizer_dir
):
    """verl aborts the first turn halfway (``stop_reason="aborted"``, a weight update): the
    middleware continues it as it does for SGLang and vLLM, and every sampled token trains."""
    path, _ = loop_config
    script = script_solution(qwen_tokenizer)
    call = json.dumps({"name": "Bash", "arguments": {"command": FIX}})
    ids = list(qwen_tokenizer(f"Fixing it.\n<tool_call>\n{call}\n</tool_call>")["input_ids"])
    partial, rest = ids[: len(ids) // 2], ids[len(ids) // 2 :]
    served: list[int] = []

    def aborting(body, headers) -> ScriptedReply:
        served.append(1)
        if len(served) == 1:
            return ScriptedReply(ids=partial, finish_reason="abort")
        if body["input_ids"][-len(partial) :] == partial:
            return ScriptedReply(ids=rest)
        return script(body, headers)

    (out,), _, engine, manager = await serve(
        qwen_tokenizer,
        qwen_tokenizer_dir,
        path,
        aborting,
        [verl_row(task_row())],
        prompt_length=PROMPT,
        response_length=4096,
    )
    assert [g.finish_reason for g in engine.served][:2] == ["abort", "stop"]
    assert manager.calls[1]["prompt_ids"] == manager.calls[0]["prompt_ids"] + partial
    assert out.extra_fields["agentrl_outcome"] == "solved" and out.reward_score == 1.0
    assert int(out.response_mask.sum()) == sum(len(g.output_ids) for g in engine.served)


async def test_claude_code_rollout_through_verls_agent_loop(
    loop_config, qwen_tokenizer, qwen_tokenizer_dir
):
    """Claude Code solves the task through verl's loop: one token-exact, trainable row.

    The mask is 1 exactly on the tokens the engine sampled, each with its log-prob; the
    reward is the grader's; verl's padding, attention mask and position ids hold.
    """
    path, _ = loop_config
    (out,), batch, engine, manager = await serve(
        qwen_tokenizer,
        qwen_tokenizer_dir,
        path,
        script_solution(qwen_tokenizer),
        [verl_row(task_row())],
        prompt_length=PROMPT,
        response_length=4096,
    )
    extra = out.extra_fields
    assert extra["agentrl_trainable"] is True, extra
    assert extra["agentrl_outcome"] == "solved" and out.reward_score == 1.0
    assert extra["agentrl_instance_id"] == "textstats-1" and extra["agentrl_chains"] == 1
    assert (extra["min_global_steps"], extra["max_global_steps"]) == (7, 7)
    # One sticky request id per session, log-probs always asked for.
    assert {c["request_id"] for c in manager.calls} == {extra["agentrl_session_id"]}
    # Token-exact: the unpadded response's masked positions are exactly the sampled tokens.
    prompt_len = int(out.attention_mask[0, :PROMPT].sum())
    resp_len = int(out.attention_mask[0, PROMPT:].sum())
    response = out.response_ids[0, :resp_len].tolist()
    mask = out.response_mask[0, :resp_len].tolist()
    logprobs = out.response_logprobs[0, :resp_len].tolist()
    sampled = [
        (t, lp) for g in engine.served for t, lp in zip(g.output_ids, g.logprobs, strict=True)
    ]
    trained = [(t, lp) for t, m, lp in zip(response, mask, logprobs, strict=True) if m]
    assert [t for t, _ in trained] == [t for t, _ in sampled]
    # float32 in verl's tensor: equal to the sampled float64 up to its rounding
    assert [lp for _, lp in trained] == pytest.approx([lp for _, lp in sampled], abs=1e-6)
    assert all(lp == 0.0 for m, lp in zip(mask, logprobs, strict=True) if not m)
    assert int(out.response_mask.sum()) == sum(len(g.output_ids) for g in engine.served)
    # The first prompt is the first engine call's input, left-padded by verl.
    assert out.prompt_ids[0, -prompt_len:].tolist() == manager.calls[0]["prompt_ids"]
    # verl's batch: rm_scores carries the reward on the last response token; positions run on.
    assert batch.batch["rm_scores"][0, resp_len - 1].item() == 1.0
    assert batch.batch["rm_scores"].sum().item() == 1.0
    positions = batch.batch["position_ids"][0]
    attention = batch.batch["attention_mask"][0].bool()
    assert positions[attention].tolist() == list(range(prompt_len + resp_len))
    assert list(batch.non_tensor_batch["agentrl_trainable"]) == [True]
    logging.getLogger(__name__).info(
        f"AgentLoopOutput: prompt={prompt_len} response={resp_len} mask_sum={sum(mask)} "
        f"reward={out.reward_score} turns={out.num_turns} sampled={len(sampled)}"
    )


async def test_failed_rows_are_excluded_as_verl_expects(
    loop_config, qwen_tokenizer, qwen_tokenizer_dir
):
    """A row without a task and a sandbox that cannot boot: each one kept, never trained.

    Both pass verl's post-processing beside each other; their response masks are all 0
    (no policy-gradient term), reward 0.0, ``agentrl_trainable`` False with the reason.
    """
    path, entry = loop_config
    broken = {**entry["sandbox_options"], "bwrap": "/nonexistent/bwrap"}
    path.write_text(yaml.safe_dump([{**entry, "sandbox_options": broken}]))
    outputs, batch, engine, _ = await serve(
        qwen_tokenizer,
        qwen_tokenizer_dir,
        path,
        script_solution(qwen_tokenizer),
        [verl_row(None), verl_row(task_row())],
        prompt_length=4096,
        response_length=1024,
    )
    reasons = [o.extra_fields["agentrl_abort_reason"] for o in outputs]
    assert reasons == ["invalid_task", "infra_error"], [o.extra_fields for o in outputs]
    assert batch.batch["response_mask"].sum().item() == 0
    assert [o.reward_score for o in outputs] == [0.0, 0.0]
    assert list(batch.non_tensor_batch["agentrl_trainable"]) == [False, False]
    assert not engine.served


async def test_a_sub_agent_rollout_trains_the_main_chain_and_reports_the_rest(
    loop_config, qwen_tokenizer, qwen_tokenizer_dir
):
    """Claude Code dispatches a sub-agent: two chains, verl gets the main agent's one.

    The trained row is the chain that finished the task (it holds the fix and the last
    turn, never the sub-agent's prompt); the sub-agent's sampled tokens are counted in
    ``agentrl_untrained_tokens``, and the two together are every token the engine sampled.
    """
    path, _ = loop_config
    solve = script_solution(qwen_tokenizer)
    agent_call = json.dumps(
        {
            "name": "Agent",
            "arguments": {
                "description": "Find the word code",
                "prompt": "Which file defines words()?",
                "subagent_type": "general-purpose",
            },
        }
    )

    def with_subagent(body, headers) -> ScriptedReply:
        prompt = qwen_tokenizer.decode(body["input_ids"], skip_special_tokens=False)
        if "cc_is_subagent=true" in prompt:
            return ScriptedReply(text="The package lives in textstats/core.py.")
        if "Async agent launched" not in prompt and "AGENTRL-FIX-APPLIED" not in prompt:
            return ScriptedReply(
                text=f"Let me look around first.\n<tool_call>\n{agent_call}\n</tool_call>"
            )
        return solve(body, headers)

    (out,), batch, engine, _ = await serve(
        qwen_tokenizer,
        qwen_tokenizer_dir,
        path,
        with_subagent,
        [verl_row(task_row())],
        prompt_length=PROMPT,
        response_length=8192,
    )
    extra = out.extra_fields
    assert extra["agentrl_chains"] >= 2, extra
    assert extra["agentrl_outcome"] == "solved" and out.reward_score == 1.0
    trained = int(out.response_mask.sum())
    assert extra["agentrl_untrained_tokens"] > 0
    assert trained + extra["agentrl_untrained_tokens"] == sum(
        len(g.output_ids) for g in engine.served
    )
    n_prompt = int(out.attention_mask[0, :PROMPT].sum())
    text = qwen_tokenizer.decode(out.prompt_ids[0, PROMPT - n_prompt :].tolist())
    assert "cc_is_subagent=true" not in text
    assert "Fixing it." in qwen_tokenizer.decode(out.response_ids[0].tolist())
    assert batch.batch["rm_scores"].sum().item() == 1.0
    logging.getLogger(__name__).info(
        "fan-out: chains=%d trained=%d untrained=%d reward=%s",
        extra["agentrl_chains"],
        trained,
        extra["agentrl_untrained_tokens"],
        out.reward_score,
    )


async def test_a_batch_through_verls_generate_sequences(
    loop_config, qwen_tokenizer, qwen_tokenizer_dir
):
    """verl's ``AgentLoopWorker.generate_sequences`` on a DataProto: its sampling params,
    rows run concurrently (both start the worker's one stack at once), one DataProto out."""
    agent_loop = import_verl()
    from verl.protocol import DataProto

    from agentrl.verl.loop import close_stacks

    path, _ = loop_config
    config = verl_config(
        qwen_tokenizer_dir, prompt_length=PROMPT, response_length=4096, loop_config=str(path)
    )
    rows = [verl_row(task_row()), verl_row(None)]
    columns = {key: np.empty(len(rows), dtype=object) for key in rows[0]}
    for key, column in columns.items():
        column[:] = [row[key] for row in rows]
    batch = DataProto(non_tensor_batch=columns, meta_info={"global_steps": 3, "validate": False})
    async with ScriptedEngine(qwen_tokenizer, responder=script_solution(qwen_tokenizer)) as engine:
        client = SGLangEngine(engine.url)
        manager = ForwardingServerManager(client)
        worker = agent_loop_worker(agent_loop, config, qwen_tokenizer, manager)
        try:
            out = await worker.generate_sequences(batch)
        finally:
            await close_stacks()
            await client.aclose()
    assert list(out.non_tensor_batch["agentrl_trainable"]) == [True, False]
    assert list(out.non_tensor_batch["agentrl_outcome"]) == ["solved", None]
    assert out.batch["rm_scores"].sum(dim=1).tolist() == [1.0, 0.0]
    assert out.batch["response_mask"][0].sum().item() == sum(
        len(g.output_ids) for g in engine.served
    )
    assert out.batch["response_mask"][1].sum().item() == 0
    # verl's sampling params from its rollout config reached the engine, log-probs on.
    assert {(c["temperature"], c["top_p"], c["logprobs"]) for c in manager.calls} == {
        (1.0, 1.0, True)
    }
