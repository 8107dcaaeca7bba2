"""Closed integer intervals."""

from intervals.merge import covered_length, merge

__all__ = ["covered_length", "merge"]
