"""The rules that turn a rollout into one TRL row (no TRL needed): which chain trains, what a
cut keeps, and rows that must never move the policy."""

from __future__ import annotations

import attrs

from agentrl.trajectory import TrainingSample
from agentrl.trl import ROW_KEYS, rollout_row
from agentrl.types import Outcome

PAD = 0


@attrs.define
class Result:
    """The fields of a ``RolloutResult`` the row reads."""

    samples: list
    outcome: Outcome = Outcome.SOLVED
    reward: float = 1.0
    remove_sample: bool = False
    instance_id: str = "t-1"
    session_id: str = "s-1"
    turns: int = 2
    error: str | None = None


def _sample(prompt, response, mask, turns):
    logprobs = [-0.5 if m else 0.0 for m in mask]
    return TrainingSample(
        tokens=[*prompt, *response],
        prompt_length=len(prompt),
        response_length=len(response),
        loss_mask=mask,
        rollout_logprobs=logprobs,
        reward=1.0,
        metadata={"turns": turns},
    )


def test_a_linear_rollout_is_its_sample_token_for_token():
    """prompt_ids, completion_ids, env_mask and logprobs are the sample's, reward the grade's."""
    sample = _sample([1, 2, 3], [4, 5, 6, 7], [1, 1, 0, 1], [0, 1])
    row = rollout_row(Result([sample], reward=0.0, outcome=Outcome.UNSOLVED), pad_token_id=PAD)
    assert set(row) == set(ROW_KEYS)
    assert row["prompt_ids"] == [1, 2, 3] and row["completion_ids"] == [4, 5, 6, 7]
    assert row["env_mask"] == [1, 1, 0, 1] and row["logprobs"] == [-0.5, -0.5, 0.0, -0.5]
    assert (row["agentrl_reward"], row["agentrl_outcome"]) == (0.0, "unsolved")
    assert row["agentrl_trainable"] and not row["agentrl_truncated"]


def test_of_several_chains_the_one_holding_the_last_turn_trains():
    """A forked rollout trains the chain with its last turn; the others' tokens are counted."""
    early = _sample([1, 2], [3, 4, 5], [1, 1, 1], [0, 1])
    last = _sample([9, 8], [7, 6], [1, 1], [2])
    row = rollout_row(Result([early, last]), pad_token_id=PAD)
    assert row["completion_ids"] == [7, 6]
    assert (row["agentrl_chains"], row["agentrl_untrained_tokens"]) == (2, 3)


def test_a_cut_keeps_the_head_and_says_so_and_a_cut_to_nothing_is_excluded():
    """max_completion_tokens cuts the end (flagged); a cut leaving no sampled token is excluded."""
    sample = _sample([1], [2, 3, 4, 5], [1, 0, 1, 1], [0, 1])
    row = rollout_row(Result([sample]), pad_token_id=PAD, max_completion_tokens=2)
    assert row["completion_ids"] == [2, 3] and row["env_mask"] == [1, 0]
    assert row["agentrl_truncated"]
    tool_first = _sample([1], [2, 3, 4], [0, 0, 1], [1])
    cut = rollout_row(Result([tool_first]), pad_token_id=PAD, max_completion_tokens=2)
    assert cut["agentrl_reward"] is None and cut["env_mask"] == [0]


def test_untrainable_rollouts_are_placeholders_without_a_reward():
    """An infra error (remove_sample) or no sample: one pad token, mask 0, reward None (TRL
    leaves a None reward out of its group's statistics and gives the row advantage 0)."""
    sample = _sample([1], [2], [1], [0])
    for result in (
        Result([sample], outcome=Outcome.INFRA_ERROR, remove_sample=True, error="boot failed"),
        Result([], outcome=Outcome.UNSOLVED),
    ):
        row = rollout_row(result, pad_token_id=PAD)
        assert row["completion_ids"] == [PAD] and row["env_mask"] == [0]
        assert row["logprobs"] == [0.0]
        assert row["agentrl_reward"] is None and row["agentrl_trainable"] is False
        assert row["agentrl_error"]
