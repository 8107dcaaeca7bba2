"""Token-exact training samples from a session's recorded turns.

The middleware calls :meth:`TrajectoryManager.record_turn` once per engine call with the
exact prompt and sampled ids; a trainer calls :meth:`TrajectoryManager.get_trajectory`
once the reward is known. ``docs/trajectory.md`` describes the model and its invariants.

The package is laid out as :mod:`~agentrl.trajectory.manager` (the manager and its
records), :mod:`~agentrl.trajectory.tree` (the per-session message tree),
:mod:`~agentrl.trajectory.tokens` (compact token storage) and
:mod:`~agentrl.trajectory.linearize` (chains into samples). Import from this package;
its submodules are private. It imports nothing heavier than attrs, so any trainer can
use it.
"""

from __future__ import annotations

from agentrl.trajectory.linearize import DriftKind
from agentrl.trajectory.manager import (
    SessionStats,
    TrainingSample,
    TrajectoryManager,
    TurnRecord,
    main_chain,
)
from agentrl.trajectory.tokens import common_prefix_length
from agentrl.trajectory.tree import message_key

__all__ = [
    "DriftKind",
    "SessionStats",
    "TrainingSample",
    "TrajectoryManager",
    "TurnRecord",
    "common_prefix_length",
    "main_chain",
    "message_key",
]
