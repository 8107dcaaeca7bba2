"""Middleware sessions: the token a client authenticates with, and everything per session.

A session owns its sampling policy, context budget and turn cap, a lock that keeps its
turns from interleaving, the wire ids minted for it (so replays can be traced to their
turn), the facts of every turn it recorded (:class:`~agentrl.types.TurnFact`, read by the
rollout that owns the session), and its prompt-building state
(:class:`~agentrl.prompts.builders.PromptState`: one incremental renderer per conversation
chain, the splice ledger).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import attrs

from agentrl.adapters.base import ProtocolError
from agentrl.prompts.builders import PromptState
from agentrl.prompts.keys import exact_key, loose_key, same_exact_key, stripped
from agentrl.types import TurnFact

__all__ = [
    "CLOSED_TOKENS_KEPT",
    "SAMPLING_POLICIES",
    "Session",
    "SessionTable",
    "exact_key",
    "loose_key",
    "new_token",
]

logger = logging.getLogger(__name__)

#: ``trainer``: the session's sampling parameters win and the client's temperature /
#: top_p / top_k are ignored (they would skew the log-prob ratios the trainer computes).
#: ``client``: the client's values override the session's.
SAMPLING_POLICIES = ("trainer", "client")
#: Closed sessions whose token still gets "session is closed" (older ones: unknown key),
#: so a long-running middleware does not keep every token it ever issued.
CLOSED_TOKENS_KEPT = 65_536


def new_token() -> str:
    """An unguessable session token (192 random bits)."""
    return "agentrl-" + secrets.token_urlsafe(24)


@attrs.define(eq=False)
class Session:
    """One agent run's state inside the middleware."""

    sid: str
    token: str
    sampling_defaults: dict[str, Any] = attrs.field(factory=dict)
    max_context_tokens: int = 0
    max_turns: int | None = None
    sampling_policy: str = "trainer"
    lock: asyncio.Lock = attrs.field(factory=asyncio.Lock)
    closed: bool = False
    #: turns started and not rolled back: a turn the client's request made fail (a 4xx,
    #: the client going away) is rolled back, so ``turns_started - turns_recorded`` counts
    #: only turns the engine or the middleware failed.
    turns_started: int = 0
    turns_recorded: int = 0
    #: turns that failed because the engine aborted their generation ``max_engine_aborts``
    #: times in a row (an engine being drained; slime's rollout loop stops on it).
    aborted_turns: int = 0
    #: the index the next turn gets (never reused, even when a turn is rolled back).
    next_index: int = 0
    #: ``count_tokens`` calls answered or refused (bounded by
    #: :func:`~agentrl.serve.limits.count_tokens_allowance`).
    count_calls: int = 0
    #: every recorded turn's sizes and finish reason, in order; the list outlives the
    #: session (whoever holds the session reads it after finish or drop).
    turn_facts: list[TurnFact] = attrs.field(factory=list)
    minted: dict[str, int] = attrs.field(factory=dict)
    #: turn index -> the assistant message recorded for it (what the policy really said).
    responses: dict[int, dict[str, Any]] = attrs.field(factory=dict)
    #: recorded messages by :func:`loose_key` (as a client may replay them) -> those turns.
    _by_loose_key: dict[str, set[int]] = attrs.field(factory=dict)
    #: turn index -> :func:`exact_key` of its recorded message (computed once, not per replay).
    _exact_keys: dict[int, str] = attrs.field(factory=dict)
    inflight: set[asyncio.Task] = attrs.field(factory=set)
    #: how this session's prompts are built: its rendering chains, its splice ledger.
    prompts: PromptState = attrs.field(factory=PromptState)

    def remember(self, wire_id: str, turn_index: int) -> str:
        self.minted[wire_id] = turn_index
        return wire_id

    def record_response(self, turn_index: int, message: dict[str, Any]) -> None:
        """Keep turn ``turn_index``'s recorded assistant message for restoring replays."""
        self.responses[turn_index] = message
        self._exact_keys[turn_index] = exact_key(message)
        self._by_loose_key.setdefault(loose_key(message), set()).add(turn_index)

    def _replayed_turn(self, message: Mapping[str, Any]) -> int | None:
        """The one turn whose recorded message ``message`` is, up to whitespace and key order.

        ``message`` may lack the recorded reasoning (the client never saw it, or dropped it);
        reasoning it does carry must match. None when no turn, or turns recorded differently,
        match.
        """
        if message.get("role") != "assistant":
            return None
        # A copy: ``count_tokens`` may read this in the render pool while a turn records.
        turns = set(self._by_loose_key.get(loose_key(message), ()))
        if not turns:
            return None
        reasoning = stripped(message.get("reasoning_content"))
        if reasoning:
            turns = {
                t
                for t in turns
                if stripped(self.responses[t].get("reasoning_content")) == reasoning
            }
        recorded = {self._exact_keys[t] for t in turns}
        return min(turns) if len(recorded) == 1 else None

    def restore_replays(
        self, messages: Sequence[dict[str, Any]], replayed: Sequence[tuple[int, str]]
    ) -> tuple[list[dict[str, Any]], list[int]]:
        """``messages`` with each replayed assistant message put back as it was recorded.

        Clients rewrite what they replay (Claude Code adds default tool inputs such as
        ``replace_all``, trims a leading ``cd <cwd> &&`` from commands and puts tool inputs
        in schema order; every client gets the text trimmed). The policy's context should
        hold what it really produced, so a message whose replayed wire ids all name one of
        this session's turns is replaced by that turn's recorded message. A message with no
        such id that reads like one turn's recorded message up to whitespace, key order and
        reasoning the client never saw is restored too. Messages are compared key order
        included (the template renders keys in the order given). Returns the messages and
        the indices that were restored.
        """
        turns_at: dict[int, set[int]] = {}
        for index, wire_id in replayed:
            turn = self.minted.get(wire_id)
            if turn is not None:
                turns_at.setdefault(index, set()).add(turn)
        if self._by_loose_key:
            for index, message in enumerate(messages):
                if index not in turns_at:
                    turn = self._replayed_turn(message)
                    if turn is not None:
                        turns_at[index] = {turn}
        restored = list(messages)
        changed = []
        for index, turns in sorted(turns_at.items()):
            if len(turns) != 1 or restored[index].get("role") != "assistant":
                continue
            turn = next(iter(turns))
            recorded = self.responses.get(turn)
            if recorded is None or same_exact_key(restored[index], recorded):
                continue
            if exact_key(restored[index]) != self._exact_keys[turn]:
                restored[index] = recorded
                changed.append(index)
        return restored, changed

    def links(self, replayed: Sequence[tuple[int, str]]) -> dict[str, int]:
        """``{message index: turn}`` for every replayed id this session minted."""
        found: dict[str, int] = {}
        for index, wire_id in replayed:
            turn = self.minted.get(wire_id)
            if turn is not None:
                found.setdefault(str(index), turn)
        return found


class SessionTable:
    """The open sessions, by id and by token, and the latest closed tokens (for a clear 403).

    Iterating it, ``in`` and ``len`` see the open session ids.
    """

    def __init__(self) -> None:
        self._by_sid: dict[str, Session] = {}
        self._by_token: dict[str, Session] = {}
        self._closed_tokens: dict[str, str] = {}

    def __contains__(self, sid: object) -> bool:
        return sid in self._by_sid

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_sid)

    def __len__(self) -> int:
        return len(self._by_sid)

    def add(self, session: Session) -> None:
        if session.sid in self._by_sid:
            raise ValueError(f"session {session.sid!r} is already open; session ids must be unique")
        self._by_sid[session.sid] = session
        self._by_token[session.token] = session

    def get(self, sid: str) -> Session:
        try:
            return self._by_sid[sid]
        except KeyError:
            raise KeyError(f"no open session {sid!r}; open it with open_session()") from None

    def close(self, sid: str) -> Session | None:
        """Mark ``sid`` closed and stop accepting its token; None when it is not open."""
        session = self._by_sid.pop(sid, None)
        if session is not None:
            session.closed = True
            self._by_token.pop(session.token, None)
            self._closed_tokens[session.token] = sid
            if len(self._closed_tokens) > CLOSED_TOKENS_KEPT:
                del self._closed_tokens[next(iter(self._closed_tokens))]
        return session

    def authenticate(self, headers: Mapping[str, str]) -> Session:
        """The open session whose token the client sent (Bearer or x-api-key); 401 / 403."""
        candidates = []
        auth = headers.get("Authorization", "")
        if auth[:7].lower() == "bearer ":
            candidates.append(auth[7:].strip())
        if headers.get("x-api-key"):
            candidates.append(headers["x-api-key"].strip())
        for token in candidates:
            session = self._by_token.get(token)
            if session is not None:
                return session
        for token in candidates:
            if token in self._closed_tokens:
                raise ProtocolError(
                    403,
                    f"session {self._closed_tokens[token]!r} is closed: its trajectory was "
                    "finished or dropped; open a new session for another run",
                )
        if not candidates:
            raise ProtocolError(
                401,
                "no API key: send the session token from open_session() as "
                "'Authorization: Bearer <token>' or 'x-api-key: <token>'",
            )
        raise ProtocolError(401, "unknown API key: it is not the token of any open agentrl session")
