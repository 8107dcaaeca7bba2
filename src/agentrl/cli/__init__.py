"""The ``agentrl`` command: the group ``group.cli`` and one module a command.

The commands are added by the built-in plugin :mod:`agentrl.cli.commands` through the
``register_commands`` hook, the same way a third-party plugin adds its own. Importing this
package (the plugin registry does, to find that plugin) loads neither click nor a command.
"""

from __future__ import annotations

from typing import Any

__all__ = ["cli", "main"]


def main(argv: list[str] | None = None) -> None:
    """The console entry point (``agentrl``); see :func:`agentrl.cli.group.main`."""
    from agentrl.cli.group import main as run

    run(argv)


def __getattr__(name: str) -> Any:
    if name == "cli":
        from agentrl.cli.group import cli

        return cli
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
