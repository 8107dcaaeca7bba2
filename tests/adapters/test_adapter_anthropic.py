"""Anthropic Messages translation: Claude Code's request shapes in, Messages replies out."""

from __future__ import annotations

import functools
import json

import pytest
from middleware_support import FIXTURES, assistant_turn

from agentrl.adapters.anthropic import (
    AnthropicAdapter,
    _block_events,
    translate_assistant,
    visible_blocks,
)
from agentrl.adapters.base import ProtocolError
from agentrl.parsers.base import ToolCall

ADAPTER = AnthropicAdapter()
turn = functools.partial(assistant_turn, 3)


def test_system_blocks_and_mid_list_system_fold_into_user_turns():
    """System text blocks join; a mid-list system message joins the preceding user turn."""
    body = {
        "system": [
            {"type": "text", "text": "A"},
            {"type": "text", "text": "B", "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "task"}]},
            {"role": "system", "content": "env info", "output_config": {"effort": "medium"}},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {"c": 1}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}],
            },
            {"role": "system", "content": [{"type": "text", "text": "late"}]},
        ],
    }
    chat = ADAPTER.parse_request(body, {})
    assert [m["role"] for m in chat.messages] == ["system", "user", "assistant", "tool", "user"]
    assert chat.messages[0]["content"] == "A\nB"
    assert chat.messages[1]["content"] == "task\n\n<system-reminder>\nenv info\n</system-reminder>"
    assert chat.messages[4]["content"] == "<system-reminder>\nlate\n</system-reminder>"
    assert chat.replayed_ids == ((2, "t1"),)


def test_tool_result_forms_and_trailing_text():
    """tool_result content as string, block list and is_error; text after results is a user turn."""
    body = {
        "messages": [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "a", "name": "X", "input": {}},
                    {"type": "tool_use", "id": "b", "name": "X", "input": {}},
                    {"type": "tool_use", "id": "c", "name": "X", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "a", "content": "plain"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "b",
                        "content": [{"type": "text", "text": "l1"}, {"type": "text", "text": "l2"}],
                    },
                    {
                        "type": "tool_result",
                        "tool_use_id": "c",
                        "content": "denied",
                        "is_error": True,
                    },
                    {"type": "text", "text": "<system-reminder>note</system-reminder>"},
                ],
            },
        ]
    }
    chat = ADAPTER.parse_request(body, {})
    assert chat.messages[2:] == [
        {"role": "tool", "content": "plain"},
        {"role": "tool", "content": "l1\nl2"},
        {"role": "tool", "content": "<tool_use_error>denied</tool_use_error>"},
        {"role": "user", "content": "<system-reminder>note</system-reminder>"},
    ]
    assert [wire_id for _, wire_id in chat.replayed_ids] == ["a", "b", "c"]


def test_thinking_blocks_become_reasoning_and_signatures_are_replayed_ids():
    """A replayed thinking block keeps its text as reasoning_content and reports its signature."""
    message, ids = translate_assistant(
        [
            {"type": "thinking", "thinking": "hmm", "signature": "sig-1"},
            {"type": "text", "text": "Answer"},
            {"type": "tool_use", "id": "tu", "name": "Read", "input": {"path": "a"}},
        ],
        "m",
    )
    assert message == {
        "role": "assistant",
        "content": "Answer",
        "reasoning_content": "hmm",
        "tool_calls": [
            {"type": "function", "function": {"name": "Read", "arguments": {"path": "a"}}}
        ],
    }
    assert ids == ["sig-1", "tu"]


def test_tools_convert_and_server_tools_are_skipped():
    """input_schema becomes function parameters; tools without one (server tools) are dropped."""
    body = {
        "messages": [{"role": "user", "content": "x"}],
        "tools": [
            {
                "name": "Read",
                "description": "read",
                "input_schema": {"type": "object", "properties": {"p": {"type": "string"}}},
            },
            {"type": "web_search_20250305", "name": "web_search"},
        ],
        "thinking": {"type": "adaptive"},
        "context_management": {"edits": []},
        "output_config": {"effort": "high"},
        "metadata": {"user_id": "u"},
        "temperature": 0.5,
        "stop_sequences": ["END"],
        "max_tokens": 100,
    }
    chat = ADAPTER.parse_request(body, {})
    assert chat.tools == [
        {
            "type": "function",
            "function": {
                "name": "Read",
                "description": "read",
                "parameters": {"type": "object", "properties": {"p": {"type": "string"}}},
            },
        }
    ]
    assert (chat.temperature, chat.stop, chat.max_tokens) == (0.5, ("END",), 100)


def test_every_captured_claude_code_request_parses():
    """All captured Claude Code bodies translate; the leading message is the system prompt."""
    for path in sorted((FIXTURES / "claude_code").rglob("*_post_v1_messages.json")):
        request = json.loads(path.read_text())
        chat = ADAPTER.parse_request(request["body"], request["headers"])
        assert chat.messages[0]["role"] == "system"
        assert all(isinstance(m["content"], str) for m in chat.messages)
        assert "system" not in [m["role"] for m in chat.messages[1:]]
        assert chat.stream is True


@pytest.mark.parametrize(
    ("kwargs", "stop_reason"),
    [
        ({"tool_calls": (ToolCall(name="Bash", arguments={"c": "ls"}),)}, "tool_use"),
        ({"text": "cut", "finish_reason": "length"}, "max_tokens"),
        ({"text": "done"}, "end_turn"),
    ],
)
def test_reply_blocks_and_stop_reasons(kwargs, stop_reason):
    """Replies carry thinking/text/tool_use blocks with the matching stop_reason."""
    blocks, reason = ADAPTER.build_blocks(turn(reasoning="think", **kwargs))
    assert reason == stop_reason
    assert blocks[0] == {"type": "thinking", "thinking": "think", "signature": "sealed-thinking-3"}
    if "tool_calls" in kwargs:
        assert blocks[-1] == {
            "type": "tool_use",
            "id": "toolu_t3n0_x",
            "name": "Bash",
            "input": {"c": "ls"},
        }
    recorded, _ = translate_assistant(blocks, "reply")
    assert recorded["reasoning_content"] == "think"


def test_empty_output_is_one_empty_text_block():
    """Nothing sampled (budget exhausted) still gives a valid message with one empty text block."""
    blocks, reason = ADAPTER.build_blocks(turn(finish_reason="length"))
    assert blocks == [{"type": "text", "text": ""}] and reason == "max_tokens"


def test_thinking_stream_events_carry_the_signature():
    """A thinking block streams thinking_delta then signature_delta between start and stop."""
    events = _block_events(0, {"type": "thinking", "thinking": "t", "signature": "s"})
    assert [e["type"] for e in events] == [
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
    ]
    assert events[2]["delta"] == {"type": "signature_delta", "signature": "s"}


def test_unknown_role_is_rejected_naming_the_field():
    """A role other than user/assistant/system is a 400 naming messages[i].role."""
    with pytest.raises(ProtocolError) as info:
        ADAPTER.parse_request({"messages": [{"role": "tool", "content": "x"}]}, {})
    assert info.value.status == 400 and info.value.message.startswith("messages[0].role:")


@pytest.mark.parametrize(
    ("message", "error"),
    [
        ("x", "messages[0]: expected an object, got str"),
        ({"role": "user", "content": 3}, "messages[0].content: expected an array, got int"),
        ({"role": "user", "content": [7]}, "messages[0].content[0]: expected an object, got int"),
        (
            {"role": "user", "content": [{"type": "text", "text": 1}]},
            "messages[0].content[0][0].text: expected a string, got int",  # the block as a list
        ),
        ({"role": "assistant", "content": {}}, "messages[0].content: expected an array, got dict"),
        (
            {"role": "assistant", "content": [None]},
            "messages[0].content[0]: expected an object, got null",
        ),
        (
            {"role": "assistant", "content": [{"type": "thinking", "thinking": []}]},
            "messages[0].content[0].thinking: expected a string, got list",
        ),
        (
            {"role": "assistant", "content": [{"type": "tool_use", "input": {}}]},
            "messages[0].content[0].name: expected a string, got null",
        ),
        (
            {"role": "assistant", "content": [{"type": "tool_use", "name": "f", "input": []}]},
            "messages[0].content[0].input: expected an object, got list",
        ),
    ],
)
def test_a_malformed_block_is_a_400_naming_its_field(message, error):
    """Every type check on a message's blocks names the field that failed (the names are
    written only for the error)."""
    with pytest.raises(ProtocolError) as info:
        ADAPTER.parse_request({"messages": [message]}, {})
    assert info.value.status == 400 and info.value.message == error


def _captured_body(scenario: str) -> dict:
    return json.loads((FIXTURES / "claude_code" / scenario).read_text())["body"]


@pytest.mark.parametrize(
    ("thinking", "display"),
    [
        (None, "hidden"),
        ({"type": "disabled"}, "hidden"),
        ({"type": "enabled", "budget_tokens": 2048}, "full"),
        ({"type": "adaptive", "display": "updates"}, "full"),  # what Claude Code sends
        ({"type": "adaptive", "display": "omitted"}, "omitted"),
    ],
)
def test_thinking_display_follows_the_request(thinking, display):
    """Thinking blocks are shown only when the request enabled thinking; omitted keeps them empty."""
    body = {"messages": [{"role": "user", "content": "hi"}]}
    if thinking is not None:
        body["thinking"] = thinking
    assert ADAPTER.parse_request(body, {}).context["thinking"] == display


def test_claude_code_gets_thinking_and_its_session_title_request_is_served():
    """Claude Code's agent loop enables thinking; its title request (JSON schema) is accepted.

    ``output_config.format`` is not enforced (decoding is never constrained); the title request
    asks no thinking, so its reply is text only.
    """
    loop = ADAPTER.parse_request(_captured_body("001_post_v1_messages.json"), {})
    assert loop.context["thinking"] == "full"
    title_body = _captured_body("interactive_session_title/002_post_v1_messages.json")
    assert title_body["output_config"]["format"]["type"] == "json_schema"
    title = ADAPTER.parse_request(title_body, {})
    assert title.context["thinking"] == "hidden"


def test_hidden_thinking_leaves_the_text_first_and_the_recorded_message_whole():
    """Hidden: the thinking block is dropped from the reply only; omitted: sent empty, signed."""
    blocks, _ = ADAPTER.build_blocks(turn(reasoning="think", text="answer"))
    assert visible_blocks(blocks, "hidden") == [{"type": "text", "text": "answer"}]
    omitted = visible_blocks(blocks, "omitted")
    assert omitted[0] == {"type": "thinking", "thinking": "", "signature": "sealed-thinking-3"}
    assert visible_blocks(blocks, "full") == blocks
    only_reasoning, _ = ADAPTER.build_blocks(turn(reasoning="cut off", finish_reason="length"))
    assert visible_blocks(only_reasoning, "hidden") == [{"type": "text", "text": ""}]
    _, ids = translate_assistant(omitted, "messages[1].content")
    assert ids == ["sealed-thinking-3"]  # the signature still maps the replay to its turn
    events = _block_events(0, omitted[0])
    assert [e["delta"]["type"] for e in events if e["type"] == "content_block_delta"] == [
        "signature_delta"
    ]
