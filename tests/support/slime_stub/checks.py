"""The checks slime applies to a custom generate function's output, as plain functions.

Each mirrors one step of slime's pipeline (SLIME_CONTRACT §1.5–1.9): the reward step of
``generate_and_rm`` for list returns, the group sort of ``generate_rollout_async``,
``validate_rollout_id_annotated``, the ``data[0]``-driven flattening, and
``_convert_samples_to_train_data`` (loss-mask asserts, first-sample-driven optional keys,
per-rollout mask sums), plus the field requirements of §1.7 and the eval collection of
§1.9. A violation raises ``AssertionError`` (or the error slime would hit).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

from slime_stub.sample import Sample


def check_return_shape(out: Any) -> list[Sample]:
    """§1.5/§8: a coroutine's result must be a non-empty list of samples."""
    assert isinstance(out, list), f"generate must return a list, got {type(out).__name__}"
    assert out, "generate returned an empty list (slime's group sort hits IndexError)"
    for item in out:
        assert isinstance(item, Sample), f"list element is {type(item).__name__}, not Sample"
    return out


def check_sample_fields(sample: Sample) -> None:
    """§1.7: the field shapes slime's trainer relies on."""
    assert isinstance(sample.tokens, list) and all(isinstance(t, int) for t in sample.tokens)
    assert len(sample.tokens) > sample.response_length >= 1, (
        f"need len(tokens) > response_length >= 1, got {len(sample.tokens)} tokens, "
        f"response_length {sample.response_length}"
    )
    assert sample.loss_mask is not None and len(sample.loss_mask) == sample.response_length
    assert set(sample.loss_mask) <= {0, 1}
    assert sample.rollout_log_probs is not None
    assert len(sample.rollout_log_probs) == sample.response_length
    assert all(isinstance(lp, float) for lp in sample.rollout_log_probs)
    assert isinstance(sample.reward, float), f"reward must be a float, got {sample.reward!r}"
    assert isinstance(sample.status, Sample.Status)
    assert sample.status is not Sample.Status.PENDING
    assert isinstance(sample.response, str)
    assert isinstance(sample.metadata, dict)
    import pickle

    pickle.dumps(sample.to_dict())  # --save-debug-rollout-data pickles to_dict()


def reward_step(samples: list[Sample]) -> list[Sample]:
    """§1.6 for a list return: an ABORTED sibling skips RM; otherwise RM runs for reward=None.

    There is no reward model here, so any sample still needing one is a failure.
    """
    if any(s.status is Sample.Status.ABORTED for s in samples):
        return samples
    missing = [i for i, s in enumerate(samples) if s.reward is None]
    assert not missing, f"samples {missing} have reward=None and would go to the reward model"
    return samples


def sort_group(group: list[list[Sample]]) -> list[list[Sample]]:
    """generate_rollout_async sorts a fan-out group by ``group[0][0].index``."""
    return sorted(group, key=lambda g: g[0].index)


def validate_rollout_id_annotated(node: Any, depth: int = 0) -> None:
    """§1.5: at depth >= 2, siblings of a multi-sample list share a non-None rollout_id."""
    if isinstance(node, Sample):
        return
    assert isinstance(node, list), f"unexpected node type {type(node).__name__}"
    if node and isinstance(node[0], Sample):
        if depth >= 2 and len(node) > 1:
            ids = [s.rollout_id for s in node]
            assert None not in ids, f"rollout_id unset on some siblings: {ids}"
            assert len(set(ids)) == 1, f"siblings must share rollout_id, got {ids}"
        return
    for item in node:
        validate_rollout_id_annotated(item, depth + 1)


def flatten(data: list[Any]) -> list[Sample]:
    """slime flattens while ``data[0]`` is a list (only the first element is looked at)."""
    while isinstance(data[0], list):
        data = list(itertools.chain.from_iterable(data))
    for item in data:
        assert isinstance(item, Sample), "mixed Sample / list returns broke flattening"
    return data


def default_post_process(args: Any, samples: Sequence[Sample]) -> tuple[list, list]:
    raw = [s.get_reward_value(args) for s in samples]
    return raw, list(raw)


def convert_to_train_data(
    args: Any,
    samples: list[Sample],
    post_process: Callable[[Any, Sequence[Sample]], tuple[list, list]] = default_post_process,
) -> dict[str, list]:
    """§1.5 ``_convert_samples_to_train_data``: its asserts and its first-sample rules."""
    raw_rewards, rewards = post_process(args, samples)
    assert len(raw_rewards) == len(samples)
    assert len(rewards) == len(samples)
    rollout_ids = [s.rollout_id for s in samples]
    taken = {r for r in rollout_ids if r is not None}
    tmp = 0
    for i, rid in enumerate(rollout_ids):
        if rid is None:
            while tmp in taken:
                tmp += 1
            rollout_ids[i] = tmp
            taken.add(tmp)
    loss_masks = []
    for s in samples:
        if s.loss_mask is None:
            s.loss_mask = [1] * s.response_length
        assert len(s.loss_mask) == s.response_length, (
            f"loss mask length {len(s.loss_mask)} != response length {s.response_length}"
        )
        if s.remove_sample:
            s.loss_mask = [0] * s.response_length
        loss_masks.append(s.loss_mask)
    totals: dict[Any, int] = {}
    for rid, mask in zip(rollout_ids, loss_masks, strict=True):
        totals[rid] = totals.get(rid, 0) + sum(mask)
    data: dict[str, list] = {
        "tokens": [s.tokens for s in samples],
        "response_lengths": [s.response_length for s in samples],
        "rewards": list(rewards),
        "raw_reward": list(raw_rewards),
        "truncated": [int(s.status is Sample.Status.TRUNCATED) for s in samples],
        "sample_indices": [s.index for s in samples],
        "rollout_ids": rollout_ids,
        "loss_masks": loss_masks,
        "rollout_mask_sums": [totals[rid] for rid in rollout_ids],
    }
    if samples[0].rollout_log_probs is not None:
        logprobs = [s.rollout_log_probs for s in samples]
        assert all(lp is not None for lp in logprobs), "rollout_log_probs set on some samples only"
        for s, lp in zip(samples, logprobs, strict=True):
            assert len(lp) == s.response_length
        data["rollout_log_probs"] = logprobs
    else:
        assert all(s.rollout_log_probs is None for s in samples), (
            "rollout_log_probs set on some samples only (the first has none)"
        )
    if getattr(args, "rollout_top_p", 1.0) != 1.0:
        for s in samples:
            assert s.rollout_top_p_token_offsets is not None
            assert len(s.rollout_top_p_token_offsets) == s.response_length + 1
    for s, r in zip(samples, data["rewards"], strict=True):
        assert isinstance(r, float), f"normalised reward {r!r} for index {s.index} is not a float"
    return data


def train_pipeline(
    args: Any,
    groups: list[list[list[Sample]]],
    post_process: Callable[[Any, Sequence[Sample]], tuple[list, list]] = default_post_process,
) -> tuple[list[Sample], dict[str, list]]:
    """Everything slime does from gathered group results to train data."""
    for group in groups:
        assert len(group) == getattr(args, "n_samples_per_prompt", len(group))
        for out in group:
            check_return_shape(out)
            reward_step(out)
            for sample in out:
                check_sample_fields(sample)
    data = [sort_group(group) for group in groups]
    validate_rollout_id_annotated(data)
    flat = flatten(data)
    return flat, convert_to_train_data(args, flat, post_process)


def eval_collect(outputs: list[list[Sample]], reward_key: str | None = None) -> dict[str, list]:
    """§1.9: list results are flattened into separate eval entries, sorted by index."""
    data: list[Sample] = []
    for out in outputs:
        check_return_shape(out)
        data.extend(out)
    data.sort(key=lambda s: s.index)
    return {
        "rewards": [s.reward if not reward_key else s.reward[reward_key] for s in data],
        "truncated": [s.status is Sample.Status.TRUNCATED for s in data],
        "samples": data,
    }
