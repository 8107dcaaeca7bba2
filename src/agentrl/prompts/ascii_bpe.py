"""Exact byte-level BPE ids for ASCII text, without the tokenizer's per-character bookkeeping.

Public API::

    AsciiBPE.for_backend(backend) -> AsciiBPE | None   # None: a pipeline it cannot reproduce
    bpe.ids(text) -> array | None   # None: ask the tokenizer (not ASCII, over MAX_CHARS, off)
    ascii_bpe.ENABLED = False       # every encoder off (the library path; benchmarks)
    bpe.stats -> Counter  ("encoded", "checked", "mismatch", "word_misses")

Why: the Rust tokenizer spends most of a call on alignment tracking (a normalized string
with per-character offsets, split and re-split), not on BPE: about 2.6 ms for 5.6k
characters of code, where the BPE merges themselves are a small part. For ASCII text every
stage before the BPE is simple enough to do exactly in a few C-level calls:

- added tokens are cut out leftmost-longest (one alternation, longest literal first), as
  the tokenizer's Aho-Corasick matcher does;
- the normalizer (NFC, NFKC, NFD, NFKD, or none) is the identity on ASCII;
- the pre-tokenizer's regex is translated to ASCII character classes (``\\p{L}`` is
  ``[A-Za-z]``, ``\\p{N}`` is ``[0-9]``, ``\\s`` is ``[\\t\\n\\v\\f\\r ]``, Unicode's
  White_Space on ASCII: not Python's ``\\s``, which also takes ``\\x1c``-``\\x1f``) and run
  with ``re``; a pattern holding anything else is not translated;
- the byte-level map is a ``str.translate`` table;
- the BPE of each piece is the tokenizer's own model (``model.tokenize``), cached per piece.

So the ids are the tokenizer's own, by construction. Two checks back that up: a probe of
awkward texts when the encoder is built (a difference: no encoder), and a comparison with
the tokenizer on the 1st, 2nd, 4th, 8th, … call (a difference: logged, the encoder turns
itself off for good, and that call returns None so its caller uses the tokenizer).
"""

from __future__ import annotations

import collections
import json
import logging
import re
import threading
from array import array
from typing import Any

__all__ = ["AsciiBPE", "translate_pattern"]

logger = logging.getLogger(__name__)

#: False: every text goes to the tokenizer (the library path), for the benchmark's
#: on/off comparison (``benchmarks/middleware.py``'s ``splice-libenc`` column).
ENABLED = True
#: Words whose ids are cached (process-wide, per tokenizer); the cache is emptied when full.
WORD_CACHE_SIZE = 1 << 16
#: Longest text it encodes: its regex holds the GIL for a whole text (about 6 ms at this
#: size), where the tokenizer releases it, so a huge message cannot stall the event loop.
MAX_CHARS = 1 << 16
#: Normalizers that leave ASCII text as it is.
_ASCII_IDENTITY_NORMALIZERS = frozenset({"NFC", "NFD", "NFKC", "NFKD"})
#: GPT-2's pattern: what ``ByteLevel(use_regex=True)`` splits with.
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
#: Unicode's White_Space on ASCII (what the tokenizer's regex engine means by ``\s``).
_SPACE = r"\t\n\x0b\x0c\r "
_CLASS_ESCAPES = {r"\p{L}": "A-Za-z", r"\p{N}": "0-9", r"\s": _SPACE}
_BARE_ESCAPES = {
    r"\p{L}": "[A-Za-z]",
    r"\p{N}": "[0-9]",
    r"\s": f"[{_SPACE}]",
    r"\S": f"[^{_SPACE}]",
}
_LITERAL_ESCAPES = (r"\r", r"\n", r"\t")
_GROUP_OPENERS = ("(?:", "(?i:", "(?!", "(?=")
_SET_OPERATORS = ("&&", "--", "||", "~~")
#: Texts the encoder must get right before it is used (contractions, digits, runs of
#: spaces, control characters, ends of text); the added tokens are appended.
_PROBES = (
    "Hello, world! It's 2024: don't we'll they've I'm you'd SHE'S 'tis",
    "def f(x):\n\treturn x  \n\n\n    # done   \r\n\r\n",
    "a\x1cb\x1d c\x0b\x0c d\x00e\x7f  ",
    "   leading and trailing   ",
    "x=1+2*3/4-5;y=[0,12,345,6789]\n",
    "''''  '' 'S 'LL 'Re",
    "\n",
    " ",
)


def translate_pattern(pattern: str) -> str | None:
    """``pattern`` with its Unicode classes written for ASCII text, or None when it holds a
    construct this translation does not cover (the encoder is then not used)."""
    out: list[str] = []
    in_class = False
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            for escape in (r"\p{L}", r"\p{N}", r"\s", r"\S"):
                if pattern.startswith(escape, i):
                    table = _CLASS_ESCAPES if in_class else _BARE_ESCAPES
                    if escape not in table:
                        return None
                    out.append(table[escape])
                    i += len(escape)
                    break
            else:
                escape = pattern[i : i + 2]
                if escape in _LITERAL_ESCAPES or (len(escape) == 2 and not escape[1].isalnum()):
                    out.append(escape)
                    i += 2
                else:
                    return None
            continue
        if in_class:
            if char == "[" or pattern[i : i + 2] in _SET_OPERATORS:
                return None  # nested classes and set operations differ between engines
            in_class = char != "]"
        elif char == "(":
            # A plain group would make ``findall`` return the group, not the match.
            opener = next((o for o in _GROUP_OPENERS if pattern.startswith(o, i)), None)
            if opener is None and pattern.startswith("(?", i):
                return None
            out.append(opener or "(?:")
            i += len(opener or "(")
            continue
        elif char == "[":
            opener = "[^" if pattern.startswith("[^", i) else "["
            if pattern.startswith("]", i + len(opener)):
                return None
            in_class = True
            out.append(opener)
            i += len(opener)
            continue
        elif char in "^$.":
            return None  # anchors and the dot: line handling differs between engines
        out.append(char)
        i += 1
    if in_class:
        return None
    return "".join(out)


def _byte_level_table() -> dict[int, str]:
    """GPT-2's printable stand-in for each ASCII byte (what ``ByteLevel`` maps it to)."""
    from agentrl.tokenizers import byte_to_unicode

    return {b: char for b, char in byte_to_unicode().items() if b < 128}


class AsciiBPE:
    """One byte-level BPE tokenizer's ids for ASCII text (see the module docstring)."""

    def __init__(self, backend: Any, added: dict[str, int], pattern: str) -> None:
        self.backend = backend
        self._model = backend.model
        self._added = added
        ordered = sorted(added, key=len, reverse=True)
        self._added_pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None
        self._split = re.compile(pattern)
        self._table = _byte_level_table()
        self._words: dict[str, bytes] = {}
        self._calls = 0
        self._lock = threading.Lock()
        self.enabled = True
        self.stats: collections.Counter[str] = collections.Counter()

    @classmethod
    def for_backend(cls, backend: Any) -> AsciiBPE | None:
        """An encoder for ``backend`` (a ``tokenizers.Tokenizer``), or None when its pipeline
        is not one this module reproduces exactly (logged)."""
        why = None
        try:
            encoder = cls._build(backend)
        except _NotReproduced as exc:
            encoder, why = None, str(exc)
        except Exception as exc:  # a backend of an unexpected shape: the tokenizer serves
            encoder, why = None, f"{type(exc).__name__}: {exc}"
        if encoder is not None and not encoder._passes_probes():
            encoder, why = None, "its ids differ from the tokenizer's on the probe texts"
        if encoder is None:
            logger.info("ASCII text is tokenized by the tokenizer itself: %s", why)
        return encoder

    @classmethod
    def _build(cls, backend: Any) -> AsciiBPE:
        """The encoder; :class:`_NotReproduced` saying why when the pipeline is not one
        this module reproduces."""
        model = backend.model
        if type(model).__name__ != "BPE":
            raise _NotReproduced(f"the model is {type(model).__name__}, not BPE")
        if model.dropout or model.byte_fallback or model.continuing_subword_prefix:
            raise _NotReproduced("the BPE uses dropout, byte fallback or a subword prefix")
        if model.end_of_word_suffix:
            raise _NotReproduced("the BPE uses an end-of-word suffix")
        if getattr(backend, "encode_special_tokens", False):
            raise _NotReproduced("special tokens are encoded as text")
        normalizer = _state(backend.normalizer)
        if not _ascii_identity(normalizer):
            raise _NotReproduced(f"normalizer {normalizer.get('type')!r} may change ASCII text")
        pattern = _split_pattern(_state(backend.pre_tokenizer))
        translated = translate_pattern(pattern)
        if translated is None:
            raise _NotReproduced(f"pre-tokenizer pattern {pattern!r} is not one it translates")
        added = {}
        for token_id, token in backend.get_added_tokens_decoder().items():
            if token.lstrip or token.rstrip or token.single_word or token.normalized:
                raise _NotReproduced(
                    f"added token {token.content!r} is stripped, single-word or normalized"
                )
            added[token.content] = int(token_id)
        return cls(backend, added, translated)

    def _passes_probes(self) -> bool:
        probes = [*_PROBES, "".join(f"a {content}b\n" for content in self._added)]
        probes.append("".join(self._added))
        for text in probes:
            ids = self._encode(text)
            if ids is None or list(ids) != self._reference(text):
                return False
        self._words.clear()
        return True

    def _reference(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def ids(self, text: str) -> array | None:
        """The tokenizer's ids of ``text`` (ASCII, without special tokens added), or None
        when the caller must ask the tokenizer (not ASCII, longer than :data:`MAX_CHARS`,
        turned off, or a piece it could not encode)."""
        if not (ENABLED and self.enabled) or len(text) > MAX_CHARS or not text.isascii():
            return None
        ids = self._encode(text)
        if ids is None:
            return None
        with self._lock:
            self._calls += 1
            check = self._calls & (self._calls - 1) == 0
        self.stats["encoded"] += 1
        if check:
            self.stats["checked"] += 1
            if list(ids) != self._reference(text):
                self.stats["mismatch"] += 1
                self.enabled = False
                logger.warning(
                    "the ASCII BPE encoder's ids differ from the tokenizer's on a text of %d "
                    "characters; the tokenizer encodes every text from now on",
                    len(text),
                )
                return None
        return ids

    def _encode(self, text: str) -> array | None:
        out = array("I")
        start = 0
        if self._added_pattern is not None:
            added = self._added
            for match in self._added_pattern.finditer(text):
                if match.start() > start and not self._encode_plain(
                    text[start : match.start()], out
                ):
                    return None
                out.append(added[match.group()])
                start = match.end()
        if start < len(text) and not self._encode_plain(text[start:], out):
            return None
        return out

    def _encode_plain(self, text: str, out: array) -> bool:
        words = self._split.findall(text)
        if not all(words):
            return False  # an empty match: the tokenizer's handling is not reproduced
        if sum(map(len, words)) != len(text):
            words = self._with_gaps(text)
        found = list(map(self._words.get, words))  # one C loop when every word is cached
        if None in found:
            for index, encoded in enumerate(found):
                if encoded is None:
                    encoded = found[index] = self._bpe(words[index])
                    if encoded is None:
                        return False
        out.frombytes(b"".join(found))
        return True

    def _with_gaps(self, text: str) -> list[str]:
        """The pieces of an ``Isolated`` split where the matches leave gaps: the matches and
        the text between them."""
        pieces, start = [], 0
        for match in self._split.finditer(text):
            if match.start() > start:
                pieces.append(text[start : match.start()])
            pieces.append(match.group())
            start = match.end()
        if start < len(text):
            pieces.append(text[start:])
        return pieces

    def _bpe(self, word: str) -> bytes | None:
        self.stats["word_misses"] += 1
        try:
            tokens = self._model.tokenize(word.translate(self._table))
        except Exception:  # a byte with no token: the tokenizer decides what happens
            return None
        encoded = array("I", [token.id for token in tokens]).tobytes()
        if len(self._words) >= WORD_CACHE_SIZE:
            self._words.clear()
        self._words[word] = encoded
        return encoded


def _state(component: Any) -> dict[str, Any]:
    """A normalizer's or pre-tokenizer's own serialisation ({} for none)."""
    if component is None:
        return {}
    return json.loads(component.__getstate__())


def _ascii_identity(normalizer: dict[str, Any]) -> bool:
    kind = normalizer.get("type")
    if kind is None:
        return True
    if kind == "Sequence":
        return all(_ascii_identity(n) for n in normalizer.get("normalizers", ()))
    return kind in _ASCII_IDENTITY_NORMALIZERS


class _NotReproduced(ValueError):
    """The tokenizer's pipeline is not one this module reproduces exactly (the message says
    why)."""


def _split_pattern(pre_tokenizer: dict[str, Any]) -> str:
    """The regex of a byte-level pre-tokenizer that splits it ``Isolated`` (matches and the
    text between them are pieces); :class:`_NotReproduced` for any other pre-tokenizer."""
    kind = pre_tokenizer.get("type")
    if kind == "ByteLevel":
        if pre_tokenizer.get("add_prefix_space") or not pre_tokenizer.get("use_regex", True):
            raise _NotReproduced(
                "a ByteLevel pre-tokenizer that adds a prefix space or does not split"
            )
        return GPT2_PATTERN
    if kind != "Sequence":
        raise _NotReproduced(f"pre-tokenizer {kind!r} is not a byte-level split")
    parts = pre_tokenizer.get("pretokenizers", [])
    if len(parts) != 2 or [p.get("type") for p in parts] != ["Split", "ByteLevel"]:
        raise _NotReproduced("a pre-tokenizer sequence other than Split then ByteLevel")
    split, level = parts
    if level.get("add_prefix_space") or level.get("use_regex"):
        raise _NotReproduced("a ByteLevel step that adds a prefix space or splits again")
    pattern = split.get("pattern", {}).get("Regex")
    if pattern is None or split.get("invert") or split.get("behavior") != "Isolated":
        raise _NotReproduced("a Split that is not an isolated regex split")
    return pattern
