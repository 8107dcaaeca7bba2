"""The harness layer's error type."""

from __future__ import annotations

__all__ = ["HarnessError"]


class HarnessError(Exception):
    """The harness could not install, configure or launch its CLI."""
