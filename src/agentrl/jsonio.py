"""The one JSON codec of the wire paths: orjson, with the standard library for its refusals.

Request bodies, replies and the engine's ``/generate`` payloads go through here, so the
choice of library is made once. Everything orjson parses it parses as the standard
library does, except integers beyond 64 bits, which become floats (as in most JSON
parsers). What orjson refuses (``NaN`` and ``Infinity`` literals, a lone UTF-16 surrogate
escape, a byte-order mark, UTF-16 text, numbers overflowing a double) is parsed again by
:func:`json.loads`, so such a body is accepted, or refused with the same error, as before.
Likewise what orjson cannot encode (a lone surrogate, an integer beyond 64 bits, a
non-string key) is encoded by :func:`json.dumps` (ASCII-escaped, so any string is valid
UTF-8).

Public API::

    loads(data) -> Any                 # bytes or str
    loads_strict(data) -> Any          # orjson alone: valid UTF-8 JSON only (ValueError)
    dumps(value, *, default=None) -> bytes     # compact UTF-8
    dumps_text(value) -> str           # the same, as text
    encode_ids(ids) -> bytes           # a JSON array of token ids (list, tuple, array('I'))
    IdsText(budget_bytes).encode(key, ids) -> bytes   # the same, reusing key's previous text
    loads_line(line) -> Any            # one JSONL line; JSONLineError carries the real column
"""

from __future__ import annotations

import json
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import orjson

__all__ = [
    "IdsText",
    "JSONDecodeError",
    "JSONLineError",
    "dumps",
    "dumps_text",
    "encode_ids",
    "loads",
    "loads_line",
    "loads_strict",
]

#: What :func:`loads` raises for text that is not JSON (a :class:`ValueError`).
JSONDecodeError = json.JSONDecodeError

_numpy: Any = None


class JSONLineError(ValueError):
    """One line of a JSONL file is not JSON; ``column`` (1-based, in characters) is where.

    ``str()`` is ``"<msg> at column <column>"``, the position in the line as an editor
    shows it.
    """

    def __init__(self, msg: str, column: int) -> None:
        super().__init__(f"{msg} at column {column}")
        self.msg = msg
        self.column = column


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """``data`` parsed as JSON; :func:`json.loads` decides what orjson refuses.

    Raises what :func:`json.loads` raises: :class:`JSONDecodeError`, ``UnicodeDecodeError``
    or ``RecursionError`` (nesting beyond ~1000 levels).
    """
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    if isinstance(data, memoryview):
        data = bytes(data)
    return json.loads(data)


def loads_line(line: str) -> Any:
    """One line of a JSONL file parsed as :func:`loads` parses it.

    Raises :class:`JSONLineError` whose column points into ``line`` itself: the line's own
    terminator is not parsed, so a value cut short at the end of the line is reported at
    the end of that line, not at column 1 of a line that does not exist, and a UTF-8
    byte-order mark is reported as one.
    """
    text = line.rstrip("\r\n")
    try:
        return loads(text)
    except json.JSONDecodeError as exc:
        raise JSONLineError(exc.msg, exc.colno) from None
    except RecursionError:
        raise JSONLineError("nested too deeply", 1) from None


def loads_strict(data: bytes | bytearray | memoryview | str) -> Any:
    """``data`` parsed by orjson alone: RFC 8259 JSON in valid UTF-8, else ``JSONDecodeError``.

    Every string it returns is valid Unicode (no lone surrogate), and nesting is at most
    1024 levels. :func:`loads` accepts more.
    """
    return orjson.loads(data)


def dumps(value: Any, *, default: Callable[[Any], Any] | None = None) -> bytes:
    """``value`` as compact UTF-8 JSON; :func:`json.dumps` encodes what orjson cannot.

    ``default`` converts objects JSON has no type for (as in :func:`json.dumps`).
    """
    try:
        return orjson.dumps(value, default=default)
    except orjson.JSONEncodeError:
        pass
    return json.dumps(value, separators=(",", ":"), default=default).encode("ascii")


def dumps_text(value: Any, *, default: Callable[[Any], Any] | None = None) -> str:
    """:func:`dumps` as a ``str`` (for APIs that take text, such as aiohttp's ``dumps=``)."""
    return dumps(value, default=default).decode("utf-8")


def encode_ids(ids: Sequence[int]) -> bytes:
    """A JSON array of token ids, without a Python ``int`` per id where that can be avoided.

    A list or tuple is encoded as it is; an ``array('I')`` (or ``'L'``/``'Q'``) through a
    zero-copy numpy view when numpy is installed (about 10x faster than building a list),
    else through ``tolist()``; any other sequence through ``list()``.
    """
    if isinstance(ids, (list, tuple)):
        return orjson.dumps(ids)
    if isinstance(ids, array):
        view = _numpy_view(ids)
        if view is not None:
            return orjson.dumps(view, option=orjson.OPT_SERIALIZE_NUMPY)
        return orjson.dumps(ids.tolist())
    return orjson.dumps(list(ids))


def _numpy_view(ids: array) -> Any:
    """A numpy view of an unsigned array of ids, or None (no numpy, or another typecode)."""
    global _numpy
    if ids.typecode not in "ILQ" or not ids:
        return None
    if _numpy is None:
        try:
            import numpy
        except ImportError:
            _numpy = False
        else:
            _numpy = numpy
    if _numpy is False:
        return None
    return _numpy.frombuffer(ids, dtype=f"u{ids.itemsize}")


class IdsText:
    """:func:`encode_ids` that reuses the text of each key's previous ids when they are a
    prefix of the new ones (a spliced prompt is the previous prompt, its output and a seam).

    Each key keeps a copy of the last ids it encoded and their text; ``encode(key, ids)``
    compares the new ids' head with that copy (a ``memcmp``), and on a match writes only
    the new tail. Anything else (another key, a shorter or different sequence, a list)
    is encoded whole, so the text is always exactly ``encode_ids(ids)``. The entries use
    at most ``budget_bytes`` (least recently used ones are dropped; 0 keeps none).
    """

    def __init__(self, budget_bytes: int = 64 * 1024 * 1024) -> None:
        self.budget_bytes = int(budget_bytes)
        self.held_bytes = 0
        self.reused = 0
        self._entries: OrderedDict[Any, tuple[array, bytes]] = OrderedDict()

    def encode(self, key: Any, ids: Sequence[int]) -> bytes:
        """``encode_ids(ids)``, from ``key``'s previous text where ``ids`` extend it."""
        if key is None or type(ids) is not array or ids.typecode not in "ILQ":
            return encode_ids(ids)
        entry = self._entries.pop(key, None)
        text = None
        if entry is not None:
            copy, previous = entry
            self.held_bytes -= _entry_bytes(entry)
            size = len(copy)
            if size and copy.typecode == ids.typecode and len(ids) >= size and ids[:size] == copy:
                self.reused += size
                if len(ids) == size:
                    text = previous
                else:
                    tail = encode_ids(ids[size:])
                    text = b"".join((memoryview(previous)[:-1], b",", memoryview(tail)[1:]))
        if text is None:
            text = encode_ids(ids)
        entry = (array(ids.typecode, ids), text)
        if _entry_bytes(entry) <= self.budget_bytes:
            self._entries[key] = entry
            self.held_bytes += _entry_bytes(entry)
            while self.held_bytes > self.budget_bytes:
                self.held_bytes -= _entry_bytes(self._entries.popitem(last=False)[1])
        return text

    def forget(self, key: Any) -> None:
        """Drop ``key``'s entry (a finished session)."""
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.held_bytes -= _entry_bytes(entry)


def _entry_bytes(entry: tuple[array, bytes]) -> int:
    return len(entry[0]) * entry[0].itemsize + len(entry[1])
