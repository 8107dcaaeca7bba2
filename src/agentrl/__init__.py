"""agentrl: reinforcement learning of real coding agents.

The core (`TrajectoryManager`, `TurnRecord`, `TrainingSample`) imports nothing heavier than
attrs, so any trainer can use it.
"""

from __future__ import annotations

from agentrl.hookspecs import hookimpl
from agentrl.trajectory import TrainingSample, TrajectoryManager, TurnRecord
from agentrl.types import ExecResult, Grade, Outcome, RolloutFinishedEvent, Task, TurnRecordedEvent

__version__ = "0.1.0"

__all__ = [
    "ExecResult",
    "Grade",
    "Outcome",
    "RolloutFinishedEvent",
    "Task",
    "TrainingSample",
    "TrajectoryManager",
    "TurnRecord",
    "TurnRecordedEvent",
    "__version__",
    "hookimpl",
]
