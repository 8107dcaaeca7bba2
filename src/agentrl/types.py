"""Value objects shared across layers.

Everything here is an ``attrs`` frozen value: cheap to import (attrs only), safe to pass
between threads and hooks, and serialised only at the edges (``to_dict``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import attrs

__all__ = [
    "ExecResult",
    "Grade",
    "Outcome",
    "RolloutFinishedEvent",
    "Task",
    "TurnFact",
    "TurnRecordedEvent",
]


def _freeze_mapping(value: Mapping[str, Any] | None) -> dict[str, Any]:
    return dict(value or {})


@attrs.frozen(kw_only=True)
class ExecResult:
    """The result of one command run in a sandbox."""

    exit_code: int
    stdout: str = ""
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@attrs.frozen(kw_only=True)
class Task:
    """One task row, parsed by a grader into what a rollout needs.

    ``grading`` is the grader's own payload (eval command, SWE-bench instance, …); other
    layers treat it as opaque.
    """

    instance_id: str
    problem_statement: str
    image: str | None = None
    workdir: str = "/workspace"
    repo: str | None = None
    protocol: str = "scaleswe"
    pre_commands: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    grading: dict[str, Any] = attrs.field(factory=dict, converter=_freeze_mapping)
    metadata: dict[str, Any] = attrs.field(factory=dict, converter=_freeze_mapping)


@attrs.frozen(kw_only=True)
class Grade:
    """What a grader concluded about one diff.

    ``error`` is set when the grader itself could not run (sandbox failure, timeout,
    missing package): such a grade must never be read as a policy failure.
    """

    reward: float
    applied_cleanly: bool = True
    error: str | None = None
    details: dict[str, Any] = attrs.field(factory=dict, converter=_freeze_mapping)

    @property
    def solved(self) -> bool:
        return self.error is None and self.reward >= 1.0


class Outcome(str, enum.Enum):
    """How one rollout ended."""

    SOLVED = "solved"
    UNSOLVED = "unsolved"
    AGENT_ERROR = "agent_error"
    CONTEXT_OVERFLOW = "context_overflow"
    TIMEOUT = "timeout"
    INFRA_ERROR = "infra_error"
    GRADER_ERROR = "grader_error"

    @property
    def trainable(self) -> bool:
        """Whether samples of this outcome may train the policy (infra failures may not)."""
        return self not in (Outcome.INFRA_ERROR, Outcome.GRADER_ERROR)


@attrs.frozen(kw_only=True)
class TurnRecordedEvent:
    """Sent to ``on_turn_recorded`` after the middleware records one engine turn."""

    session_id: str
    turn_index: int
    prompt_tokens: int
    output_tokens: int
    finish_reason: str
    protocol: str = ""
    metadata: dict[str, Any] = attrs.field(factory=dict, converter=_freeze_mapping)


@attrs.frozen(kw_only=True)
class TurnFact:
    """What a middleware session keeps of each recorded engine turn: its sizes and its end.

    ``finish_reason`` is the engine's (``stop``, ``length``, ``abort``).
    """

    prompt_tokens: int
    output_tokens: int
    finish_reason: str


@attrs.frozen(kw_only=True)
class RolloutFinishedEvent:
    """Sent to ``on_rollout_finished`` once a rollout has a final outcome."""

    instance_id: str
    outcome: Outcome
    reward: float
    num_samples: int
    metadata: dict[str, Any] = attrs.field(factory=dict, converter=_freeze_mapping)
