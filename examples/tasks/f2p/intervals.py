"""Fail-to-pass tests for intervals.merge on unsorted input.

The strings below are full of shell metacharacters on purpose: $HOME, `id`, $(whoami),
'single' and "double" quotes, a backslash \\ and ; | & > < * ? ~ # ! — the grader must write
this file verbatim, never through a shell.
"""

import sys

import pytest

from intervals import covered_length, merge

CASES = {
    "unsorted $(whoami) `id` $HOME": ([(8, 9), (1, 3), (2, 5)], [(1, 5), (8, 9)]),
    "reversed 'single' \"double\" ; | & > < * ? ~ # !": (
        [(10, 12), (4, 6), (1, 3)],
        [(1, 6), (10, 12)],
    ),
    "touching after sort \\n \\t": ([(3, 4), (1, 2)], [(1, 4)]),
}


def test_labels_arrived_verbatim():
    assert "$(whoami) `id` $HOME" in next(iter(CASES))
    assert "backslash \\ and" in __doc__


@pytest.mark.parametrize("label", sorted(CASES))
def test_merge_unsorted(label):
    given, expected = CASES[label]
    assert merge(given) == expected


def test_covered_length_unsorted():
    assert covered_length([(5, 6), (1, 2), (2, 3)]) == 5


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
