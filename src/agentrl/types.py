"""Value objects shared across layers.

Everything here is an ``attrs`` frozen value: cheap to import (attrs only), safe to pass
between threads and hooks, and serialised only at the edges (``to_dict``).
"""

from __future__ import annotations

import enum
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

__all__ = [
    "DEFAULT_GRADER",
    "ExecResult",
    "Grade",
    "Outcome",
    "RolloutFinishedEvent",
    "Task",
    "TurnFact",
    "TurnRecordedEvent",
]


#: The grader a task names when its parser does not say.
DEFAULT_GRADER = "scaleswe"

_PROTOCOL_DEPRECATED = "Task.protocol is deprecated: the grader's name is Task.grader"


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


@attrs.frozen(kw_only=True, init=False)
class Task:
    """One task row, parsed by a grader into what a rollout needs.

    ``grader`` names the grader plugin that parsed the row and grades it. ``grading`` is
    that grader's own payload (eval command, SWE-bench instance, …); other layers treat it
    as opaque. ``protocol`` is the old name of ``grader``: ``Task(protocol=...)``,
    ``task.protocol`` and a ``"protocol"`` key in ``from_dict`` still work (deprecated).
    """

    instance_id: str
    problem_statement: str
    image: str | None
    workdir: str
    repo: str | None
    grader: str
    pre_commands: tuple[str, ...] = attrs.field(converter=tuple)
    grading: dict[str, Any] = attrs.field(converter=_freeze_mapping)
    metadata: dict[str, Any] = attrs.field(converter=_freeze_mapping)

    def __init__(
        self,
        *,
        instance_id: str,
        problem_statement: str,
        image: str | None = None,
        workdir: str = "/workspace",
        repo: str | None = None,
        grader: str | None = None,
        pre_commands: Iterable[str] = (),
        grading: Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
        protocol: str | None = None,
    ) -> None:
        if protocol is not None:
            warnings.warn(_PROTOCOL_DEPRECATED, DeprecationWarning, stacklevel=2)
        self.__attrs_init__(
            instance_id=instance_id,
            problem_statement=problem_statement,
            image=image,
            workdir=workdir,
            repo=repo,
            grader=grader or protocol or DEFAULT_GRADER,
            pre_commands=pre_commands,
            grading=grading,
            metadata=metadata,
        )

    @property
    def protocol(self) -> str:
        """Deprecated: the old name of :attr:`grader`."""
        warnings.warn(_PROTOCOL_DEPRECATED, DeprecationWarning, stacklevel=2)
        return self.grader

    def to_dict(self) -> dict[str, Any]:
        """The task as JSON-ready values (``from_dict`` reads it back)."""
        data = attrs.asdict(self, recurse=False)
        data["pre_commands"] = list(self.pre_commands)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Task:
        """A task from ``to_dict``'s shape; the old ``"protocol"`` key is read as ``"grader"``."""
        fields = {f.name for f in attrs.fields(cls)}
        values = {key: value for key, value in data.items() if key in fields}
        if "grader" not in values and isinstance(data.get("protocol"), str):
            values["grader"] = data["protocol"]
        return cls(**values)


@attrs.frozen(kw_only=True)
class Grade:
    """What a grader concluded about one diff.

    ``solved`` (every required test passed) and ``reward`` (what the policy is paid) are
    separate, so a grader may shape rewards; outcomes, pass@k and solve rates read
    ``solved``. Neither has a default: the grader states both. ``error`` is set when the
    grader itself could not run (sandbox failure, missing package): such a grade must never
    be read as a policy failure. ``suspicious`` holds the diff lines that only a reward
    hack needs (the edit guard's findings); a grade with any is never solved.
    """

    reward: float
    solved: bool
    applied_cleanly: bool = True
    error: str | None = None
    details: dict[str, Any] = attrs.field(factory=dict, converter=_freeze_mapping)
    suspicious: tuple[str, ...] = attrs.field(default=(), converter=tuple)

    def __attrs_post_init__(self) -> None:
        if self.solved and (self.error is not None or self.suspicious):
            raise ValueError(
                "Grade.solved must be False when the grade has an error or suspicious edits"
            )


class Outcome(str, enum.Enum):
    """How one rollout ended."""

    SOLVED = "solved"
    UNSOLVED = "unsolved"
    AGENT_ERROR = "agent_error"
    CONTEXT_OVERFLOW = "context_overflow"
    TIMEOUT = "timeout"
    INFRA_ERROR = "infra_error"
    GRADER_ERROR = "grader_error"
    #: The diff holds what only a reward hack needs (the edit guard): reward 0, it trains.
    REWARD_HACK_SUSPECTED = "reward_hack_suspected"

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

    ``finish_reason`` is the engine's (``stop``, ``length``, ``abort``). The rest, for
    ``agentrl view``'s session page, has defaults (older writers left it out): the
    middleware's turn ``index``, the names of the parsed ``tool_calls``, whether the
    parser found the output ``ill_formed``, the engine's seconds and the turn's wall-clock
    start (``time.time()``). Two facts are equal when their sizes and end are.
    """

    prompt_tokens: int
    output_tokens: int
    finish_reason: str
    index: int | None = attrs.field(default=None, eq=False)
    tool_calls: tuple[str, ...] = attrs.field(default=(), converter=tuple, eq=False)
    ill_formed: bool = attrs.field(default=False, eq=False)
    engine_seconds: float | None = attrs.field(default=None, eq=False)
    started: float | None = attrs.field(default=None, eq=False)


@attrs.frozen(kw_only=True)
class RolloutFinishedEvent:
    """Sent to ``on_rollout_finished`` once a rollout has a final outcome."""

    instance_id: str
    outcome: Outcome
    reward: float
    num_samples: int
    metadata: dict[str, Any] = attrs.field(factory=dict, converter=_freeze_mapping)
