"""OpenAI Chat Completions translation: Codex 0.94 and SDK request shapes, replies and chunks."""

from __future__ import annotations

import functools
import json

import pytest
from middleware_support import FIXTURES, assistant_turn

from agentrl.adapters.base import ProtocolError
from agentrl.adapters.openai_chat import OpenAIChatAdapter, translate_assistant
from agentrl.parsers.base import ToolCall

ADAPTER = OpenAIChatAdapter()
turn = functools.partial(assistant_turn, 2)


def test_codex_094_history_translates():
    """Codex 0.94's system+developer prompt merges; tool_calls arguments become dicts."""
    body = json.loads(
        (FIXTURES / "codex/v0.94.0_wire_api_chat/002_post_v1_chat_completions.json").read_text()
    )["body"]
    chat = ADAPTER.parse_request(body, {})
    assert [m["role"] for m in chat.messages] == [
        "system",
        "user",
        "user",
        "user",
        "assistant",
        "tool",
    ]
    assert "<permissions instructions>" in chat.messages[0]["content"]
    call = chat.messages[4]["tool_calls"][0]["function"]
    assert call["name"] == "shell" and call["arguments"]["command"][0] == "bash"
    assert chat.replayed_ids == ((4, "call_stub_7319ceb62743480c8455"),)
    assert chat.tools[0]["function"]["name"] == "shell"  # Codex 0.94 puts name beside function


def test_reply_message_finish_reasons_and_replay_equality():
    """Tool calls give finish tool_calls and content None; the replay translates back equal."""
    message, finish = ADAPTER.build_message(
        turn(reasoning="r", tool_calls=(ToolCall(name="shell", arguments={"command": ["ls"]}),))
    )
    assert finish == "tool_calls" and message["content"] is None
    assert message["tool_calls"][0]["id"] == "call_t2n0_x"
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"command": ["ls"]}
    recorded, ids = translate_assistant(message, "m")
    assert recorded == {
        "role": "assistant",
        "content": "",
        "reasoning_content": "r",
        "tool_calls": [
            {"type": "function", "function": {"name": "shell", "arguments": {"command": ["ls"]}}}
        ],
    }
    assert ids == ["call_t2n0_x"]
    assert ADAPTER.build_message(turn(text="t", finish_reason="length"))[1] == "length"
    assert ADAPTER.build_message(turn(text="t"))[1] == "stop"


def test_sdk_fields_content_parts_and_limits():
    """Content parts join; max_completion_tokens wins over max_tokens; stream usage is honoured."""
    chat = ADAPTER.parse_request(
        {
            "messages": [
                {"role": "developer", "content": "rules"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
            ],
            "max_tokens": 50,
            "max_completion_tokens": 20,
            "stop": "END",
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        {},
    )
    assert chat.messages == [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "a\nb"},
    ]
    assert (chat.max_tokens, chat.stop, chat.context["include_usage"]) == (20, ("END",), True)


def test_more_than_one_choice_is_refused():
    """n > 1 is a 400: one session turn is one sampled completion."""
    with pytest.raises(ProtocolError) as info:
        ADAPTER.parse_request({"messages": [{"role": "user", "content": "x"}], "n": 2}, {})
    assert info.value.status == 400 and info.value.param == "n"


def test_structured_output_and_logprobs_are_refused_plain_text_is_not():
    """response_format json_object/json_schema and logprobs are 400s; type text and false pass."""
    messages = [{"role": "user", "content": "x"}]
    ADAPTER.parse_request(
        {"messages": messages, "response_format": {"type": "text"}, "logprobs": False}, {}
    )
    for extra, param in [
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {}}}, "response_format"),
        ({"logprobs": True}, "logprobs"),
        ({"top_logprobs": 4}, "top_logprobs"),
    ]:
        with pytest.raises(ProtocolError) as info:
            ADAPTER.parse_request({"messages": messages, **extra}, {})
        assert info.value.status == 400 and info.value.param == param
