"""Token-exact training samples from a session's recorded turns.

The middleware calls :meth:`TrajectoryManager.record_turn` once per engine call with the
exact prompt and sampled ids; a trainer calls :meth:`TrajectoryManager.get_trajectory`
once the reward is known. Turns are routed into a per-session message tree (sub-agents
and context compaction become separate branches) and each root-to-leaf chain is
linearised into one or more :class:`TrainingSample` objects whose trained positions
hold exactly the tokens and log-probs the engine produced. ``docs/trajectory.md``
describes the model and its invariants.

This module imports nothing heavier than attrs, so any trainer can use it.
"""

from __future__ import annotations

import logging
import threading
from array import array
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from agentrl.trajectory.linearize import DriftKind, linearize
from agentrl.trajectory.tokens import to_id_array, to_logprob_array
from agentrl.trajectory.tree import SessionTree, has_tool_calls

__all__ = [
    "DriftKind",
    "SessionStats",
    "TrainingSample",
    "TrajectoryManager",
    "TurnRecord",
    "main_chain",
]

logger = logging.getLogger("agentrl.trajectory")

REWARD_SPLITS = ("full", "divide")


def _as_tuple(values: Any) -> tuple[Any, ...]:
    return values if isinstance(values, tuple) else tuple(values)


def _as_ids(values: Any) -> tuple[int, ...] | array:
    """A tuple as it is, an ``array`` copied (a memcpy, not a Python int per id), else a tuple."""
    if isinstance(values, tuple):
        return values
    if isinstance(values, array):
        return array(values.typecode, values)
    return tuple(values)


@attrs.frozen
class TurnRecord:
    """What the engine did in one call: the exact prompt, the sampled ids and log-probs.

    ``output_logprobs`` holds one log-prob per output id; leave it empty only when the
    engine returned none (the turn then trains with 0.0 log-probs and its samples say
    ``missing_logprobs``). ``ill_formed`` marks an output the parser could not read.
    The ids are kept as a tuple, or as an ``array`` (a copy) when given one, so a 128k
    prompt in an ``array('I')`` never becomes 128k Python ints.
    """

    prompt_ids: tuple[int, ...] | array = attrs.field(converter=_as_ids)
    output_ids: tuple[int, ...] | array = attrs.field(converter=_as_ids)
    output_logprobs: tuple[float, ...] = attrs.field(default=(), converter=_as_tuple)
    finish_reason: str = "stop"
    ill_formed: bool = False


@attrs.frozen(kw_only=True)
class TrainingSample:
    """One training row: a prompt, then a response region the loss mask selects from.

    ``loss_mask`` and ``rollout_logprobs`` cover the response region only:
    ``len(loss_mask) == len(rollout_logprobs) == response_length ==
    len(tokens) - prompt_length >= 1``.
    """

    tokens: tuple[int, ...] = attrs.field(converter=_as_tuple)
    prompt_length: int
    response_length: int
    loss_mask: tuple[int, ...] = attrs.field(converter=_as_tuple)
    rollout_logprobs: tuple[float, ...] = attrs.field(converter=_as_tuple)
    reward: float
    metadata: dict[str, Any] = attrs.field(factory=dict, converter=dict)

    def __attrs_post_init__(self) -> None:
        sizes = (
            len(self.loss_mask),
            len(self.rollout_logprobs),
            len(self.tokens) - self.prompt_length,
        )
        if (
            self.prompt_length < 0
            or self.response_length < 1
            or set(sizes) != {self.response_length}
        ):
            raise ValueError(
                "TrainingSample sizes disagree: expected len(loss_mask) == "
                "len(rollout_logprobs) == len(tokens) - prompt_length == response_length >= 1, "
                f"got loss_mask={sizes[0]}, rollout_logprobs={sizes[1]}, "
                f"tokens={len(self.tokens)}, prompt_length={self.prompt_length}, "
                f"response_length={self.response_length}"
            )

    @property
    def trained_token_count(self) -> int:
        """How many response positions carry loss."""
        return sum(self.loss_mask)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready form (lists instead of tuples)."""
        return {
            "tokens": list(self.tokens),
            "prompt_length": self.prompt_length,
            "response_length": self.response_length,
            "loss_mask": list(self.loss_mask),
            "rollout_logprobs": list(self.rollout_logprobs),
            "reward": self.reward,
            "metadata": dict(self.metadata),
        }


def main_chain(samples: Sequence[TrainingSample]) -> int:
    """The index of the chain that trains when a trainer takes one sample per rollout (verl,
    TRL): the one holding the session's last turn, then the one with most trained tokens."""

    def key(k: int) -> tuple[int, int]:
        turns = samples[k].metadata.get("turns") or (-1,)
        return (max(turns), sum(samples[k].loss_mask))

    return max(range(len(samples)), key=key)


@attrs.frozen(kw_only=True)
class SessionStats:
    """A cheap snapshot of what the manager holds for one session."""

    turns: int
    leaves: int
    sampled_tokens: int
    last_prompt_tokens: int
    held_bytes: int


def _check_nonnegative_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return value


@attrs.define(eq=False)
class TrajectoryManager:
    """Per-session turn trees, linearised into token-exact training samples.

    ``fork_threshold_tokens`` bounds what is healed rather than forked: a drift inside the
    latest response is realigned only when the new turn's output is shorter than this, and
    a rewritten replay merged only when the replayed response is (0 disables both). ``reward_split="full"`` gives every
    sample of a trajectory its reward; ``"divide"`` gives each of its K samples
    reward / K. All methods are thread-safe.
    """

    fork_threshold_tokens: int = attrs.field(default=1024)
    reward_split: str = attrs.field(default="full")
    _sessions: dict[Any, SessionTree] = attrs.field(init=False, factory=dict, repr=False)
    _lock: threading.Lock = attrs.field(init=False, factory=threading.Lock, repr=False)

    @fork_threshold_tokens.validator
    def _check_threshold(self, attribute: attrs.Attribute, value: Any) -> None:
        _check_nonnegative_int(value, "fork_threshold_tokens")

    @reward_split.validator
    def _check_split(self, attribute: attrs.Attribute, value: Any) -> None:
        if value not in REWARD_SPLITS:
            raise ValueError(f"reward_split must be one of {REWARD_SPLITS}, got {value!r}")

    def has_session(self, sid: Any) -> bool:
        """Whether the manager holds turns for ``sid``."""
        with self._lock:
            return sid in self._sessions

    def turn_count(self, sid: Any) -> int:
        """How many turns have been recorded for ``sid`` (0 if unknown)."""
        with self._lock:
            session = self._sessions.get(sid)
            return session.turn_count if session is not None else 0

    def session_stats(self, sid: Any) -> SessionStats | None:
        """Turns, leaves, sampled tokens and bytes held for ``sid``; None if unknown."""
        with self._lock:
            session = self._sessions.get(sid)
            if session is None:
                return None
            return SessionStats(
                turns=session.turn_count,
                leaves=session.leaves,
                sampled_tokens=session.sampled_tokens,
                last_prompt_tokens=session.last_prompt_tokens,
                held_bytes=session.held_bytes,
            )

    def record_turn(
        self,
        sid: Any,
        turn: TurnRecord,
        *,
        prompt_messages: Sequence[Mapping[str, Any]],
        response_message: Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> int | None:
        """Record one engine call for ``sid`` and return its 1-based turn index.

        ``prompt_messages`` are the chat messages the prompt was rendered from and
        ``response_message`` the assistant message the client will replay (None when
        there is none); they route the turn into the session's tree. ``metadata`` is kept
        with the turn and reported in the ``turn_metadata`` of every sample holding it.
        An empty ``prompt_messages`` is ignored with a warning (returns None).

        Each message is keyed by its content once: a message the session's previous turn
        recorded (in its prompt or as its response), passed again as the same object or
        as an equal copy at the same position, keeps the key it got then; pass a copy of a
        message you change in place rather than the object.
        """
        where = f"record_turn(session {sid!r}, turn {self.turn_count(sid) + 1})"
        if not prompt_messages:
            logger.warning("%s: empty prompt_messages; the turn is not recorded", where)
            return None
        if not isinstance(turn, TurnRecord):
            raise ValueError(f"{where}: turn must be a TurnRecord, got {type(turn).__name__}")
        prompt = to_id_array(turn.prompt_ids, f"{where}: prompt_ids")
        if not prompt:
            raise ValueError(f"{where}: prompt_ids is empty; record the ids the engine was sent")
        output = to_id_array(turn.output_ids, f"{where}: output_ids")
        logprobs = None
        if turn.output_logprobs:
            logprobs = to_logprob_array(turn.output_logprobs, f"{where}: output_logprobs")
            if len(logprobs) != len(output):
                raise ValueError(
                    f"{where}: output_logprobs has {len(logprobs)} entries but output_ids has "
                    f"{len(output)}; pass exactly one log-prob per sampled token (or none)"
                )
        roles = []
        for position, message in enumerate(prompt_messages):
            # ``type() is dict`` first: the ABC check costs more than the rest of the loop.
            if type(message) is not dict and not isinstance(message, Mapping):
                raise ValueError(
                    f"{where}: prompt_messages[{position}] must be a dict, "
                    f"got {type(message).__name__}"
                )
            roles.append(message.get("role"))
        if response_message is not None and not isinstance(response_message, Mapping):
            raise ValueError(
                f"{where}: response_message must be a dict or None, "
                f"got {type(response_message).__name__}"
            )
        with self._lock:
            session = self._sessions.get(sid)
            if session is None:
                session = self._sessions[sid] = SessionTree(sid)
            if logprobs is None and output and not session.warned_logprobs:
                session.warned_logprobs = True
                logger.warning(
                    "%s: no output_logprobs; such turns train with 0.0 log-probs "
                    "(ask the engine for log-probs, e.g. SGLang return_logprob=true)",
                    where,
                )
            keys, response_key = session.keys.digests(prompt_messages, response_message)
            return session.record(
                keys=keys,
                roles=roles,
                prompt=prompt,
                output=output,
                logprobs=logprobs,
                finish_reason=str(turn.finish_reason),
                ill_formed=bool(turn.ill_formed),
                response_key=response_key,
                use_tool=has_tool_calls(response_message),
                metadata=dict(metadata) if metadata else None,
                fork_threshold=self.fork_threshold_tokens,
            )

    def get_trajectory(
        self,
        sid: Any,
        reward: float,
        metadata: Mapping[str, Any] | None = None,
        max_sample_tokens: int = 0,
    ) -> list[TrainingSample]:
        """Linearise and consume ``sid``: a later call returns ``[]``.

        ``metadata`` is copied into every sample (the manager's own keys win on a clash).
        ``max_sample_tokens`` (0: no limit) keeps each sample's first tokens; a sample
        left without a trained response is dropped.
        """
        _check_nonnegative_int(max_sample_tokens, "max_sample_tokens")
        try:
            reward = float(reward)
        except (TypeError, ValueError):
            raise ValueError(f"reward must be a number, got {reward!r}") from None
        with self._lock:
            session = self._sessions.pop(sid, None)
        if session is None:
            return []
        parts = linearize(
            session.chains(),
            session.store,
            fork_threshold=self.fork_threshold_tokens,
            max_sample_tokens=max_sample_tokens,
            sid=sid,
        )
        session.store.clear()
        share = reward / len(parts) if parts and self.reward_split == "divide" else reward
        extra = dict(metadata or {})
        samples = []
        for part in parts:
            part.metadata["num_samples"] = len(parts)
            samples.append(
                TrainingSample(
                    tokens=part.tokens,
                    prompt_length=part.prompt_length,
                    response_length=len(part.tokens) - part.prompt_length,
                    loss_mask=part.loss_mask,
                    rollout_logprobs=part.logprobs,
                    reward=share,
                    metadata={**extra, **part.metadata},
                )
            )
        logger.debug("session %r: %d turns -> %d samples", sid, session.turn_count, len(samples))
        return samples

    def drop_session(self, sid: Any) -> None:
        """Forget ``sid`` without producing samples; unknown ids are ignored."""
        with self._lock:
            self._sessions.pop(sid, None)
