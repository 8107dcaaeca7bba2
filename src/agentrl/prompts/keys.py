"""How assistant messages are compared when a client replays them.

``exact_key`` keeps key order (a chat template renders keys in the order given);
``loose_key`` is a message as a client may replay it: text trimmed, no reasoning, keys in
any order. ``same_exact_key`` says, without writing either key, when two messages'
exact keys are equal for certain: ``a == b`` (in C), then their orjson texts compared
(also in C; orjson keeps key order and writes ``1``, ``1.0``, ``true`` and ``-0.0``
apart), and a walk of both values only where orjson cannot write them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import orjson

from agentrl.trajectory import message_key

__all__ = ["exact_key", "loose_key", "same_exact_key", "stripped"]


def exact_key(message: Mapping[str, Any]) -> str:
    """A message's text, key order included: equal keys render alike under a chat template."""
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False, default=repr)


def stripped(value: Any) -> Any:
    """``value`` without surrounding whitespace when it is a string, else as it is."""
    return value.strip() if isinstance(value, str) else value


def loose_key(message: Mapping[str, Any]) -> str:
    """A message as a client may replay it: text trimmed, no reasoning, any key order."""
    loose = {k: stripped(v) for k, v in message.items() if k != "reasoning_content"}
    return message_key(loose)


def same_exact_key(a: Any, b: Any) -> bool:
    """Whether ``exact_key(a) == exact_key(b)`` holds for certain, without writing them.

    The same JSON types throughout (``1``, ``1.0`` and ``True`` differ; so do ``0.0`` and
    ``-0.0``), dict keys in the same order, equal strings. False whenever unsure (a NaN,
    a type outside JSON's, a dict subclass, nesting too deep): the caller writes the keys.
    """
    if a is b:
        return True
    try:
        if a != b:
            return False
        return orjson.dumps(a, option=_EXACT) == orjson.dumps(b, option=_EXACT)
    except RecursionError:
        return False
    except (TypeError, orjson.JSONEncodeError):
        pass  # a type orjson does not write as json.dumps would: compare them in Python
    try:
        return _same(a, b)
    except RecursionError:
        return False


#: orjson refuses subclasses, dataclasses and dates instead of writing them as their base
#: type or a string (``json.dumps`` would write some of them otherwise). A value ``==``
#: holds for, written alike, has the same exact key: equal texts mean the same key order
#: and the same JSON types, and a NaN (written ``null``) can only face itself there.
_EXACT = (
    orjson.OPT_PASSTHROUGH_SUBCLASS
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
)


def _same(a: Any, b: Any) -> bool:
    if a is b:  # one object writes one key
        return True
    kind = type(a)
    if kind is not type(b):
        return False
    if kind is str or kind is int or kind is bool or a is None:
        return a == b
    if kind is dict:
        if len(a) != len(b):
            return False
        for (key_a, value_a), (key_b, value_b) in zip(a.items(), b.items(), strict=True):
            if type(key_a) is not str or key_a != key_b or not _same(value_a, value_b):
                return False
        return True
    if kind is list or kind is tuple:
        return len(a) == len(b) and all(map(_same, a, b))
    if kind is float:
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    return False
