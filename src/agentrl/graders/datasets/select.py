"""Choosing instances by id and count (``--instance``, ``--limit``), shared by import and rollout."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from typing import TypeVar

__all__ = ["UnknownInstance", "select_instances"]

T = TypeVar("T")


class UnknownInstance(LookupError):
    """An ``--instance`` id that names nothing in the tasks or the dataset."""


def select_instances(
    items: Sequence[T],
    key: Callable[[T], str],
    *,
    instances: Sequence[str] = (),
    limit: int | None = None,
) -> list[T]:
    """``items`` whose ``key`` is one of ``instances`` (all when empty), then the first ``limit``.

    The order of ``items`` is kept. An id in ``instances`` that no item has raises
    :class:`UnknownInstance` naming it and its nearest ids.
    """
    chosen = list(items)
    if instances:
        wanted = dict.fromkeys(instances)
        known = {key(item) for item in chosen}
        missing = [name for name in wanted if name not in known]
        if missing:
            raise UnknownInstance(_unknown_message(missing, sorted(known)))
        chosen = [item for item in chosen if key(item) in wanted]
    if limit is not None:
        if limit < 0:
            raise ValueError(f"limit must be at least 0, got {limit}")
        chosen = chosen[:limit]
    return chosen


def _unknown_message(missing: Sequence[str], known: Sequence[str]) -> str:
    parts = []
    for name in missing:
        near = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
        hint = f" (did you mean {', '.join(near)}?)" if near else ""
        parts.append(f"{name!r}{hint}")
    return f"unknown instance id {'; '.join(parts)}: not among the {len(known)} instances"
