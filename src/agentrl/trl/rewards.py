"""The reward function TRL calls: the grader's reward, carried by each rollout's row."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["grader_reward"]


def grader_reward(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    agentrl_reward: Sequence[float | None] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """The grader's reward of each completion; None for a rollout that must not train.

    TRL leaves a None out of its group's mean and std and gives that completion
    advantage 0. The completion's text is never read: the grader decided, in a fresh
    sandbox, from the agent's diff.
    """
    if agentrl_reward is None:
        raise ValueError(
            "grader_reward: no agentrl_reward column; use it with "
            "rollout_func=agentrl.trl.AgentrlRollouts(...)"
        )
    return [None if r is None else float(r) for r in agentrl_reward]
