"""One rollout's result as one row of TRL's ``rollout_func`` output (no TRL import here).

What maps how (docs/trainers.md says the same):

* **Tokens.** ``prompt_ids`` are the sample's prompt (what the engine was first given),
  ``completion_ids`` everything after it: every model turn and every tool or user message
  between them. ``env_mask`` is agentrl's ``loss_mask`` (1 on sampled tokens, 0 on the
  rest) and ``logprobs`` the engine's sampled log-probs (0.0 where the mask is 0).
* **Several samples per rollout** (a fork, compaction): TRL takes one completion per
  prompt. The chain holding the rollout's last turn trains (on a tie the one with more
  trained tokens); the others are counted in ``agentrl_chains`` and
  ``agentrl_untrained_tokens``, not trained.
* **Truncation.** With ``max_completion_tokens`` set, a longer completion is cut at the
  end (``agentrl_truncated``); a cut that leaves nothing trained excludes the row.
* **Untrainable outcomes** (infra and grader failures, a rollout without samples): a
  placeholder row (one pad token, mask 0) whose ``agentrl_reward`` is None. The reward
  function returns None for it, so TRL leaves it out of its group's mean and std and
  gives it advantage 0: like slime's ``remove_sample``, it never moves the policy.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from agentrl.trajectory import TrainingSample, main_chain

__all__ = ["ROW_KEYS", "excluded_row", "rollout_row"]

logger = logging.getLogger(__name__)

#: The keys of every row (TRL needs the same keys on each).
ROW_KEYS = (
    "prompt_ids",
    "completion_ids",
    "env_mask",
    "logprobs",
    "agentrl_reward",
    "agentrl_outcome",
    "agentrl_trainable",
    "agentrl_instance_id",
    "agentrl_session_id",
    "agentrl_turns",
    "agentrl_chains",
    "agentrl_untrained_tokens",
    "agentrl_truncated",
    "agentrl_error",
)


def excluded_row(reason: str, *, pad_token_id: int, facts: dict[str, Any]) -> dict[str, Any]:
    """A row TRL keeps but never trains on: one pad token, mask 0, no reward (None)."""
    logger.warning(
        "agentrl rollout %s excluded from training: %s",
        facts.get("agentrl_instance_id", "?"),
        reason,
    )
    row: dict[str, Any] = dict.fromkeys(ROW_KEYS)
    row.update(facts)
    row.update(
        prompt_ids=[pad_token_id],
        completion_ids=[pad_token_id],
        env_mask=[0],
        logprobs=[0.0],
        agentrl_reward=None,
        agentrl_trainable=False,
        agentrl_error=facts.get("agentrl_error") or reason,
    )
    return row


def rollout_row(
    result: Any, *, pad_token_id: int, max_completion_tokens: int | None = None
) -> dict[str, Any]:
    """The row of a finished ``RolloutResult``: its main chain, token for token."""
    samples: Sequence[TrainingSample] = result.samples
    facts: dict[str, Any] = {
        "agentrl_outcome": result.outcome.value,
        "agentrl_instance_id": result.instance_id,
        "agentrl_session_id": result.session_id,
        "agentrl_turns": int(result.turns),
        "agentrl_chains": len(samples),
        "agentrl_untrained_tokens": 0,
        "agentrl_truncated": False,
        "agentrl_error": (result.error or "")[:2000] or None,
    }
    if result.remove_sample:
        return excluded_row(result.outcome.value, pad_token_id=pad_token_id, facts=facts)
    if not samples:
        return excluded_row("no_trainable_samples", pad_token_id=pad_token_id, facts=facts)
    main = main_chain(samples)
    sample = samples[main]
    tokens = list(sample.tokens)
    completion = tokens[sample.prompt_length :]
    mask = [int(m) for m in sample.loss_mask]
    logprobs = [float(lp) for lp in sample.rollout_logprobs]
    truncated = bool(sample.metadata.get("truncated"))
    if max_completion_tokens is not None and len(completion) > max_completion_tokens:
        cut = max_completion_tokens
        completion, mask, logprobs, truncated = completion[:cut], mask[:cut], logprobs[:cut], True
    if 1 not in mask:
        return excluded_row("truncated_to_nothing", pad_token_id=pad_token_id, facts=facts)
    untrained = sum(sum(s.loss_mask) for k, s in enumerate(samples) if k != main)
    if untrained:
        logger.info(
            "rollout %s: %d chains, chain %d trains; %d sampled tokens of the others are "
            "reported only (TRL takes one completion per prompt)",
            result.instance_id,
            len(samples),
            main,
            untrained,
        )
    row: dict[str, Any] = dict.fromkeys(ROW_KEYS)
    row.update(facts)
    row.update(
        prompt_ids=tokens[: sample.prompt_length],
        completion_ids=completion,
        env_mask=mask,
        logprobs=logprobs,
        agentrl_reward=float(result.reward),
        agentrl_trainable=True,
        agentrl_untrained_tokens=untrained,
        agentrl_truncated=truncated,
    )
    return row
