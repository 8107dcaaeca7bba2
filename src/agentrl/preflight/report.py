"""What a preflight run measured, per turn and per session, and how it is worked out.

Per turn: the drift class (read from the training samples' metadata: which sample holds
the turn, whether its prompt realigned the previous response or forked a new sample),
tokens trained vs sampled, whether the client got the tool calls the model wrote, and
whether the turn's thinking is still in the next prompt of its conversation. Per session:
the yield (trained / sampled), the number of samples, and the tokens of all samples
against the session's final context (a fork per turn makes the first ×N the second).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from agentrl.preflight.clients import Reply
from agentrl.preflight.engine import EngineCall
from agentrl.preflight.scenarios import ModelTurn

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from agentrl.trajectory import TrainingSample

__all__ = ["DrivenTurn", "SessionReport", "TurnReport", "analyse"]

#: Drift classes a turn can get: the first turn of a conversation, a prompt that extends
#: the held tokens, one that overwrote the previous response (untrained), one that started
#: a new sample, and a turn no sample holds.
DRIFT_CLASSES = ("start", "clean", "realign", "fork", "merged", "dropped")


@attrs.frozen(kw_only=True)
class DrivenTurn:
    """One request the scripted client sent: its middleware turn, conversation and reply."""

    index: int
    conversation: int
    agent: str
    model_turn: ModelTurn
    #: The client's names for the tools the model called, in order.
    expected_calls: tuple[tuple[str, dict[str, Any]], ...]
    reply: Reply


@attrs.frozen(kw_only=True)
class TurnReport:
    """One turn's numbers."""

    turn: int
    agent: str
    drift: str
    sampled: int
    trained: int
    finish: str
    tool_calls: str
    thinking_kept: str
    prompt_mode: str
    fallback: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready form."""
        return attrs.asdict(self)


@attrs.frozen(kw_only=True)
class SessionReport:
    """One scenario run in one prompt mode over one protocol."""

    scenario: str
    description: str
    protocol: str
    mode: str
    turns: tuple[TurnReport, ...]
    sampled: int
    trained: int
    samples: int
    sample_tokens: int
    final_context_tokens: int

    @property
    def token_yield(self) -> float:
        """Trained / sampled tokens (1.0 when nothing was sampled)."""
        return self.trained / self.sampled if self.sampled else 1.0

    @property
    def token_ratio(self) -> float:
        """All samples' tokens / the final context of every conversation (1.0 is ideal)."""
        return self.sample_tokens / self.final_context_tokens if self.final_context_tokens else 0.0

    @property
    def fallbacks(self) -> int:
        """Turns whose splice fell back to a full render (a chain's first turn, which has
        nothing to extend, is not one)."""
        return sum(1 for t in self.turns if t.fallback and t.fallback != "new_chain")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready form, with the derived figures."""
        data = attrs.asdict(self)
        data["turns"] = [t.to_dict() for t in self.turns]
        data["yield"] = self.token_yield
        data["token_ratio"] = self.token_ratio
        data["fallbacks"] = self.fallbacks
        return data


def _tool_call_status(turn: DrivenTurn) -> str:
    expected = turn.expected_calls
    parsed = [(c.name, c.arguments) for c in turn.reply.calls]
    if not expected and not parsed:
        return "-"
    matched = sum(1 for want, got in zip(expected, parsed, strict=False) if want == got)
    if matched == len(expected) == len(parsed):
        return f"ok {matched}"
    return f"failed {matched}/{len(expected)} ({len(parsed)} parsed)"


def _drift(
    traj_index: int | None,
    conversation_start: bool,
    holders: Mapping[int, list[tuple[TrainingSample, int]]],
    merged: set[int],
) -> str:
    if traj_index is None:
        return "dropped"
    entries = holders.get(traj_index)
    if not entries:
        return "merged" if traj_index in merged else "dropped"
    sample, position = next(
        ((s, p) for s, p in entries if traj_index in s.metadata["trained_turns"]), entries[0]
    )
    if position == 0:
        return "start" if conversation_start else "fork"
    previous = sample.metadata["turns"][position - 1]
    return "realign" if previous in sample.metadata["realigned_turns"] else "clean"


def _thinking_kept(
    turn: DrivenTurn,
    following: DrivenTurn | None,
    calls: Mapping[int, EngineCall],
    tokenizer: PreTrainedTokenizerBase,
) -> str:
    reasoning = turn.model_turn.reasoning
    if not reasoning:
        return "-"
    if following is None or following.index not in calls:
        return "end"
    prompt = tokenizer.decode(list(calls[following.index].input_ids), skip_special_tokens=False)
    return "yes" if reasoning.strip() in prompt else "no"


def analyse(
    *,
    scenario: str,
    description: str,
    protocol: str,
    mode: str,
    driven: Sequence[DrivenTurn],
    calls: Mapping[int, EngineCall],
    recorded: Mapping[int, tuple[int, dict[str, Any]]],
    samples: Sequence[TrainingSample],
    tokenizer: PreTrainedTokenizerBase,
) -> SessionReport:
    """Work out one session's report.

    ``calls`` maps a middleware turn to its engine call, ``recorded`` to its trajectory
    turn index and metadata; ``samples`` are the session's training samples.
    """
    holders: dict[int, list[tuple[TrainingSample, int]]] = {}
    merged: set[int] = set()
    trained_turns: set[int] = set()
    for sample in samples:
        for position, index in enumerate(sample.metadata["turns"]):
            holders.setdefault(index, []).append((sample, position))
        merged.update(sample.metadata.get("merged_turns", ()))
        trained_turns.update(sample.metadata["trained_turns"])
    reports = []
    seen_conversations: set[int] = set()
    last_of: dict[int, DrivenTurn] = {}
    for position, turn in enumerate(driven):
        call = calls.get(turn.index)
        traj_index, metadata = recorded.get(turn.index, (None, {}))
        sampled = len(call.output_ids) if call is not None else 0
        following = next(
            (t for t in driven[position + 1 :] if t.conversation == turn.conversation), None
        )
        reports.append(
            TurnReport(
                turn=turn.index,
                agent=turn.agent,
                drift=_drift(
                    traj_index, turn.conversation not in seen_conversations, holders, merged
                ),
                sampled=sampled,
                trained=sampled if traj_index in trained_turns else 0,
                finish=call.finish_reason if call is not None else "-",
                tool_calls=_tool_call_status(turn),
                thinking_kept=_thinking_kept(turn, following, calls, tokenizer),
                prompt_mode=str(metadata.get("prompt_mode", mode)),
                fallback=metadata.get("splice_fallback"),
            )
        )
        seen_conversations.add(turn.conversation)
        last_of[turn.conversation] = turn
    final_context = 0
    for turn in last_of.values():
        call = calls.get(turn.index)
        if call is not None:
            final_context += len(call.input_ids) + len(call.output_ids)
    return SessionReport(
        scenario=scenario,
        description=description,
        protocol=protocol,
        mode=mode,
        turns=tuple(reports),
        sampled=sum(len(c.output_ids) for c in calls.values()),
        trained=sum(s.trained_token_count for s in samples),
        samples=len(samples),
        sample_tokens=sum(len(s.tokens) for s in samples),
        final_context_tokens=final_context,
    )
