"""A protocol answers with plain values: tested by calling it, no server, no request object."""

from __future__ import annotations

import functools

import pytest
from middleware_support import assistant_turn

from agentrl.adapters.anthropic import AnthropicAdapter
from agentrl.adapters.base import Reply
from agentrl.adapters.openai_chat import OpenAIChatAdapter
from agentrl.adapters.openai_responses import OpenAIResponsesAdapter
from agentrl.parsers.base import ToolCall
from agentrl.serve.replies import sse_event

turn = functools.partial(assistant_turn, 1)
CALL = ToolCall(name="Bash", arguments={"command": "ls"})

BODIES = {
    "anthropic": {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
    "openai_chat": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    "openai_responses": {"model": "m", "input": "hi"},
}
ADAPTERS = {
    "anthropic": AnthropicAdapter(),
    "openai_chat": OpenAIChatAdapter(),
    "openai_responses": OpenAIResponsesAdapter(),
}


@pytest.mark.parametrize("name", sorted(ADAPTERS))
@pytest.mark.parametrize("stream", [False, True])
def test_respond_returns_a_reply_of_plain_values(name, stream):
    """JSON body when not streaming, events when streaming; the recorded message either way."""
    adapter = ADAPTERS[name]
    chat = adapter.parse_request({**BODIES[name], "stream": stream}, {})
    reply, recorded = adapter.respond(chat, turn(text="done", tool_calls=(CALL,)))
    assert isinstance(reply, Reply) and reply.status == 200
    assert recorded["role"] == "assistant"
    assert recorded["tool_calls"][0]["function"]["name"] == "Bash"
    if not stream:
        assert reply.events is None and isinstance(reply.body, dict)
        return
    assert reply.body is None and reply.events
    for event, data in reply.events:
        assert event is None or isinstance(event, str)
        assert sse_event(event, data).endswith(b"\n\n")
    # The reply's two forms carry the same answer: the streamed text is the JSON one's.
    text = b"".join(sse_event(e, d) for e, d in reply.events).decode()
    assert "done" in text and "Bash" in text


def test_streamed_events_end_as_each_protocol_ends_them():
    """Messages ends with message_stop, Responses with response.completed, Chat with [DONE]."""
    last = {}
    for name, adapter in ADAPTERS.items():
        chat = adapter.parse_request({**BODIES[name], "stream": True}, {})
        reply, _ = adapter.respond(chat, turn(text="done"))
        last[name] = reply.events[-1][0] or reply.events[-1][1]
    assert last == {
        "anthropic": "message_stop",
        "openai_chat": "[DONE]",
        "openai_responses": "response.completed",
    }


def test_the_public_import_paths_stay():
    """Users' and plugins' imports keep working after the split: ``agentrl.adapters.Middleware``
    is the server in ``agentrl.serve``, and the contract is where plugins import it from."""
    import agentrl
    from agentrl.adapters import Middleware
    from agentrl.adapters.base import Adapter
    from agentrl.serve.middleware import Middleware as Served

    assert Middleware is Served
    assert agentrl.Adapter is Adapter
