"""Wire-protocol adapters served by the middleware (built-in plugin `agentrl.adapters`)."""

from __future__ import annotations

from agentrl.hookspecs import hookimpl


@hookimpl(trylast=True)
def register_adapters(register):
    """Register the built-in classes; heavy dependencies load only when one is used."""
