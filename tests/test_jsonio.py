"""agentrl.jsonio: orjson where it agrees with the standard library, the library where not."""

from __future__ import annotations

import json
import math
from array import array

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentrl import jsonio

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(_values)
def test_loads_and_dumps_agree_with_the_standard_library(value):
    """For any JSON value in orjson's range, both directions match json's round trip."""
    text = json.dumps(value)
    assert jsonio.loads(text) == json.loads(text)
    assert jsonio.loads(text.encode()) == json.loads(text)
    assert json.loads(jsonio.dumps(value)) == json.loads(text)
    assert jsonio.dumps_text(value) == jsonio.dumps(value).decode()


def test_loads_falls_back_to_the_standard_library_for_what_orjson_refuses():
    """NaN, a lone surrogate escape, a BOM and UTF-16 text parse as json.loads parses them."""
    assert math.isnan(jsonio.loads(b'{"x": NaN}')["x"])
    assert jsonio.loads(b'"\\ud800"') == "\ud800"
    assert jsonio.loads(b"\xef\xbb\xbf{}") == {}
    assert jsonio.loads('{"a": 1}'.encode("utf-16")) == {"a": 1}
    assert jsonio.loads(b"[1e400]") == [math.inf]
    with pytest.raises(jsonio.JSONDecodeError, match="Expecting"):
        jsonio.loads(b'{"a": }')
    with pytest.raises(ValueError):
        jsonio.loads_strict(b'{"x": NaN}')


def test_dumps_falls_back_for_what_orjson_cannot_encode():
    """A lone surrogate, a 65-bit integer and an int key still encode (ASCII-escaped)."""
    value = {"s": "\ud800", "big": 2**70}
    out = jsonio.dumps(value)
    assert json.loads(out) == value
    out.decode("ascii")
    assert json.loads(jsonio.dumps({1: "a"})) == {"1": "a"}
    assert json.loads(jsonio.dumps({"o": object()}, default=lambda o: "obj")) == {"o": "obj"}


@pytest.mark.parametrize(
    "ids",
    [
        [1, 2, 3],
        (0, 151_643, 2**32 - 1),
        array("I", [5, 0, 2**32 - 1, 77]),
        array("I"),
        array("Q", [2**40, 1]),
        range(4),
        array("i", [3, 4]),
    ],
    ids=repr,
)
def test_encode_ids_is_the_json_array_of_the_ids(ids):
    """Lists, tuples, unsigned arrays (numpy view), signed arrays and ranges all encode."""
    assert json.loads(jsonio.encode_ids(ids)) == list(ids)


def test_encode_ids_without_numpy(monkeypatch):
    """Without numpy an array('I') encodes through tolist(), to the same bytes."""
    ids = array("I", range(70_000, 70_100))
    fast = jsonio.encode_ids(ids)
    monkeypatch.setattr(jsonio, "_numpy", False)
    assert jsonio.encode_ids(ids) == fast
    assert json.loads(fast) == list(ids)


@pytest.mark.parametrize(
    ("line", "column"),
    [
        ('{"a": 1,\n', 9),  # cut short: the end of this line, not column 1 of a next one
        ('{"a": 1,\r\n', 9),
        ('{"é€": 1 x}\n', 10),  # characters, not bytes
        ("\ufeff{}\n", 1),  # a byte-order mark inside a file is an error where it stands
    ],
)
def test_loads_line_reports_the_column_in_that_line(line, column):
    """A JSONL line's error carries the 1-based column where it is in the line itself."""
    with pytest.raises(jsonio.JSONLineError) as caught:
        jsonio.loads_line(line)
    assert caught.value.column == column
    assert str(caught.value).endswith(f"at column {column}")


def test_loads_line_parses_a_line_as_loads_does():
    """A valid line (with its terminator) parses to the value ``loads`` gives."""
    assert jsonio.loads_line('{"a": [1, "x"]}\r\n') == {"a": [1, "x"]}
