"""OpenAI Responses translation: Codex 0.171's input items and tools in, output items out."""

from __future__ import annotations

import functools
import json

import pytest
from middleware_support import FIXTURES, assistant_turn

from agentrl.adapters.base import ProtocolError
from agentrl.adapters.openai_responses import OpenAIResponsesAdapter, ToolTable, translate_input
from agentrl.parsers.base import ToolCall

ADAPTER = OpenAIResponsesAdapter()
turn = functools.partial(assistant_turn, 1)


def fixture_body(name: str) -> dict:
    return json.loads((FIXTURES / "codex" / name).read_text())["body"]


def test_codex_history_translates_to_one_system_prompt_then_turns():
    """Leading developer messages merge into the system prompt; calls and outputs pair up."""
    chat = ADAPTER.parse_request(fixture_body("002_post_v1_responses.json"), {})
    roles = [m["role"] for m in chat.messages]
    assert roles == ["system", "user", "user", "assistant", "tool"]
    assert chat.messages[0]["content"].startswith("You are a coding agent running in the Codex CLI")
    assert "<permissions instructions>" in chat.messages[0]["content"]
    call = chat.messages[3]["tool_calls"][0]["function"]
    assert call["name"] == "exec_command" and isinstance(call["arguments"], dict)
    assert call["arguments"]["workdir"] == "/workspace/cx_basic/repo"
    assert {wire_id for _, wire_id in chat.replayed_ids} == {
        "fc_stub_8291527bb3764ecc",
        "call_stub_f602f1ba9d0942d7bb60",
    }
    names = [t["function"]["name"] for t in chat.tools]
    assert "exec_command" in names and "spawn_agent" in names  # namespace members flattened
    assert "web_search" not in names  # hosted tool: the policy cannot call it


def test_code_mode_additional_tools_and_custom_tool_call():
    """additional_tools items add the freeform exec tool; a custom_tool_call replays as input."""
    chat = ADAPTER.parse_request(
        fixture_body("default_model_code_mode/002_post_v1_responses.json"), {}
    )
    tools = {t["function"]["name"]: t["function"] for t in chat.tools}
    assert tools["exec"]["parameters"]["required"] == ["input"]
    assert "lark" in tools["exec"]["description"]
    assert "sleep" in tools and "wait" in tools
    assistant = next(m for m in chat.messages if m["role"] == "assistant")
    call = assistant["tool_calls"][0]["function"]
    assert call["name"] == "exec" and call["arguments"]["input"].startswith("const r = await")
    table: ToolTable = chat.context["tools"]
    assert table.by_chat_name["exec"] == ("exec", None, True)


def test_custom_and_namespaced_calls_reply_in_their_wire_forms():
    """A call to a freeform tool is a custom_tool_call; a namespaced one carries its namespace."""
    body = {
        "input": "go",
        "tools": [
            {"type": "custom", "name": "apply_patch", "description": "patch"},
            {
                "type": "namespace",
                "name": "multi_agent_v1",
                "tools": [
                    {"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}}
                ],
            },
        ],
    }
    chat = ADAPTER.parse_request(body, {})
    output = ADAPTER.build_output(
        chat,
        turn(
            reasoning="why",
            tool_calls=(
                ToolCall(name="apply_patch", arguments={"input": "*** Begin Patch"}),
                ToolCall(name="spawn_agent", arguments={"message": "hi"}),
            ),
        ),
    )
    assert [item["type"] for item in output] == ["reasoning", "custom_tool_call", "function_call"]
    assert output[1]["input"] == "*** Begin Patch" and output[1]["call_id"] == "call_t1n0_x"
    assert output[2]["namespace"] == "multi_agent_v1"
    assert json.loads(output[2]["arguments"]) == {"message": "hi"}
    replayed, ids = translate_input(output, None, chat.context["tools"])
    assert replayed[0]["reasoning_content"] == "why"
    assert [c["function"]["name"] for c in replayed[0]["tool_calls"]] == [
        "apply_patch",
        "spawn_agent",
    ]
    assert "sealed-reasoning-1" in [wire_id for _, wire_id in ids]


def test_same_function_name_in_two_namespaces_stays_distinct():
    """When two namespaces share a function name, the second is shown as namespace.name."""
    table = ToolTable()
    table.add_all(
        [
            {"type": "function", "name": "wait", "parameters": {}},
            {
                "type": "namespace",
                "name": "collab",
                "tools": [{"type": "function", "name": "wait"}],
            },
        ],
        "tools",
    )
    assert [s["function"]["name"] for s in table.schemas] == ["wait", "collab.wait"]
    assert table.chat_name("wait", "collab") == "collab.wait"
    assert table.by_chat_name["collab.wait"] == ("wait", "collab", False)


def test_length_without_tool_call_is_an_incomplete_response():
    """finish_reason length maps to status incomplete with reason max_output_tokens."""
    chat = ADAPTER.parse_request({"input": "x", "max_output_tokens": 3}, {})
    assert chat.max_tokens == 3
    output = ADAPTER.build_output(chat, turn(text="par", finish_reason="length"))
    assert output == [
        {
            "type": "message",
            "id": "msg_t1n0_x",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "par", "annotations": []}],
        }
    ]


def test_every_captured_codex_responses_request_parses():
    """All captured Responses bodies translate to string-content chat messages."""
    for path in sorted((FIXTURES / "codex").rglob("*_post_v1_responses.json")):
        chat = ADAPTER.parse_request(json.loads(path.read_text())["body"], {})
        assert chat.messages[0]["role"] == "system" and chat.stream is True
        assert all(isinstance(m["content"], str) for m in chat.messages)


def test_stateless_and_unsupported_options_are_refused_but_their_defaults_pass():
    """previous_response_id, structured output and log-probs are 400s; null / plain text pass.

    What Codex sends (``store: false``, ``include: ["reasoning.encrypted_content"]``,
    ``text: {"verbosity": ...}``, the full history) still parses: see the test above.
    """
    ADAPTER.parse_request(
        {"input": "x", "previous_response_id": None, "text": {"format": {"type": "text"}}}, {}
    )
    for extra, param in [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format"),
        ({"text": {"format": {"type": "json_object"}}}, "text.format"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
    ]:
        with pytest.raises(ProtocolError) as info:
            ADAPTER.parse_request({"input": "x", **extra}, {})
        assert info.value.status == 400 and info.value.param == param
