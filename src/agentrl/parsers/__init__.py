"""Tool-call and reasoning parsers (built-in plugin `agentrl.parsers`)."""

from __future__ import annotations

from agentrl.hookspecs import hookimpl


@hookimpl(trylast=True)
def register_parsers(register):
    """Register the built-in classes; heavy dependencies load only when one is used."""
