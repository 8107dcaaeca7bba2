"""Shortcuts that must answer as the slow path: the ``tojson`` memo, ``same_exact_key``."""

from __future__ import annotations

import json
import math

from hypothesis import given
from hypothesis import strategies as st

from agentrl.adapters.templates import JsonMemo


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

    from agentrl.adapters.keys import exact_key, same_exact_key

    if same_exact_key(a, b):
        assert exact_key({"v": a}) == exact_key({"v": b})
    if "NaN" not in exact_key({"v": a}):
        assert same_exact_key(a, copy.deepcopy(a))
    assert not same_exact_key({"x": 1, "y": 2}, {"y": 2, "x": 1})
    assert not same_exact_key([1], [1.0]) and not same_exact_key([1], [True])
