import pytest

from intervals import covered_length, merge


def test_merge_sorted_overlapping():
    assert merge([(1, 3), (2, 5), (8, 9)]) == [(1, 5), (8, 9)]


def test_merge_touching():
    assert merge([(1, 2), (3, 4)]) == [(1, 4)]


def test_rejects_reversed_interval():
    with pytest.raises(ValueError):
        merge([(5, 1)])


def test_covered_length_sorted():
    assert covered_length([(1, 3), (3, 4)]) == 4
