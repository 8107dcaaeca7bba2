"""Shortcuts that must answer as the slow path: the ``tojson`` memo, ``same_exact_key``."""

from __future__ import annotations

import json
import math

from hypothesis import given
from hypothesis import strategies as st

from agentrl.prompts.templates import JsonMemo


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """transformers' filter."""
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(st.lists(JSON, min_size=1, max_size=6))
def test_every_answer_is_the_filters_own(values):
    """Values met in any order, repeated or not, NaN and infinities included: the memo
    answers exactly what json.dumps writes for each (never another value's text)."""
    memo = JsonMemo(tojson)
    for value in [*values, *values]:
        assert memo([value]) == tojson([value])


def test_values_equal_in_python_but_not_in_json_are_told_apart():
    """Key order, ``1`` / ``1.0`` / ``True``, and NaN / None: each gets its own text."""
    memo = JsonMemo(tojson)
    pairs = [
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
        ([1], [1.0]),
        ([1], [True]),
        ([None], [math.nan]),
        ([0.0], [-0.0]),
    ]
    for first, second in pairs:
        assert memo(first) == tojson(first)
        assert memo(second) == tojson(second)
        assert memo(first) == tojson(first)


def test_calls_with_arguments_and_other_types_go_to_the_filter():
    """An indent, a string, or a key orjson refuses: the filter's own answer, not kept."""
    memo = JsonMemo(tojson)
    assert memo({"a": [1]}, indent=2) == tojson({"a": [1]}, indent=2)
    assert memo("é") == tojson("é")
    assert memo({1: "x"}) == tojson({1: "x"})
    assert memo([2**70]) == tojson([2**70])
    assert memo._texts == {}


@given(JSON, JSON)
def test_same_exact_key_never_says_yes_wrongly(a, b):
    """``same_exact_key`` is True only where the exact keys are equal, and for a value and
    its fresh copy (NaN aside)."""
    import copy

    from agentrl.prompts.keys import exact_key, same_exact_key

    if same_exact_key(a, b):
        assert exact_key({"v": a}) == exact_key({"v": b})
    if "NaN" not in exact_key({"v": a}):
        assert same_exact_key(a, copy.deepcopy(a))
    assert not same_exact_key({"x": 1, "y": 2}, {"y": 2, "x": 1})
    assert not same_exact_key([1], [1.0]) and not same_exact_key([1], [True])


def _twin(value, flip):
    """A copy of ``value`` with what ``==`` cannot see changed where ``flip()`` says:
    ``1`` / ``1.0`` / ``True``, ``0.0`` / ``-0.0``, a dict's key order, a list / tuple."""
    if isinstance(value, dict):
        items = [(k, _twin(v, flip)) for k, v in value.items()]
        return dict(reversed(items) if flip() else items)
    if isinstance(value, list):
        items = [_twin(v, flip) for v in value]
        return tuple(items) if flip() else items
    if type(value) is bool and flip():
        return int(value)
    if type(value) is int and value in (0, 1) and flip():
        return float(value) if flip() else bool(value)
    if type(value) is float and value == 0.0 and flip():
        return -value
    return value


@given(JSON, st.lists(st.booleans(), max_size=64))
def test_same_exact_key_sees_what_equality_cannot(value, flips):
    """A value and a twin ``==`` calls equal (types, signed zeros, key order, tuples):
    ``same_exact_key`` says yes only where their exact keys are equal, and for an
    unchanged copy always (a NaN is the same object in both)."""
    import copy

    from agentrl.prompts.keys import exact_key, same_exact_key

    answers = iter(flips)
    twin = _twin(value, lambda: next(answers, False))
    if same_exact_key(value, twin):
        assert exact_key({"v": value}) == exact_key({"v": twin})
    assert same_exact_key(value, copy.copy(value))


def test_same_exact_key_refuses_types_json_writes_otherwise():
    """Subclasses, enums, dates and UUIDs equal to plain values are never taken for them."""
    import datetime
    import enum
    import uuid

    from agentrl.prompts.keys import exact_key, same_exact_key

    class Flag(enum.IntEnum):
        ON = 1

    class Text(str):
        def __repr__(self):
            return "Text()"

    day = datetime.date(2026, 1, 2)
    tag = uuid.UUID(int=7)
    pairs = [([Flag.ON], [1]), ({"a": Text("x")}, {"a": "x"}), ([day], [day.isoformat()])]
    pairs += [([tag], [str(tag)]), ({"a": [1]}, {"a": (1,)})]
    for a, b in pairs:
        assert not same_exact_key(a, b) or exact_key({"v": a}) == exact_key({"v": b}), (a, b)
