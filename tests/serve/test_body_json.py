"""Request bodies parsed by orjson keep the standard library's answers to odd JSON."""

from __future__ import annotations

import math

import pytest

from agentrl.adapters.base import ProtocolError
from agentrl.serve.limits import MAX_JSON_DEPTH, check_depth, decode_json


def test_valid_body_parses():
    """An ordinary body decodes to its value."""
    assert decode_json(b'{"messages": [{"role": "user", "content": "hi \\u00e9"}]}') == {
        "messages": [{"role": "user", "content": "hi é"}]
    }


def test_nan_is_still_accepted():
    """json.loads accepted NaN literals; the orjson path falls back and still does."""
    assert math.isnan(decode_json(b'{"temperature": NaN}')["temperature"])


def test_lone_surrogate_is_still_the_surrogate_400():
    """A lone surrogate escape gets the same 400 naming the surrogate as before."""
    with pytest.raises(ProtocolError, match="lone UTF-16 surrogate") as info:
        decode_json(b'{"content": "\\ud800"}')
    assert info.value.status == 400


def test_bad_json_keeps_the_standard_message():
    """A syntax error is a 400 carrying json's own line/column message."""
    with pytest.raises(ProtocolError, match="not valid JSON: Expecting value: line 1 column 7"):
        decode_json(b'{"a": }')


@pytest.mark.parametrize("kind", ["[", '{"a":'])
def test_depth_limit_holds_on_the_fast_path(kind):
    """MAX_JSON_DEPTH containers parse; one more is a 400 (orjson parses both)."""
    close = "]" if kind == "[" else "}"
    ok = kind * MAX_JSON_DEPTH + "1" + close * MAX_JSON_DEPTH
    decode_json(ok.encode())
    deep = kind * (MAX_JSON_DEPTH + 1) + "1" + close * (MAX_JSON_DEPTH + 1)
    with pytest.raises(ProtocolError, match="deeper than"):
        decode_json(deep.encode())


def test_far_too_deep_is_a_400_not_a_recursion_error():
    """Nesting beyond orjson's and json's own limits is still the depth 400."""
    with pytest.raises(ProtocolError, match="deeper than"):
        decode_json(b"[" * 100_000 + b"]" * 100_000)


def test_check_depth_ignores_strings_and_scalars():
    """Scalars and wide flat containers pass the depth check."""
    check_depth("x")
    check_depth({"a": ["b"] * 1000, "c": {"d": 1}})
