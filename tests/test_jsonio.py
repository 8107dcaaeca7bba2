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


@given(
    st.lists(st.integers(0, 2**32 - 1), max_size=40),
    st.lists(
        st.tuples(st.integers(0, 45), st.lists(st.integers(0, 2**32 - 1), max_size=8)),
        max_size=6,
    ),
)
def test_ids_text_is_always_encode_ids(first, steps):
    """Whatever each call sends (an extension, the same ids, a shorter or diverging
    sequence), the text is exactly encode_ids' text; extensions reuse the previous one."""
    cache = jsonio.IdsText()
    ids = array("I", first)
    assert cache.encode("s", ids) == jsonio.encode_ids(ids)
    for keep, tail in steps:
        ids = array("I", [*ids[:keep], *tail])
        assert cache.encode("s", ids) == jsonio.encode_ids(ids)


def test_ids_text_reuses_only_a_prefix_it_holds_a_copy_of():
    """An extension reuses the previous text; changing the sent array in place afterwards,
    another typecode, a list or no key never serve a stale text."""
    cache = jsonio.IdsText()
    ids = array("I", range(1000))
    assert cache.encode("s", ids) == jsonio.encode_ids(ids)
    longer = array("I", [*range(1000), 7, 8])
    assert cache.encode("s", longer) == jsonio.encode_ids(longer)
    assert cache.reused == 1000
    longer[3] = 99  # the caller's array changed in place: the copy, not the array, counts
    assert cache.encode("s", longer) == jsonio.encode_ids(longer)
    assert cache.reused == 1000
    assert cache.encode("s", array("Q", longer)) == jsonio.encode_ids(longer)
    assert cache.encode("s", list(longer)) == jsonio.encode_ids(longer)
    assert cache.encode(None, longer) == jsonio.encode_ids(longer)
    assert cache.encode("other", array("I")) == b"[]"
    assert cache.encode("other", array("I", [5])) == b"[5]"


def test_ids_text_holds_at_most_its_budget():
    """Entries past the byte budget drop the least recently used; forget drops one."""
    one = array("I", range(100))
    size = len(one) * one.itemsize + len(jsonio.encode_ids(one))
    cache = jsonio.IdsText(budget_bytes=2 * size + 64)
    for key in ("a", "b", "c"):
        cache.encode(key, one)
    assert cache.held_bytes == 2 * size
    cache.encode("a", array("I", [*one, 1]))  # "a" was dropped ("b" now is): encoded whole
    assert cache.reused == 0
    cache.encode("c", array("I", [*one, 1]))
    assert cache.reused == 100
    cache.forget("c")
    cache.forget("c")
    assert cache.held_bytes == size + 4 + len(b",1")
    none = jsonio.IdsText(budget_bytes=0)
    assert none.encode("a", one) == jsonio.encode_ids(one) and none.held_bytes == 0


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
