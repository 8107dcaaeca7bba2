"""Linearisation of a session tree into sample parts, for :mod:`agentrl.trajectory`.

Each root-to-leaf chain is packed turn by turn into a builder whose tokens always equal
the full sequence (prompt + output) of the last turn it absorbed. How the next turn's
prompt relates to those tokens decides what happens (see :class:`DriftKind`).
"""

from __future__ import annotations

import enum
import logging
from array import array
from collections.abc import Iterable
from typing import Any

from agentrl.trajectory.tokens import (
    TokenStore,
    TurnTokens,
    common_prefix_length,
    zero_logprobs,
)
from agentrl.trajectory.tree import ChainEntry

__all__ = ["DriftKind", "SampleParts", "linearize"]

logger = logging.getLogger("agentrl.trajectory")


class DriftKind(str, enum.Enum):
    """How a turn's prompt relates to the tokens already held for its sample."""

    CLEAN = "clean"  # the prompt extends the held tokens exactly: append its tail
    REALIGN = "realign"  # short drift inside the latest response: overwrite it, untrained
    FORK = "fork"  # anything else: close the sample, start a new one from this prompt


class SampleParts:
    """What one sample holds before the reward is known."""

    __slots__ = ("logprobs", "loss_mask", "metadata", "prompt_length", "tokens")

    def __init__(
        self,
        tokens: tuple[int, ...],
        prompt_length: int,
        loss_mask: tuple[int, ...],
        logprobs: tuple[float, ...],
        metadata: dict[str, Any],
    ) -> None:
        self.tokens = tokens
        self.prompt_length = prompt_length
        self.loss_mask = loss_mask
        self.logprobs = logprobs
        self.metadata = metadata


class _Builder:
    """Tokens of one sample in the making; ``tokens`` is the last turn's whole sequence."""

    __slots__ = (
        "last_start",
        "last_turn",
        "logprobs",
        "mask",
        "merged",
        "prompt_length",
        "realigned",
        "spans",
        "tokens",
    )

    def __init__(self, prompt: array, turn: TurnTokens, trained: bool) -> None:
        self.tokens = prompt
        self.prompt_length = len(prompt)
        # Mask and log-probs cover the response region only (everything after the prompt).
        self.mask = bytearray()
        self.logprobs = array("d")
        self.spans: list[list[Any]] = []  # [turn, start offset, trained]
        self.realigned: list[int] = []
        self.merged: list[int] = []
        self.last_start = 0
        self.last_turn = turn
        self._add_output(turn, trained)

    def _add_output(self, turn: TurnTokens, trained: bool) -> None:
        count = len(turn.output)
        self.last_start = len(self.tokens)
        self.last_turn = turn
        self.tokens.extend(turn.output)
        if trained:
            self.mask.extend(b"\x01" * count)
            self.logprobs.extend(turn.output_logprobs())
        else:
            self.mask.extend(bytes(count))
            self.logprobs.extend(zero_logprobs(count))
        self.spans.append([turn, self.last_start, trained and count > 0])

    def extend(self, turn: TurnTokens, tail: array, trained: bool) -> None:
        """CLEAN: append the prompt's new tail as context, then the output."""
        self.tokens.extend(tail)
        self.mask.extend(bytes(len(tail)))
        self.logprobs.extend(zero_logprobs(len(tail)))
        self._add_output(turn, trained)

    def realign(self, turn: TurnTokens, shared: int, tail: array, trained: bool) -> None:
        """REALIGN: keep the prompt's view of the latest response, untrained."""
        start = self.last_start - self.prompt_length
        cut = shared - self.prompt_length
        del self.tokens[shared:]
        del self.mask[cut:]
        del self.logprobs[cut:]
        self.mask[start:cut] = bytes(cut - start)
        self.logprobs[start:cut] = zero_logprobs(cut - start)
        self.spans[-1][2] = False
        self.realigned.append(self.spans[-1][0].index)
        self.extend(turn, tail, trained)

    def emit(self, max_tokens: int, leaf: int, segment: int) -> SampleParts | None:
        """Freeze into sample parts, cut to ``max_tokens``; None when nothing trains."""
        end = len(self.tokens)
        if max_tokens and end > max_tokens:
            end = max_tokens
        response_length = end - self.prompt_length
        if response_length <= 0:
            logger.debug(
                "dropping a sample of leaf %d: max_sample_tokens=%d leaves no response after "
                "its %d-token prompt",
                leaf,
                max_tokens,
                self.prompt_length,
            )
            return None
        mask = self.mask[:response_length]
        if 1 not in mask:
            return None
        # A turn belongs to the sample if part of its output survives the cut (an empty
        # output counts when nothing was cut).
        kept = [span for span in self.spans if span[1] < end or span[1] == end == len(self.tokens)]
        trained = [span[0] for span in kept if span[2]]
        last_trained = trained[-1]
        metadata: dict[str, Any] = {
            "truncated": end < len(self.tokens) or last_trained.finish_reason == "length",
            "use_tool": any(span[0].use_tool for span in kept),
            "ill_formed": any(span[0].ill_formed for span in kept),
            "missing_logprobs": any(turn.logprobs is None for turn in trained),
            "leaf": leaf,
            "segment": segment,
            "turns": tuple(span[0].index for span in kept),
            "trained_turns": tuple(turn.index for turn in trained),
            "realigned_turns": tuple(self.realigned),
            "merged_turns": tuple(self.merged),
            "tokens_cut": len(self.tokens) - end,
            "turn_metadata": {
                span[0].index: dict(span[0].metadata) for span in kept if span[0].metadata
            },
        }
        loss_mask, logprobs = _response_tuples(mask, self.logprobs)
        tokens = self.tokens if end == len(self.tokens) else self.tokens[:end]
        return SampleParts(
            tokens=tuple(tokens),
            prompt_length=self.prompt_length,
            loss_mask=loss_mask,
            logprobs=logprobs,
            metadata=metadata,
        )


def _response_tuples(mask: bytearray, logprobs: array) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The loss mask and the log-probs of a response region as tuples, run by run.

    An untrained position always holds log-prob 0.0 (:class:`_Builder` writes
    :func:`zero_logprobs` there), so an untrained run refers to one ``0.0`` object instead
    of a new float per position, and only trained log-probs become Python floats: a
    128k-token sample with 4k trained tokens makes 4k floats, not 128k.
    """
    mask_out: list[int] = []
    logprobs_out: list[float] = []
    size = len(mask)
    start = 0
    while start < size:
        trained = mask.find(1, start)
        if trained < 0:
            trained = size
        if trained > start:
            mask_out += [0] * (trained - start)
            logprobs_out += [0.0] * (trained - start)
        if trained == size:
            break
        start = mask.find(0, trained)
        if start < 0:
            start = size
        mask_out += [1] * (start - trained)
        logprobs_out += logprobs[trained:start].tolist()
    return tuple(mask_out), tuple(logprobs_out)


def _classify(builder: _Builder, turn: TurnTokens, shared: int, fork_threshold: int) -> DriftKind:
    if shared == len(builder.tokens):
        return DriftKind.CLEAN
    if shared >= builder.last_start and len(turn.output) < fork_threshold:
        return DriftKind.REALIGN
    return DriftKind.FORK


def linearize(
    chains: Iterable[list[ChainEntry]],
    store: TokenStore,
    *,
    fork_threshold: int,
    max_sample_tokens: int,
    sid: Any = None,
) -> list[SampleParts]:
    """Turn every root-to-leaf chain into sample parts, training each response at most once.

    A response is claimed by the first emitted sample that trains at least one of its
    tokens; later chains through the same turn carry it with loss mask 0.
    """
    claimed: set[int] = set()
    parts: list[SampleParts] = []

    def close(builder: _Builder, leaf: int, segment: int) -> int:
        emitted = builder.emit(max_sample_tokens, leaf, segment)
        if emitted is None:
            return segment
        claimed.update(emitted.metadata["trained_turns"])
        parts.append(emitted)
        return segment + 1

    for chain in chains:
        generated = [turn for turn, trains in chain if trains]
        if not generated:
            continue
        leaf = generated[-1].index
        builder: _Builder | None = None
        segment = 0
        merged: list[int] = []
        for turn, trains in chain:
            if not trains:
                merged.append(turn.index)
                continue
            trained = turn.index not in claimed
            if builder is None:
                builder = _Builder(store.prompt(turn), turn, trained)
            else:
                if turn.base is builder.last_turn:
                    shared, tail = turn.shared, turn.prompt_tail
                else:
                    prompt = store.prompt(turn)
                    shared = common_prefix_length(builder.tokens, prompt)
                    tail = prompt[shared:]
                kind = _classify(builder, turn, shared, fork_threshold)
                if kind is DriftKind.CLEAN:
                    builder.extend(turn, tail, trained)
                elif kind is DriftKind.REALIGN:
                    logger.debug(
                        "session %r turn %d: realigned %d drifted tokens of turn %d",
                        sid,
                        turn.index,
                        len(builder.tokens) - shared,
                        builder.last_turn.index,
                    )
                    builder.realign(turn, shared, tail, trained)
                else:
                    logger.debug(
                        "session %r turn %d: prompt diverges from held tokens at %d of %d; "
                        "starting a new sample",
                        sid,
                        turn.index,
                        shared,
                        len(builder.tokens),
                    )
                    segment = close(builder, leaf, segment)
                    prompt = builder.tokens  # reused: the closed builder was copied out
                    del prompt[shared:]
                    prompt.extend(tail)
                    builder = _Builder(prompt, turn, turn.index not in claimed)
            builder.merged.extend(merged)
            merged.clear()
        if builder is not None:
            close(builder, leaf, segment)
    return parts
