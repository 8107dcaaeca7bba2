"""Merging closed intervals ``(start, end)`` with ``start <= end``."""

from __future__ import annotations

from collections.abc import Iterable

Interval = tuple[int, int]


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Merge overlapping or touching intervals; the result is sorted by start."""
    merged: list[Interval] = []
    for start, end in intervals:
        if start > end:
            raise ValueError(f"interval ({start}, {end}) ends before it starts")
        if merged and start <= merged[-1][1] + 1:
            last_start, last_end = merged[-1]
            merged[-1] = (last_start, max(last_end, end))
        else:
            merged.append((start, end))
    return merged


def covered_length(intervals: Iterable[Interval]) -> int:
    """How many integers the intervals cover together (overlaps counted once)."""
    return sum(end - start + 1 for start, end in merge(intervals))
