"""TRL integration: GRPO (``trl.GRPOTrainer``) over real agentrl rollouts.

::

    from agentrl.trl import AgentrlRollouts, TrlRolloutOptions, grader_reward

    rollouts = AgentrlRollouts(TrlRolloutOptions(harness="tiny_agent", sandbox="local"))
    trainer = GRPOTrainer(model=model, reward_funcs=grader_reward, args=config,
                          train_dataset=Dataset.from_list([{"prompt": json.dumps(row)}, ...]),
                          rollout_func=rollouts)

Each prompt is a task row; each rollout runs the harness in a sandbox against the
middleware, served by the trained model itself, and is graded in a fresh sandbox.
Importing this package imports neither TRL nor torch (``agentrl[trl]``; tested against
trl 1.16.0). ``python -m agentrl.trl.learn`` (``make learn``) is the worked example.
"""

from __future__ import annotations

from agentrl.trl.outputs import ROW_KEYS, excluded_row, rollout_row
from agentrl.trl.rewards import grader_reward
from agentrl.trl.rollouts import AgentrlRollouts, TrlRolloutOptions

__all__ = [
    "ROW_KEYS",
    "SUPPORTED_TRL",
    "AgentrlRollouts",
    "TrlRolloutOptions",
    "excluded_row",
    "grader_reward",
    "rollout_row",
]

#: The TRL versions this integration is tested against (pyproject's ``trl`` extra pins it).
SUPPORTED_TRL = ("1.16.0",)
