"""GRPO-style reward normalisation that groups by ``group_index``, for fan-out batches.

slime's default ``_post_process_rewards`` reshapes rewards by ``n_samples_per_prompt``
only when the batch holds exactly ``n × rollout_batch_size`` samples; with fan-out it
falls back to one batch-wide group. This replacement groups by ``group_index`` (one group
per prompt) and computes the group's statistics over *rollouts*, not samples, so a
rollout that fanned out into K chains counts once, like in the loss. Aborted
placeholders (infra failures, slime aborts) are left out of the statistics, so a broken
sandbox never shifts its siblings' advantages; their own normalised reward is 0.0.

``check_reward_nonzero_std`` (and ``..._with_fallback``) is slime's dynamic sampling filter
of the same name for fan-out groups: slime's reads ``sample.reward`` on each group entry,
which is a list of samples once ``generate`` fans out.

Pure Python on purpose: importing it pulls in neither torch nor slime.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

__all__ = [
    "GRPO_FAMILY",
    "FilterOutput",
    "check_reward_nonzero_std",
    "check_reward_nonzero_std_with_fallback",
    "normalize_rewards",
    "rollout_rewards",
]

#: Estimators slime centres per group (and, for the first three, divides by the std).
GRPO_FAMILY = ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")
_STD_ESTIMATORS = ("grpo", "gspo", "cispo")
_EPS = 1e-6


def _raw_reward(args: Any, sample: Any) -> float:
    if hasattr(sample, "get_reward_value"):
        value = sample.get_reward_value(args)
    else:
        value = sample.reward
        key = getattr(args, "reward_key", None)
        if key:
            value = value[key]
    if value is None:
        raise ValueError(
            f"sample index={getattr(sample, 'index', None)} reaches reward post-processing "
            "with reward=None; every sample needs a reward (agentrl.slime.generate sets one "
            "on every sample it returns; check --custom-rm-path and sample hooks)"
        )
    return float(value)


def _is_placeholder(sample: Any) -> bool:
    status = getattr(sample, "status", None)
    return bool(getattr(sample, "remove_sample", False)) and (
        getattr(status, "value", status) == "aborted"
    )


def _rollout_key(position: int, sample: Any) -> tuple[str, Any]:
    rollout_id = getattr(sample, "rollout_id", None)
    if rollout_id is not None:
        return ("rollout", rollout_id)
    index = getattr(sample, "index", None)
    return ("index", index) if index is not None else ("position", position)


def _sample_std(values: Sequence[float]) -> float:
    # Bessel-corrected, like torch.std (slime's default normaliser).
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def normalize_rewards(args: Any, samples: Sequence[Any]) -> tuple[list[float], list[float]]:
    """``(raw_rewards, rewards)`` in ``samples`` order, normalised within each group_index.

    Follows slime's switches: nothing changes unless ``args.advantage_estimator`` is in
    the GRPO family and ``args.rewards_normalization`` is on; the std division applies to
    grpo/gspo/cispo when ``args.grpo_std_normalization`` is on.
    """
    if samples and isinstance(samples[0], list):
        raise TypeError(
            "reward post-processing expects the flattened list of samples slime passes "
            "(list[Sample]); got a nested list"
        )
    raw = [_raw_reward(args, sample) for sample in samples]
    estimator = getattr(args, "advantage_estimator", "grpo")
    if estimator not in GRPO_FAMILY or not getattr(args, "rewards_normalization", True):
        return raw, list(raw)
    use_std = estimator in _STD_ESTIMATORS and getattr(args, "grpo_std_normalization", True)

    # group_index -> rollout key -> positions of that rollout's samples
    groups: dict[Any, dict[tuple[str, Any], list[int]]] = {}
    for position, sample in enumerate(samples):
        if _is_placeholder(sample):
            continue
        group = groups.setdefault(getattr(sample, "group_index", None), {})
        group.setdefault(_rollout_key(position, sample), []).append(position)

    out = [0.0] * len(samples)
    for rollouts in groups.values():
        per_rollout = [sum(raw[p] for p in ps) / len(ps) for ps in rollouts.values()]
        mean = sum(per_rollout) / len(per_rollout)
        std = _sample_std(per_rollout) if use_std else 0.0
        for positions in rollouts.values():
            for p in positions:
                centred = raw[p] - mean
                out[p] = centred / (std + _EPS) if use_std else centred
    return raw, out


@dataclasses.dataclass
class FilterOutput:
    """slime's ``DynamicFilterOutput`` fields, for when slime is not importable (tests)."""

    keep: bool
    reason: str | None = None
    keep_when_insufficient: bool = False


def _filter_output(keep: bool, reason: str | None) -> Any:
    try:
        from slime.rollout.filter_hub.base_types import DynamicFilterOutput
    except ImportError:
        return FilterOutput(keep=keep, reason=reason)
    return DynamicFilterOutput(keep=keep, reason=reason)


def rollout_rewards(args: Any, group: Sequence[Any]) -> list[float]:
    """One reward per rollout of a slime group (its ``n_samples_per_prompt`` entries).

    An entry is a ``Sample`` or the list of samples one ``generate`` call returned (fan-out);
    a rollout's reward is the mean over its samples (agentrl gives them all the same one).
    Aborted placeholders are left out, as ``normalize_rewards`` leaves them out of the
    group statistics.
    """
    rewards = []
    for entry in group:
        samples = entry if isinstance(entry, list) else [entry]
        kept = [s for s in samples if not _is_placeholder(s)]
        if kept:
            rewards.append(sum(_raw_reward(args, s) for s in kept) / len(kept))
    return rewards


def check_reward_nonzero_std(args: Any, samples: Sequence[Any], **kwargs: Any) -> Any:
    """slime's ``check_reward_nonzero_std`` for fan-out groups: keep a group whose rollouts'
    rewards (``rollout_rewards``) differ, so its GRPO advantages are not all zero.

    A group with fewer than two graded rollouts is dropped (its advantages are zero, as in
    slime, where the std of one value is NaN). Returns slime's ``DynamicFilterOutput``
    (reason ``zero_std_<reward>``, as slime's), or ``FilterOutput`` without slime. Use with
    ``--dynamic-sampling-filter-path agentrl.slime.check_reward_nonzero_std``.
    """
    rewards = rollout_rewards(args, samples)
    keep = len(rewards) >= 2 and _sample_std(rewards) > _EPS
    reason = None
    if not keep:
        reason = f"zero_std_{round(rewards[0], 1)}" if rewards else "zero_std_no_graded_rollout"
    return _filter_output(keep, reason)


def check_reward_nonzero_std_with_fallback(args: Any, samples: Sequence[Any], **kwargs: Any) -> Any:
    """``check_reward_nonzero_std`` that keeps a rejected group when dropping it would leave
    too few groups to fill the batch (slime's ``..._with_fallback``)."""
    output = check_reward_nonzero_std(args, samples, **kwargs)
    output.keep_when_insufficient = True
    return output
