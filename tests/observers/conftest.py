"""The trackers' tests: real ``RolloutFinishedEvent`` values, as ``run_rollout`` sends them."""

from __future__ import annotations

import pytest

from agentrl.types import Outcome, RolloutFinishedEvent


def _finished(
    instance_id: str,
    outcome: Outcome,
    reward: float,
    *,
    turns: int = 3,
    sampled_tokens: int = 120,
    agent_seconds: float = 4.5,
    error: str | None = None,
) -> RolloutFinishedEvent:
    """A finished rollout's event with the metadata ``run_rollout`` gives it."""
    return RolloutFinishedEvent(
        instance_id=instance_id,
        outcome=outcome,
        reward=reward,
        num_samples=1 if outcome.trainable else 0,
        metadata={
            "session_id": f"{instance_id}-0-abcd",
            "harness": "claude_code",
            "timings": {"boot": 0.25, "agent": agent_seconds, "grade": 1.5, "total": 7.0},
            "error": error,
            "turns": turns,
            "sampled_tokens": sampled_tokens,
        },
    )


@pytest.fixture
def finished():
    """Build a finished rollout's event: ``finished(instance_id, outcome, reward, turns=...)``."""
    return _finished


@pytest.fixture
def events() -> list[RolloutFinishedEvent]:
    """Three rollouts: solved, unsolved, and an infra error whose message has a pipe."""
    return [
        _finished("textstats-1", Outcome.SOLVED, 1.0, turns=4, sampled_tokens=300),
        _finished("textstats-2", Outcome.UNSOLVED, 0.0, agent_seconds=9.0),
        _finished(
            "textstats-3",
            Outcome.INFRA_ERROR,
            0.0,
            turns=0,
            sampled_tokens=0,
            error="boot failed | bwrap\nexited 1",
        ),
    ]
