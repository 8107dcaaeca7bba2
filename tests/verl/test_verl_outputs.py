"""``agentrl.verl.outputs`` and ``options``: what does not map one-to-one, through verl's own
post-processing.

Each rollout shape (several chains, a prompt longer than verl's ``prompt_length``, a
response longer than ``response_length``, an infra failure) is turned into
``AgentLoopOutput`` fields and pushed through verl's real ``AgentLoopOutput``,
``AgentLoopWorker._agent_loop_postprocess`` and ``_postprocess`` (padding, masks, position
ids, ``rm_scores``) on a worker holding just what those methods read. No rollout runs
here: the results are built from real ``TrainingSample`` and ``RolloutResult`` values.
"""

from __future__ import annotations

import numpy as np
import pytest
from verl_support import agent_loop_worker, import_verl, verl_config

from agentrl.rollout.run import RolloutResult
from agentrl.trajectory import TrainingSample
from agentrl.types import Outcome
from agentrl.verl import AGENT_LOOP_CONFIG, EXTRA_KEYS, VerlLoopOptions, rollout_output
from agentrl.verl.options import VerlLoopConfigError
from agentrl.verl.outputs import split_for_verl

PAD = 151643


def _sample(prompt: int, mask: list[int], turns: tuple[int, ...], **meta) -> TrainingSample:
    tokens = tuple(range(100, 100 + prompt + len(mask)))
    return TrainingSample(
        tokens=tokens,
        prompt_length=prompt,
        response_length=len(mask),
        loss_mask=tuple(mask),
        rollout_logprobs=tuple(-0.01 * (k + 1) if m else 0.0 for k, m in enumerate(mask)),
        reward=1.0,
        metadata={"turns": turns, **meta},
    )


def _result(samples, outcome=Outcome.SOLVED, reward=1.0) -> RolloutResult:
    return RolloutResult(
        instance_id="t-1",
        session_id="verl-t-1-abc",
        outcome=outcome,
        reward=reward,
        samples=samples,
        turns=3,
        sampled_tokens=sum(sum(s.loss_mask) for s in samples),
        timings={"total": 1.0},
    )


async def _through_verl(fields_list, *, prompt_length, response_length, qwen_tokenizer, tmp_path):
    agent_loop = import_verl()
    path = tmp_path / "loop.yaml"
    path.write_text(AGENT_LOOP_CONFIG.read_text())
    config = verl_config(
        "unused",
        prompt_length=prompt_length,
        response_length=response_length,
        loop_config=str(path),
    )
    worker = agent_loop_worker(agent_loop, config, qwen_tokenizer, server_manager=None)
    internal = []
    for fields in fields_list:
        output = agent_loop.AgentLoopOutput(metrics=agent_loop.AgentLoopMetrics(), **fields)
        internal.append(
            await worker._agent_loop_postprocess(
                output, False, raw_prompt=np.array([], dtype=object)
            )
        )
    return internal, worker._postprocess(internal, input_non_tensor_batch=None)


async def test_every_shape_passes_verls_postprocess(qwen_tokenizer, tmp_path):
    """Fan-out, a long prompt, a long response and an infra failure side by side in one batch.

    The main chain (holding the last turn) trains and the sub-agent's tokens are reported;
    the long prompt's tail moves into the response untrained; the long response is cut and
    flagged; the failure is one untrained pad token. Masks stay 1 exactly on trained tokens.
    """
    P, R = 16, 12
    main = _sample(6, [1, 1, 1, 0, 0, 1], (0, 2))
    sub = _sample(8, [1, 1], (1,))
    long_prompt = _sample(20, [1, 1, 0, 1], (0,))
    long_response = _sample(4, [1] * 10 + [0, 0] + [1] * 5, (0, 1))
    rows = [
        rollout_output(_result([sub, main]), prompt_length=P, response_length=R, pad_token_id=PAD),
        rollout_output(
            _result([long_prompt]), prompt_length=P, response_length=R, pad_token_id=PAD
        ),
        rollout_output(
            _result([long_response]), prompt_length=P, response_length=R, pad_token_id=PAD
        ),
        rollout_output(
            _result([], Outcome.INFRA_ERROR, 0.0),
            prompt_length=P,
            response_length=R,
            pad_token_id=PAD,
        ),
    ]
    internal, batch = await _through_verl(
        rows, prompt_length=P, response_length=R, qwen_tokenizer=qwen_tokenizer, tmp_path=tmp_path
    )
    fan, moved, cut, failed = (r["extra_fields"] for r in rows)
    assert (fan["agentrl_chains"], fan["agentrl_untrained_tokens"]) == (2, 2)
    assert rows[0]["response_ids"] == list(main.tokens[6:])
    assert rows[1]["prompt_ids"] == list(long_prompt.tokens[:P])
    assert rows[1]["response_mask"] == [0, 0, 0, 0, 1, 1, 0, 1]
    assert rows[1]["prompt_ids"] + rows[1]["response_ids"] == list(long_prompt.tokens)
    assert cut["agentrl_truncated"] is True and len(rows[2]["response_ids"]) == R
    assert not moved["agentrl_truncated"]
    assert (failed["agentrl_trainable"], failed["agentrl_abort_reason"]) == (False, "infra_error")
    for row, out in zip(rows, internal, strict=True):
        assert set(row["extra_fields"]) == set(EXTRA_KEYS)
        n = len(row["response_ids"])
        assert out.response_mask[0, :n].tolist() == row["response_mask"]
        assert out.response_mask[0, n:].sum() == 0
        lps = out.response_logprobs[0].tolist()
        assert all(lp != 0.0 for lp, m in zip(lps, out.response_mask[0].tolist(), strict=True) if m)
    assert batch.batch["input_ids"].shape == (4, P + R)
    assert batch.batch["rm_scores"].sum(dim=1).tolist() == [1.0, 1.0, 1.0, 0.0]
    assert batch.batch["response_mask"][3].sum() == 0
    assert list(batch.non_tensor_batch["agentrl_trainable"]) == [True, True, True, False]


def test_a_cut_that_leaves_nothing_trained_excludes_the_row():
    """A response whose trained tokens all lie past ``response_length`` is no broken sample."""
    sample = _sample(4, [0, 0, 0, 1], (0,))
    assert split_for_verl(sample, 16, 3) is None
    row = rollout_output(_result([sample]), prompt_length=16, response_length=3, pad_token_id=PAD)
    assert row["extra_fields"]["agentrl_abort_reason"] == "truncated_to_nothing"
    assert row["response_mask"] == [0] and row["reward_score"] == 0.0


def test_shipped_agent_loop_config_names_the_loop_and_valid_options():
    """The packaged agent_loop.yaml is one ``agentrl`` entry whose options all parse."""
    import yaml

    (entry,) = yaml.safe_load(AGENT_LOOP_CONFIG.read_text())
    assert (entry.pop("name"), entry.pop("_target_")) == (
        "agentrl",
        "agentrl.verl.loop.AgentrlAgentLoop",
    )
    options = VerlLoopOptions.from_mapping(entry)
    assert (options.harness, options.prompt_mode) == ("claude_code", "splice")


def test_options_errors_name_the_valid_keys_and_the_task_column():
    """An unknown option and a row without a task each raise an error saying what to set."""
    with pytest.raises(VerlLoopConfigError, match=r"unknown option.*harnes.*valid: .*harness"):
        VerlLoopOptions.from_mapping({"harnes": "codex"})
    options = VerlLoopOptions()
    row = {"prompt": "p", "metadata": {"instance_id": "x"}}
    assert options.task_row({"agentrl_task": row}) == row
    assert options.task_row({"extra_info": {"agentrl_task": '{"prompt": "p"}'}}) == {"prompt": "p"}
    with pytest.raises(VerlLoopConfigError, match="extra_info\\['agentrl_task'\\]"):
        options.task_row({"extra_info": {"index": 0}})


def test_public_host_auto_is_this_ray_nodes_address():
    """``public_host: auto`` resolves to the Ray node's address; anything else stays as set."""
    import_verl()
    import ray

    from agentrl.verl.loop import _public_host

    assert _public_host("auto") == ray.util.get_node_ip_address()
    assert _public_host("10.1.2.3") == "10.1.2.3" and _public_host(None) is None


def test_options_from_hydras_dictconfig_are_plain_python():
    """hydra hands the YAML entry's values over as OmegaConf nodes; the options hold dicts and
    lists (a harness gets a list of tarballs, not a ListConfig)."""
    import_verl()
    from omegaconf import OmegaConf

    entry = OmegaConf.create(
        {"harness_options": {"tarballs": ["/a.tgz"]}, "sandbox_options": {"binds": {"/x": "/y"}}}
    )
    options = VerlLoopOptions.from_mapping(entry)
    assert type(options.harness_options["tarballs"]) is list
    assert options.sandbox_options == {"binds": {"/x": "/y"}}
    assert type(options.sandbox_options["binds"]) is dict
