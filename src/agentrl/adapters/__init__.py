"""Wire-protocol adapters served by the middleware (built-in plugin `agentrl.adapters`)."""

from __future__ import annotations

from agentrl.hookspecs import hookimpl


@hookimpl(trylast=True)
def register_adapters(register):
    """Register the built-in classes; heavy dependencies load only when one is used."""
    from agentrl.adapters.anthropic import AnthropicAdapter
    from agentrl.adapters.openai_chat import OpenAIChatAdapter
    from agentrl.adapters.openai_responses import OpenAIResponsesAdapter

    register(AnthropicAdapter)
    register(OpenAIResponsesAdapter)
    register(OpenAIChatAdapter)
