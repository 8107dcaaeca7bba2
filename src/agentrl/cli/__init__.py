"""The ``agentrl`` command: one module a command, added to the group ``main.cli``."""

from __future__ import annotations

from agentrl.cli.main import cli, main

__all__ = ["cli", "main"]
