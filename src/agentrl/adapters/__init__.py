"""Wire-protocol adapters served by the middleware (built-in plugin `agentrl.adapters`).

The contract is :mod:`agentrl.adapters.base`; the built-in protocols are
:mod:`~agentrl.adapters.anthropic` (Messages), :mod:`~agentrl.adapters.openai_responses` and
:mod:`~agentrl.adapters.openai_chat`. ``agentrl.adapters.Middleware`` is the server that
serves them (:mod:`agentrl.serve.middleware`), kept at this path for users and plugins.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentrl.hookspecs import hookimpl

if TYPE_CHECKING:
    from agentrl.serve.middleware import Middleware

__all__ = ["Middleware"]


def __getattr__(name: str) -> object:
    # ``agentrl.adapters.Middleware`` without loading aiohttp when the package is imported.
    if name == "Middleware":
        from agentrl.serve.middleware import Middleware

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
