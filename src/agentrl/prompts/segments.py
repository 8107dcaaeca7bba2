"""Tokenization at added-token boundaries without offsets, into compact id arrays.

Public API::

    id_array(values=(), typecode="I") -> array      # a new compact array of token ids
    as_id_array(values) -> array                    # values itself when it is one already
    boundary_ids(tokenizer) -> frozenset[int]       # added tokens a text may be split after
    SegmentEncoder.for_tokenizer(tokenizer) -> SegmentEncoder | None
    encoder.encode(text) -> Segmented(segments, counts, ids, rest)
    encoder.ids(text) -> array                      # the ids alone

Why a split is safe: the tokenizer matches added tokens (``<|im_end|>``, ``<tool_call>``,
…) in the raw text before it normalises or pre-tokenizes, leftmost-longest. For a
*boundary* token T (see :func:`boundary_ids`) no other added token's match can start
before T's end and end after it: such a match would contain T inside its proper prefix,
start at T with T as its proper prefix, or start inside T with a suffix of T as its
proper prefix, and boundary tokens are chosen so that none of these exists. So when a
piece of text that starts at a safe split point, tokenized on its own, ends with T, the
end of that T is a safe split point of any text that continues the piece: the ids of the
whole are the ids of the pieces, concatenated.

:meth:`SegmentEncoder.encode` therefore cuts the text after every literal occurrence of
a boundary token (``str`` search, no offsets), encodes the pieces in one batch and
checks that each piece's last id is a boundary token the piece ends with. If any piece
fails the check (an earlier added token swallowed the start of the occurrence), the text
is encoded whole with offsets instead, as before. A tokenizer that treats the start of
its input specially (a prefix space added to the first word) fails a probe at
construction, and :meth:`SegmentEncoder.for_tokenizer` returns None for it.
"""

from __future__ import annotations

import logging
import re
import weakref
from array import array
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import attrs

from agentrl.prompts.ascii_bpe import AsciiBPE

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["SegmentEncoder", "Segmented", "as_id_array", "boundary_ids", "id_array"]

logger = logging.getLogger(__name__)

#: Array typecodes token ids are kept in: 4 bytes a token, 8 for a vocabulary past 2**32.
ID_TYPECODES = ("I", "Q")


def id_array(values: Iterable[int] = (), typecode: str = "I") -> array:
    """A new compact array of ``values``; 8-byte items when an id does not fit in 4."""
    try:
        return array(typecode, values)
    except OverflowError:
        return array("Q", values)


def as_id_array(values: Iterable[int]) -> array:
    """``values`` itself when it is already an id array (shared, read-only by convention)."""
    if isinstance(values, array) and values.typecode in ID_TYPECODES:
        return values
    return id_array(values)


_boundary_cache: weakref.WeakKeyDictionary[Any, frozenset[int]] = weakref.WeakKeyDictionary()


def boundary_ids(tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """Ids of added tokens after which a text can be split without changing its tokens."""
    try:
        return _boundary_cache[tokenizer]
    except (KeyError, TypeError):
        pass
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    tokens = {int(tid): tok for tid, tok in decoder.items() if str(tok)}
    # A match of another added token that starts before a split point and ends after it
    # either contains this token inside its proper prefix, or starts inside this token.
    proper_prefixes: set[str] = set()
    inner: set[str] = set()
    for tok in tokens.values():
        content = str(tok)
        for end in range(1, len(content)):
            prefix = content[:end]
            proper_prefixes.add(prefix)
            inner.update(prefix[start:] for start in range(end))
    safe = set()
    for tid, tok in tokens.items():
        content = str(tok)
        if getattr(tok, "rstrip", False) or getattr(tok, "single_word", False):
            continue
        if getattr(tok, "normalized", False) or content in inner:
            continue
        if any(content[start:] in proper_prefixes for start in range(len(content))):
            continue
        safe.add(tid)
    result = frozenset(safe)
    try:
        _boundary_cache[tokenizer] = result
    except TypeError:
        pass
    return result


@attrs.frozen
class Segmented:
    """A text cut at safe split points: ``"".join(segments) + rest`` is the text.

    ``counts[i]`` is how many of ``ids`` the first ``i + 1`` segments hold; each segment
    ends with a boundary token; ``rest`` (no boundary at its end) may be empty.
    """

    segments: list[str]
    counts: list[int]
    ids: array
    rest: str


_encoder_cache: weakref.WeakKeyDictionary[Any, SegmentEncoder | None] = weakref.WeakKeyDictionary()


class SegmentEncoder:
    """Encodes texts for one Rust-backed tokenizer, cut at its boundary tokens."""

    def __init__(
        self,
        backend: Any,
        literals: dict[int, str],
        typecode: str,
        ascii_bpe: AsciiBPE | None = None,
    ) -> None:
        self.backend = backend
        self.literals = literals
        self.typecode = typecode
        #: Encodes the ASCII pieces (the tokenizer's ids, faster); None: the tokenizer does.
        self.ascii_bpe = ascii_bpe if typecode == "I" else None
        ordered = sorted(set(literals.values()), key=len, reverse=True)
        self._pattern = re.compile("|".join(re.escape(lit) for lit in ordered))
        fast = getattr(backend, "encode_batch_fast", None)
        # encode_batch, not encode: it releases the GIL for a text holding added tokens
        # (a chat template's), so renders in the pool do not stall the event loop.
        self._encode_batch = fast if fast is not None else backend.encode_batch

    @classmethod
    def for_tokenizer(cls, tokenizer: PreTrainedTokenizerBase) -> SegmentEncoder | None:
        """The tokenizer's encoder, or None when texts must be tokenized whole (logged)."""
        try:
            return _encoder_cache[tokenizer]
        except (KeyError, TypeError):
            pass
        encoder = cls._build(tokenizer)
        try:
            _encoder_cache[tokenizer] = encoder
        except TypeError:
            pass
        return encoder

    @classmethod
    def _build(cls, tokenizer: PreTrainedTokenizerBase) -> SegmentEncoder | None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            logger.info(
                "tokenizer %s has no Rust backend; every turn is tokenized in full",
                type(tokenizer).__name__,
            )
            return None
        decoder = tokenizer.added_tokens_decoder
        literals = {tid: str(decoder[tid]) for tid in boundary_ids(tokenizer)}
        if not literals:
            logger.info("tokenizer has no added token to split at; every turn is tokenized in full")
            return None
        size = backend.get_vocab_size(with_added_tokens=True)
        encoder = cls(
            backend, literals, "I" if size < 2**32 else "Q", AsciiBPE.for_backend(backend)
        )
        if not encoder._splits_cleanly(literals[min(literals)]):
            logger.info(
                "tokenizer %s tokenizes the start of a text differently from the same text "
                "after an added token; every turn is tokenized in full",
                type(tokenizer).__name__,
            )
            return None
        return encoder

    def _splits_cleanly(self, literal: str) -> bool:
        """Does text after ``literal`` tokenize alone as it does after it?"""
        sides = ["a", " b", "\n\n c", "é ", "  "]
        wholes, pieces = [], []
        for left in sides:
            for right in sides:
                wholes.append(left + literal + right)
                pieces += [left + literal, right]
        whole_ids = [e.ids for e in self._encode_batch(wholes, add_special_tokens=False)]
        piece_ids = [e.ids for e in self._encode_batch(pieces, add_special_tokens=False)]
        return all(
            whole == piece_ids[2 * i] + piece_ids[2 * i + 1] for i, whole in enumerate(whole_ids)
        )

    def ids(self, text: str) -> array:
        """The ids of ``text`` (as the tokenizer gives them, without special tokens)."""
        return self.encode(text).ids

    def encode(self, text: str) -> Segmented:
        """``text``'s ids and its safe split points (``text`` must start at one)."""
        pieces = []
        start = 0
        for match in self._pattern.finditer(text):
            end = match.end()
            pieces.append(text[start:end])
            start = end
        rest = text[start:]
        if rest:
            pieces.append(rest)
        ids = array(self.typecode)
        counts = []
        literals = self.literals
        for index, piece_ids in enumerate(self._pieces_ids(pieces)):
            if index < len(pieces) - 1 or not rest:
                literal = literals.get(piece_ids[-1]) if piece_ids else None
                if literal is None or not pieces[index].endswith(literal):
                    return self._encode_with_offsets(text)
                ids.extend(piece_ids)
                counts.append(len(ids))
            else:
                ids.extend(piece_ids)
        segments = pieces[: len(counts)]
        return Segmented(segments=segments, counts=counts, ids=ids, rest=rest)

    def _pieces_ids(self, pieces: list[str]) -> list[Any]:
        """Each piece's ids: ASCII pieces from :attr:`ascii_bpe`, the others (and any it
        declines) from the tokenizer, in one batch."""
        fast = self.ascii_bpe
        if fast is None:
            return [e.ids for e in self._encode_batch(pieces, add_special_tokens=False)]
        found: list[Any] = [fast.ids(piece) for piece in pieces]
        rest = [index for index, ids in enumerate(found) if ids is None]
        if rest:
            batch = self._encode_batch([pieces[i] for i in rest], add_special_tokens=False)
            for index, encoding in zip(rest, batch, strict=True):
                found[index] = encoding.ids
        return found

    def _encode_with_offsets(self, text: str) -> Segmented:
        """The whole text in one encoding, split points read from its offsets."""
        encoding = self.backend.encode_batch([text], add_special_tokens=False)[0]
        ids = array(self.typecode, encoding.ids)
        segments, counts = [], []
        start = 0
        for count, (token_id, (_, end)) in enumerate(
            zip(encoding.ids, encoding.offsets, strict=True), start=1
        ):
            if token_id in self.literals:
                segments.append(text[start:end])
                counts.append(count)
                start = end
        return Segmented(segments=segments, counts=counts, ids=ids, rest=text[start:])
