"""Wire-protocol adapters served by the middleware (built-in plugin `agentrl.adapters`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentrl.hookspecs import hookimpl

if TYPE_CHECKING:
    from agentrl.adapters.middleware import Middleware

__all__ = ["Middleware"]


def __getattr__(name: str) -> object:
    # ``agentrl.adapters.Middleware`` without loading aiohttp when the package is imported.
    if name == "Middleware":
        from agentrl.adapters.middleware import Middleware

        return Middleware
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@hookimpl(trylast=True)
def register_adapters(register):
    """Register the built-in classes; heavy dependencies load only when one is used."""
    from agentrl.adapters.anthropic import AnthropicAdapter
    from agentrl.adapters.openai_chat import OpenAIChatAdapter
    from agentrl.adapters.openai_responses import OpenAIResponsesAdapter

    register(AnthropicAdapter)
    register(OpenAIResponsesAdapter)
    register(OpenAIChatAdapter)
