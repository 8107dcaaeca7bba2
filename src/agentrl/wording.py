"""How agentrl says numbers of things in messages: ``1 rollout``, ``2 rollouts``."""

from __future__ import annotations

__all__ = ["count"]


def count(number: int, noun: str, plural: str | None = None) -> str:
    """``number`` and ``noun``, the noun plural unless ``number`` is 1 (``plural``, else
    ``noun + "s"``): ``count(1, "turn")`` is ``1 turn``, ``count(0, "turn")`` ``0 turns``."""
    return f"{number} {noun if number == 1 else (plural or noun + 's')}"
