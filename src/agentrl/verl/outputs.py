"""One rollout's result as the fields of verl's ``AgentLoopOutput`` (no verl import here).

What does not map one-to-one, and what agentrl does (docs/trainers.md says the same):

* **Several samples per rollout** (sub-agents, compaction, forks). verl 0.9.1 takes one
  ``AgentLoopOutput`` per dataset row. The chain that holds the rollout's last turn (the
  one that finished the task; on a tie the one with more trained tokens) trains; the
  others are reported in ``extra_fields`` (``agentrl_chains``, ``agentrl_untrained_tokens``).
* **Lengths.** verl pads prompts to ``rollout.prompt_length`` and responses to
  ``rollout.response_length``. The loop caps the session's context at their sum, so a
  sample always fits in total; when its first prompt is longer than ``prompt_length``,
  the prompt's tail moves to the head of the response with mask 0 (the token sequence,
  and so what the model saw, is unchanged). A response still too long is cut at the end
  and flagged ``agentrl_truncated``; a cut that leaves nothing trained excludes the row.
* **Failures.** Infra and grader failures, aborted rollouts and rows without a task are
  *excluded*: one placeholder token with ``response_mask`` 0 (no policy-gradient term),
  reward 0.0 and ``agentrl_trainable`` False. verl 0.9.1 has no way for an agent loop to
  drop a row from the batch, so the placeholder still counts in its group's GRPO mean and
  std (as slime's ``remove_sample`` does); filter on ``agentrl_trainable`` to leave it out.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.trajectory import TrainingSample, main_chain

__all__ = ["EXTRA_KEYS", "excluded_output", "main_chain", "rollout_output", "split_for_verl"]

logger = logging.getLogger(__name__)

#: The ``extra_fields`` keys every output carries (verl concatenates them across workers,
#: so every row has every key, None where it does not apply).
EXTRA_KEYS = (
    "agentrl_trainable",
    "agentrl_outcome",
    "agentrl_abort_reason",
    "agentrl_instance_id",
    "agentrl_session_id",
    "agentrl_turns",
    "agentrl_sampled_tokens",
    "agentrl_agent_exit_code",
    "agentrl_chains",
    "agentrl_untrained_tokens",
    "agentrl_truncated",
    "agentrl_error",
    "min_global_steps",
    "max_global_steps",
    "turn_scores",
    "tool_rewards",
)


def _extra(**values: Any) -> dict[str, Any]:
    extra: dict[str, Any] = dict.fromkeys(EXTRA_KEYS)
    extra.update(turn_scores=[], tool_rewards=[], agentrl_chains=0, agentrl_untrained_tokens=0)
    extra.update(values)
    return extra


def split_for_verl(
    sample: TrainingSample, prompt_length: int, response_length: int
) -> tuple[list[int], list[int], list[int], list[float], bool] | None:
    """``(prompt_ids, response_ids, mask, logprobs, truncated)`` within verl's two budgets.

    Moves a too-long prompt's tail into the response (mask 0, log-prob 0.0) and cuts a
    too-long response at the end; None when nothing trained would be left.
    """
    tokens = list(sample.tokens)
    split = min(sample.prompt_length, prompt_length)
    moved = sample.prompt_length - split
    mask = [0] * moved + [int(m) for m in sample.loss_mask]
    logprobs = [0.0] * moved + [float(lp) for lp in sample.rollout_logprobs]
    truncated = bool(sample.metadata.get("truncated"))
    if len(mask) > response_length:
        mask, logprobs, truncated = mask[:response_length], logprobs[:response_length], True
    if 1 not in mask:
        return None
    return tokens[:split], tokens[split : split + len(mask)], mask, logprobs, truncated


def excluded_output(
    reason: str, *, pad_token_id: int, facts: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A row verl keeps but never trains on: one pad token, mask 0, reward 0.0."""
    logger.warning(
        "agentrl rollout %s excluded from training: %s",
        (facts or {}).get("agentrl_instance_id", "?"),
        reason,
    )
    return {
        "prompt_ids": [pad_token_id],
        "response_ids": [pad_token_id],
        "response_mask": [0],
        "response_logprobs": [0.0],
        "reward_score": 0.0,
        "num_turns": 0,
        "extra_fields": _extra(
            **{**dict(facts or {}), "agentrl_trainable": False, "agentrl_abort_reason": reason}
        ),
    }


def rollout_output(
    result: Any,
    *,
    prompt_length: int,
    response_length: int,
    pad_token_id: int,
    steps: tuple[Any, Any] = (None, None),
) -> dict[str, Any]:
    """``AgentLoopOutput`` fields for a finished ``RolloutResult`` (or an excluded row)."""
    samples: Sequence[TrainingSample] = result.samples
    facts = {
        "agentrl_outcome": result.outcome.value,
        "agentrl_instance_id": result.instance_id,
        "agentrl_session_id": result.session_id,
        "agentrl_turns": int(result.turns),
        "agentrl_sampled_tokens": int(result.sampled_tokens),
        "agentrl_agent_exit_code": result.agent_exit_code,
        "agentrl_chains": len(samples),
        "agentrl_error": (result.error or "")[:2000] or None,
        "min_global_steps": steps[0],
        "max_global_steps": steps[1],
    }
    if result.remove_sample:
        return excluded_output(result.outcome.value, pad_token_id=pad_token_id, facts=facts)
    if not samples:
        return excluded_output("no_trainable_samples", pad_token_id=pad_token_id, facts=facts)
    main = main_chain(samples)
    split = split_for_verl(samples[main], prompt_length, response_length)
    if split is None:
        return excluded_output("truncated_to_nothing", pad_token_id=pad_token_id, facts=facts)
    prompt_ids, response_ids, mask, logprobs, truncated = split
    untrained = sum(sum(s.loss_mask) for k, s in enumerate(samples) if k != main)
    if untrained:
        logger.info(
            "rollout %s: %d chains, chain %d trains; %d sampled tokens of the others are "
            "reported only (verl takes one output per row)",
            result.instance_id,
            len(samples),
            main,
            untrained,
        )
    return {
        "prompt_ids": prompt_ids,
        "response_ids": response_ids,
        "response_mask": mask,
        "response_logprobs": logprobs,
        "reward_score": float(result.reward),
        # verl counts messages: each engine turn is an assistant message plus its answer.
        "num_turns": 2 * int(result.turns),
        "extra_fields": _extra(
            **facts,
            agentrl_trainable=True,
            agentrl_untrained_tokens=untrained,
            agentrl_truncated=truncated,
        ),
    }
