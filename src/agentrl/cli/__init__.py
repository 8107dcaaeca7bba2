"""The ``agentrl`` command: the group ``main.cli`` and one module a command.

The commands are added by the built-in plugin :mod:`agentrl.cli.commands` through the
``register_commands`` hook, the same way a third-party plugin adds its own.
"""

from __future__ import annotations

from agentrl.cli.main import cli, main

__all__ = ["cli", "main"]
