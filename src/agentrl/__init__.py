"""agentrl: reinforcement learning of real coding agents.

The public face: what a plugin or a trainer needs, importable from ``agentrl`` itself.

- ``hookimpl``, to mark plugin hook implementations;
- the contracts a plugin implements: ``Engine``, ``Adapter``, ``Sandbox``, ``Harness``,
  ``Grader``, ``ToolCallParser``, ``ReasoningParser``;
- the values passed between layers: ``Task``, ``Grade``, ``Outcome``, ``ExecResult``,
  ``Generation``, the ``TurnRecordedEvent`` / ``RolloutFinishedEvent`` events;
- the trajectory core: ``TrajectoryManager``, ``TurnRecord``, ``TrainingSample``;
- one rollout: ``run_rollout`` with its ``RolloutConfig`` and ``RolloutResult``;
- the errors a caller may catch.

Every name loads on first use (a module ``__getattr__``), so ``import agentrl`` and
``import agentrl.trajectory`` stay as light as attrs: the core imports nothing heavier, and
any trainer can use it. Modules inside agentrl import from the defining modules, never
from here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from agentrl.version import __version__

#: Public name -> the module that defines it.
_EXPORTS: dict[str, str] = {
    # plugins
    "hookimpl": "agentrl.hookspecs",
    # contracts
    "Adapter": "agentrl.adapters.base",
    "Engine": "agentrl.engines.base",
    "Grader": "agentrl.graders.base",
    "Harness": "agentrl.harnesses.base",
    "ReasoningParser": "agentrl.parsers.base",
    "Sandbox": "agentrl.sandboxes.base",
    "ToolCallParser": "agentrl.parsers.base",
    # values and events
    "ExecResult": "agentrl.types",
    "Generation": "agentrl.engines.base",
    "Grade": "agentrl.types",
    "Outcome": "agentrl.types",
    "RolloutFinishedEvent": "agentrl.types",
    "Task": "agentrl.types",
    "TurnRecordedEvent": "agentrl.types",
    # the trajectory core
    "TrainingSample": "agentrl.trajectory",
    "TrajectoryManager": "agentrl.trajectory",
    "TurnRecord": "agentrl.trajectory",
    # one rollout
    "RolloutConfig": "agentrl.rollout.config",
    "RolloutResult": "agentrl.rollout.run",
    "run_rollout": "agentrl.rollout.run",
    # errors
    "EngineAbortedError": "agentrl.engines.base",
    "EngineError": "agentrl.engines.base",
    "ExecFailedError": "agentrl.sandboxes.base",
    "HarnessError": "agentrl.harnesses.errors",
    "MissingEngineOptionError": "agentrl.engines.base",
    "NotAvailableError": "agentrl.plugins",
    "OptionsError": "agentrl.plugin_options",
    "ParserError": "agentrl.parsers.base",
    "PluginError": "agentrl.plugins",
    "SandboxError": "agentrl.sandboxes.base",
    "SandboxGoneError": "agentrl.sandboxes.base",
    "TaskLoadError": "agentrl.graders.tasks",
    "TokenizerError": "agentrl.tokenizers",
}

__all__ = [
    "Adapter",
    "Engine",
    "EngineAbortedError",
    "EngineError",
    "ExecFailedError",
    "ExecResult",
    "Generation",
    "Grade",
    "Grader",
    "Harness",
    "HarnessError",
    "MissingEngineOptionError",
    "NotAvailableError",
    "OptionsError",
    "Outcome",
    "ParserError",
    "PluginError",
    "ReasoningParser",
    "RolloutConfig",
    "RolloutFinishedEvent",
    "RolloutResult",
    "Sandbox",
    "SandboxError",
    "SandboxGoneError",
    "Task",
    "TaskLoadError",
    "TokenizerError",
    "ToolCallParser",
    "TrainingSample",
    "TrajectoryManager",
    "TurnRecord",
    "TurnRecordedEvent",
    "__version__",
    "hookimpl",
    "run_rollout",
]


def __getattr__(name: str) -> Any:
    """Load a public name from its module on first use (then it is an ordinary attribute)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agentrl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


if TYPE_CHECKING:
    from agentrl.adapters.base import Adapter
    from agentrl.engines.base import (
        Engine,
        EngineAbortedError,
        EngineError,
        Generation,
        MissingEngineOptionError,
    )
    from agentrl.graders.base import Grader
    from agentrl.graders.tasks import TaskLoadError
    from agentrl.harnesses.base import Harness
    from agentrl.harnesses.errors import HarnessError
    from agentrl.hookspecs import hookimpl
    from agentrl.parsers.base import ParserError, ReasoningParser, ToolCallParser
    from agentrl.plugin_options import OptionsError
    from agentrl.plugins import NotAvailableError, PluginError
    from agentrl.rollout.config import RolloutConfig
    from agentrl.rollout.run import RolloutResult, run_rollout
    from agentrl.sandboxes.base import ExecFailedError, Sandbox, SandboxError, SandboxGoneError
    from agentrl.tokenizers import TokenizerError
    from agentrl.trajectory import TrainingSample, TrajectoryManager, TurnRecord
    from agentrl.types import (
        ExecResult,
        Grade,
        Outcome,
        RolloutFinishedEvent,
        Task,
        TurnRecordedEvent,
    )
