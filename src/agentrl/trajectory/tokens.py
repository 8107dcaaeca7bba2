"""Compact token storage for :mod:`agentrl.trajectory`.

A turn's prompt almost always starts with everything an earlier turn already held (its
prompt and its output). Each :class:`TurnTokens` therefore stores only what its prompt
adds beyond a *base* turn, as unsigned 32-bit arrays; the full sequence of a turn is rebuilt on
demand by :class:`TokenStore`, which keeps one sequence materialised per chain (the latest
turn of each, a few chains at most) so that rebuilding stays linear in the session length.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "TokenStore",
    "TurnTokens",
    "common_prefix_length",
    "to_id_array",
    "to_logprob_array",
    "zero_logprobs",
]

# Arrays are compared in chunks of this many items before bisecting inside the first
# chunk that differs: slices compare in C, so a long shared prefix costs a few calls.
_CHUNK = 8192


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Return how many leading items ``a`` and ``b`` share."""
    limit = min(len(a), len(b))
    lo = 0
    while lo < limit:
        hi = min(lo + _CHUNK, limit)
        if a[lo:hi] == b[lo:hi]:
            lo = hi
            continue
        # The first mismatch lies in [lo, hi): bisect on slice equality.
        while hi - lo > 16:
            mid = (lo + hi) // 2
            if a[lo:mid] == b[lo:mid]:
                lo = mid
            else:
                hi = mid
        while lo < hi and a[lo] == b[lo]:
            lo += 1
        return lo
    return limit


def to_id_array(values: Iterable[Any], what: str) -> array:
    """Convert token ids to an unsigned 32-bit array; raise ``ValueError`` saying what was wrong.

    The unsigned type makes the conversion itself reject negative ids, in C.
    """
    if isinstance(values, (str, bytes)):
        raise ValueError(f"{what} must be a sequence of token ids, got {type(values).__name__}")
    try:
        return array("I", values)
    except TypeError as exc:
        raise ValueError(f"{what} must hold only integer token ids ({exc})") from None
    except OverflowError:
        pass
    for position, value in enumerate(values):
        if value < 0:
            raise ValueError(f"{what} holds a negative id {value} at position {position}")
        if value >= 2**32:
            raise ValueError(
                f"{what} holds id {value} at position {position}, which does not fit in 32 bits"
            )
    raise ValueError(f"{what} holds an id outside the 32-bit range")  # pragma: no cover


def to_logprob_array(values: Iterable[Any], what: str) -> array:
    """Convert log-probs to a float64 array; raise ``ValueError`` saying what was wrong."""
    try:
        return array("d", values)
    except TypeError as exc:
        raise ValueError(f"{what} must hold only numbers ({exc})") from None


def zero_logprobs(count: int) -> array:
    """``count`` log-probs of 0.0, as a float64 array (for untrained positions)."""
    return array("d", bytes(8 * count))


class TurnTokens:
    """The token ids of one generated turn, stored relative to a base turn.

    ``prompt = sequence(base)[:shared] + prompt_tail`` and
    ``sequence(self) = prompt + output``; a turn without a base stores its whole prompt.
    """

    __slots__ = (
        "base",
        "finish_reason",
        "ill_formed",
        "index",
        "logprobs",
        "metadata",
        "output",
        "prompt_length",
        "prompt_tail",
        "shared",
        "use_tool",
    )

    def __init__(
        self,
        *,
        index: int,
        base: TurnTokens | None,
        shared: int,
        prompt_tail: array,
        output: array,
        logprobs: array | None,
        finish_reason: str,
        ill_formed: bool,
        use_tool: bool,
        metadata: dict[str, Any] | None,
    ) -> None:
        self.index = index
        self.base = base
        self.shared = shared
        self.prompt_tail = prompt_tail
        self.output = output
        self.logprobs = logprobs
        self.finish_reason = finish_reason
        self.ill_formed = ill_formed
        self.use_tool = use_tool
        self.metadata = metadata
        self.prompt_length = shared + len(prompt_tail)

    @property
    def sequence_length(self) -> int:
        return self.prompt_length + len(self.output)

    @property
    def held_bytes(self) -> int:
        """Bytes held by this turn's arrays (buffers only)."""
        total = self.prompt_tail.itemsize * len(self.prompt_tail)
        total += self.output.itemsize * len(self.output)
        if self.logprobs is not None:
            total += self.logprobs.itemsize * len(self.logprobs)
        return total

    def output_logprobs(self) -> array:
        """The output's log-probs, 0.0 for each token when the engine sent none."""
        if self.logprobs is not None:
            return self.logprobs
        return zero_logprobs(len(self.output))


class TokenStore:
    """Rebuilds full turn sequences, caching one per chain (``capacity`` chains at most).

    A recorded turn's sequence supersedes that of the turn it continues in its chain (the
    session tree says which), so a linear session holds one sequence and a session with
    sub-agents one per branch in use; beyond ``capacity`` the least recently used goes.
    """

    __slots__ = ("_cache", "_capacity")

    def __init__(self, capacity: int = 4) -> None:
        self._capacity = capacity
        self._cache: dict[int, tuple[TurnTokens, array]] = {}

    @property
    def held_bytes(self) -> int:
        return sum(seq.itemsize * len(seq) for _, seq in self._cache.values())

    @property
    def cached_turns(self) -> list[int]:
        """The indices of the turns whose sequences are held, least recently used first."""
        return [turn.index for turn, _ in self._cache.values()]

    def remember(
        self, turn: TurnTokens, sequence: array, supersedes: TurnTokens | None = None
    ) -> None:
        """Keep ``sequence`` (owned by the store from now on) as ``turn``'s sequence.

        ``supersedes``, the turn ``turn`` continues in its chain, loses its cached sequence.
        """
        cache = self._cache
        cache.pop(id(turn), None)
        if supersedes is not None:
            cache.pop(id(supersedes), None)
        cache[id(turn)] = (turn, sequence)
        while len(cache) > self._capacity:
            del cache[next(iter(cache))]

    def sequence(self, turn: TurnTokens) -> array:
        """Return ``turn``'s full sequence; the caller must not modify it."""
        hit = self._cache.get(id(turn))
        if hit is not None:
            self._cache[id(turn)] = self._cache.pop(id(turn))  # most recently used last
            return hit[1]
        sequence = self.rebuild(turn)
        self.remember(turn, sequence)
        return sequence

    def prompt(self, turn: TurnTokens) -> array:
        """Return a fresh copy of ``turn``'s prompt."""
        if turn.base is None:
            return array("I", turn.prompt_tail)
        prompt = array("I", self.sequence(turn.base)[: turn.shared])
        prompt.extend(turn.prompt_tail)
        return prompt

    def rebuild(self, turn: TurnTokens) -> array:
        """Rebuild ``turn``'s sequence from the nearest cached ancestor, in one array."""
        path: list[TurnTokens] = []
        node: TurnTokens | None = turn
        start: array | None = None
        while node is not None:
            hit = self._cache.get(id(node))
            if hit is not None:
                start = hit[1]
                break
            path.append(node)
            node = node.base
        sequence = array("I", start) if start is not None else array("I")
        for step in reversed(path):
            del sequence[step.shared :]
            sequence.extend(step.prompt_tail)
            sequence.extend(step.output)
        return sequence

    def clear(self) -> None:
        self._cache.clear()
