"""Turning a rollout's result into slime ``Sample`` objects, and the placeholders slime expects.

Samples are built from the incoming sample's own class (a deep copy with fields set), so
nothing here imports slime or torch and any slime version's ``Sample`` works. The shapes
follow slime's checks: ``len(tokens) > response_length >= 1``, ``loss_mask`` and
``rollout_log_probs`` of length ``response_length``, ``reward`` a float on every sample,
and every sibling of one rollout sharing ``rollout_id``.
"""

from __future__ import annotations

import copy
import logging
import secrets
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "abort_placeholder",
    "eval_placeholder",
    "rollout_id_of",
    "sample_status",
    "session_id_of",
    "task_row",
    "to_slime_samples",
]

logger = logging.getLogger(__name__)

#: Keys agentrl writes into ``Sample.metadata`` (they win over the dataset's own keys).
AGENTRL_METADATA_KEYS = (
    "instance_id",
    "outcome",
    "reward",
    "grading_solved",
    "agent_exit_code",
    "session_id",
    "rollout_turns",
    "sampled_tokens",
    "timings",
    "branch_index",
    "num_branches",
    "abort_reason",
    "error",
)


def sample_status(sample: Any, name: str) -> Any:
    """The ``Sample.Status`` member called ``name``, from the sample's own class."""
    status_enum = getattr(type(sample), "Status", None) or type(sample.status)
    return status_enum[name]


def rollout_id_of(sample: Any) -> int:
    """The id every sibling of this rollout carries: the incoming ``rollout_id``, else ``index``.

    A sample with neither (only possible outside slime's data source) gets a fresh random
    id, so its siblings still agree with each other and with nobody else.
    """
    rollout_id = getattr(sample, "rollout_id", None)
    if rollout_id is not None:
        return rollout_id
    index = getattr(sample, "index", None)
    if index is not None:
        return index
    fresh = uuid.uuid4().int >> 66
    logger.warning("sample has neither rollout_id nor index; using rollout_id=%d", fresh)
    return fresh


def session_id_of(sample: Any, instance_id: str) -> str:
    """slime's per-sample session id (training sets one); otherwise a fresh, unguessable one."""
    session_id = getattr(sample, "session_id", None)
    if session_id:
        return str(session_id)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in instance_id)[:64]
    return f"agentrl-{safe}-{getattr(sample, 'index', None)}-{secrets.token_hex(8)}"


def task_row(sample: Any) -> dict[str, Any]:
    """The dataset row a grader parses, rebuilt from a slime sample.

    slime keeps the row's ``--input-key`` in ``prompt``, ``--label-key`` in ``label`` and
    ``--metadata-key`` in ``metadata``, which is the row shape agentrl's graders read.
    """
    return {
        "prompt": getattr(sample, "prompt", ""),
        "label": getattr(sample, "label", None),
        "metadata": dict(getattr(sample, "metadata", None) or {}),
    }


def _fresh(base: Any, **fields: Any) -> Any:
    """A copy of ``base`` (same class, nothing shared) with ``fields`` set."""
    heavy = {name: getattr(base, name) for name in ("tokens", "metadata") if hasattr(base, name)}
    try:
        # Don't deep-copy what is about to be replaced.
        for name in heavy:
            setattr(base, name, None)
        sample = copy.deepcopy(base)
    finally:
        for name, value in heavy.items():
            setattr(base, name, value)
    for name, value in fields.items():
        setattr(sample, name, value)
    return sample


def _merged_metadata(base: Any, extra: Mapping[str, Any]) -> dict[str, Any]:
    return {**(getattr(base, "metadata", None) or {}), **extra}


def _placeholder(
    base: Any, *, status: str, reward: float, rollout_id: int, metadata: Mapping[str, Any]
) -> list[Any]:
    sample = _fresh(
        base,
        tokens=[0, 0],
        response="",
        response_length=1,
        loss_mask=[0],
        rollout_log_probs=[0.0],
        reward=float(reward),
        remove_sample=True,
        status=sample_status(base, status),
        rollout_id=rollout_id,
        metadata=_merged_metadata(base, metadata),
    )
    return [sample]


def abort_placeholder(
    base: Any, reason: str, metadata: Mapping[str, Any] | None = None
) -> list[Any]:
    """slime's abort shape: one untrained ABORTED sample, reward 0.0, ``abort_reason`` set.

    It keeps ``index``/``group_index`` so slime's bookkeeping still sees the rollout; its
    loss mask is all zero and ``remove_sample`` is set, so it never trains the policy.
    """
    metadata = dict(metadata or {})
    logger.warning(
        "rollout %s aborted: %s", metadata.get("instance_id", getattr(base, "index", "?")), reason
    )
    return _placeholder(
        base,
        status="ABORTED",
        reward=0.0,
        rollout_id=rollout_id_of(base),
        metadata={**metadata, "abort_reason": reason},
    )


def eval_placeholder(
    base: Any, reward: float, metadata: Mapping[str, Any] | None = None
) -> list[Any]:
    """Evaluation's shape: one COMPLETED, untrained sample whose ``reward`` is the score."""
    return _placeholder(
        base,
        status="COMPLETED",
        reward=float(reward),
        rollout_id=rollout_id_of(base),
        metadata=dict(metadata or {}),
    )


def result_metadata(result: Any, *, session_id: str | None = None) -> dict[str, Any]:
    """The per-rollout facts every emitted sample carries (all picklable)."""
    outcome = getattr(result.outcome, "value", result.outcome)
    grade = getattr(result, "grade", None)
    out: dict[str, Any] = {
        "instance_id": result.instance_id,
        "outcome": str(outcome),
        "reward": float(result.reward),
        "grading_solved": bool(getattr(grade, "solved", outcome == "solved")),
        "agent_exit_code": result.agent_exit_code,
        "session_id": session_id or getattr(result, "session_id", None),
        "rollout_turns": int(getattr(result, "turns", 0) or 0),
        "sampled_tokens": int(getattr(result, "sampled_tokens", 0) or 0),
        "timings": {str(k): float(v) for k, v in (getattr(result, "timings", None) or {}).items()},
    }
    if grade is not None:
        out["applied_cleanly"] = bool(getattr(grade, "applied_cleanly", True))
    if getattr(result, "error", None):
        out["error"] = str(result.error)[:2000]
    return out


def non_generation_seconds(result: Any) -> float:
    """Seconds of the rollout not spent in the engine (boot, tools, grading), for slime's
    ``non_generation_time`` perf metrics; 0.0 when the timings are unknown."""
    total = float((getattr(result, "timings", None) or {}).get("total", 0.0))
    engine: dict[Any, float] = {}
    for ts in getattr(result, "samples", ()):
        turns = ts.metadata.get("turn_metadata") or {}
        for key, turn in turns.items() if isinstance(turns, Mapping) else ():
            if isinstance(turn, Mapping):
                engine[turn.get("middleware_turn", key)] = float(turn.get("engine_seconds", 0.0))
    return max(0.0, total - sum(engine.values())) if total else 0.0


def to_slime_samples(
    base: Any,
    samples: Sequence[Any],
    *,
    metadata: Mapping[str, Any],
    responses: Sequence[str] | None = None,
    non_generation_time: float = 0.0,
) -> list[Any]:
    """One slime sample per trajectory chain, all sharing the base sample's rollout id.

    Metadata: the dataset's, then the chain's provenance (``turns`` in this chain,
    ``trained_turns``, ``truncated``, …), then the rollout's facts (``metadata``).

    ``samples`` are ``TrainingSample`` values and ``responses`` their decoded response
    regions (for logging only; never re-tokenized). A sample slime could not train on (no
    prompt before its response) is dropped with an error log; the caller turns an empty
    result into a placeholder.
    """
    if responses is None:
        responses = [""] * len(samples)
    if len(responses) != len(samples):
        raise ValueError(f"got {len(responses)} decoded responses for {len(samples)} samples")
    rollout_id = rollout_id_of(base)
    usable = []
    for k, (ts, text) in enumerate(zip(samples, responses, strict=True)):
        if not (len(ts.tokens) > ts.response_length >= 1):
            logger.error(
                "dropping chain %d of %s: slime needs len(tokens) > response_length >= 1, "
                "got %d tokens and response_length %d",
                k,
                metadata.get("instance_id"),
                len(ts.tokens),
                ts.response_length,
            )
            continue
        usable.append((ts, text))
    out = []
    for k, (ts, text) in enumerate(usable):
        truncated = bool(ts.metadata.get("truncated"))
        out.append(
            _fresh(
                base,
                tokens=list(ts.tokens),
                response=text,
                response_length=int(ts.response_length),
                loss_mask=[int(m) for m in ts.loss_mask],
                rollout_log_probs=[float(lp) for lp in ts.rollout_logprobs],
                reward=float(ts.reward),
                remove_sample=False,
                non_generation_time=float(non_generation_time),
                status=sample_status(base, "TRUNCATED" if truncated else "COMPLETED"),
                rollout_id=rollout_id,
                metadata=_merged_metadata(
                    base,
                    {
                        **dict(ts.metadata),
                        **metadata,
                        "branch_index": k,
                        "num_branches": len(usable),
                    },
                ),
            )
        )
    return out
