"""Property: what a client replays of a reply translates back to exactly the recorded message.

The trajectory routes the next turn by comparing the replayed assistant message with the
one recorded for the turn, so for every protocol and every possible parsed turn the reply
(serialised to JSON and back, as the client stores it) must translate to an equal message.
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.adapters import anthropic, openai_chat, openai_responses
from agentrl.adapters.base import AssistantTurn
from agentrl.parsers.base import ToolCall

TOOLS = ("Bash", "Write", "exec", "spawn_agent")
RESPONSES_TOOLS = [
    {"type": "function", "name": "Bash", "parameters": {"type": "object"}},
    {"type": "function", "name": "Write", "parameters": {"type": "object"}},
    {"type": "custom", "name": "exec", "description": "JavaScript"},
    {
        "type": "namespace",
        "name": "multi_agent_v1",
        "tools": [{"type": "function", "name": "spawn_agent"}],
    },
]

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)


@st.composite
def turns(draw) -> AssistantTurn:
    calls = []
    for name in draw(st.lists(st.sampled_from(TOOLS), max_size=3)):
        if name == "exec":
            arguments = {"input": draw(text)}
        else:
            arguments = draw(st.dictionaries(text, json_values, max_size=3))
        calls.append(ToolCall(name=name, arguments=arguments))
    counter = iter(range(10_000))
    return AssistantTurn(
        turn_index=draw(st.integers(0, 500)),
        text=draw(text),
        reasoning=draw(st.none() | text),
        tool_calls=tuple(calls),
        finish_reason=draw(st.sampled_from(["stop", "length"])),
        prompt_tokens=10,
        output_tokens=5,
        mint=lambda kind, index: f"{kind}_n{next(counter)}",
        seal=lambda kind, value: f"agentrl1.{kind}.t0..{next(counter)}",
    )


def client_roundtrip(value):
    return json.loads(json.dumps(value, ensure_ascii=False))


@settings(max_examples=150, deadline=None)
@given(turns())
def test_anthropic_replay_translates_to_the_recorded_message(turn):
    """Anthropic: replayed content blocks give back the recorded assistant message."""
    blocks, _ = anthropic.AnthropicAdapter().build_blocks(turn)
    recorded, _ = anthropic.translate_assistant(blocks, "reply")
    replayed, ids = anthropic.translate_assistant(client_roundtrip(blocks), "messages[1].content")
    assert replayed == recorded
    assert len(ids) == len(turn.tool_calls) + (1 if turn.reasoning else 0)


@settings(max_examples=150, deadline=None)
@given(turns())
def test_responses_replay_translates_to_the_recorded_message(turn):
    """Responses: replayed output items give back the recorded assistant message."""
    adapter = openai_responses.OpenAIResponsesAdapter()
    chat = adapter.parse_request({"input": "go", "tools": RESPONSES_TOOLS}, {})
    output = adapter.build_output(chat, turn)
    recorded = openai_responses.translate_input(output, None, chat.context["tools"])[0]
    history = [{"type": "message", "role": "user", "content": "go"}, *client_roundtrip(output)]
    replayed = adapter.parse_request({"input": history, "tools": RESPONSES_TOOLS}, {})
    assert replayed.messages[1:] == recorded
    kinds = {item["type"] for item in output}
    assert ("custom_tool_call" in kinds) == any(c.name == "exec" for c in turn.tool_calls)


@settings(max_examples=150, deadline=None)
@given(turns())
def test_chat_replay_translates_to_the_recorded_message(turn):
    """Chat Completions: the replayed assistant message gives back the recorded one."""
    message, _ = openai_chat.OpenAIChatAdapter().build_message(turn)
    recorded, _ = openai_chat.translate_assistant(message, "reply")
    replayed, ids = openai_chat.translate_assistant(client_roundtrip(message), "messages[1]")
    assert replayed == recorded
    assert len(ids) == len(turn.tool_calls)
