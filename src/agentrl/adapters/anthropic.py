"""Anthropic Messages API, as Claude Code 2.1.x speaks it.

Requests: ``POST /v1/messages?beta=true`` with ``system`` as text blocks (with
``cache_control``), ``role: "system"`` messages in the middle of the list, ``tool_use`` /
``tool_result`` blocks (string, list and ``is_error`` forms), thinking blocks with
signatures, and fields that do not apply to a local policy (``context_management``,
``output_config`` — its ``format`` included: Claude Code's session-title request asks for a
JSON schema, which is not enforced — and ``metadata``), which are accepted and ignored.
Replies: thinking, text and tool_use blocks with ``stop_reason`` ``tool_use`` /
``end_turn`` / ``max_tokens``, as JSON or as the SSE sequence ``message_start`` …
``message_stop``. Thinking blocks reach only a client that enabled thinking (``thinking``
with a ``type`` other than ``disabled``: ``enabled``, ``adaptive``, …; ``display:
"omitted"`` sends them empty, signature kept); the recorded assistant message always keeps
the reasoning the policy sampled.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Mapping
from typing import Any

from agentrl.adapters.base import Adapter, AssistantTurn, ChatRequest, ProtocolError, Reply
from agentrl.adapters.wire import (
    chat_tool_call,
    content_text,
    expect_type,
    fold_system_messages_with_ids,
    function_tool,
    positive_int_field,
    sampling_hints,
)

__all__ = ["AnthropicAdapter"]

logger = logging.getLogger(__name__)

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "request_too_large",
    431: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def _block_text(block: Mapping[str, Any], field: str) -> str | None:
    kind = block.get("type")
    if kind == "text":
        return _text_field(block, "text", field)
    if kind in ("image", "document"):
        return f"[{kind} omitted]"
    if isinstance(block.get("text"), str):
        return block["text"]
    return None


def _text_of(content: Any, field: str) -> str:
    """Join the text of a string or a list of content blocks (images become a marker)."""
    return content_text(content, field, _block_text)


def _tool_result_text(block: Mapping[str, Any], field: str) -> str:
    text = _text_of(block.get("content"), f"{field}.content")
    if block.get("is_error") is True and not text.startswith("<tool_use_error>"):
        text = f"<tool_use_error>{text}</tool_use_error>"
    return text


def _text_field(block: Mapping[str, Any], key: str, field: str) -> str:
    """``block[key]`` as a string ("" when absent), a 400 naming ``field.key`` otherwise.

    The field's name is written only for the error: a request holds thousands of blocks.
    """
    value = block.get(key)
    if type(value) is str:
        return value
    return expect_type(value, str, f"{field}.{key}") or ""


def translate_assistant(content: Any, field: str) -> tuple[dict[str, Any], list[str]]:
    """An assistant message's blocks as one chat message, plus the wire ids it carries."""
    if isinstance(content, str):
        return {"role": "assistant", "content": content}, []
    if type(content) is not list:
        expect_type(content, list, field, optional=False)
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    ids: list[str] = []
    for i, block in enumerate(content):
        if type(block) is not dict:
            expect_type(block, dict, f"{field}[{i}]", optional=False)
        kind = block.get("type")
        if kind == "text":
            texts.append(_text_field(block, "text", f"{field}[{i}]"))
        elif kind == "thinking":
            thinking.append(_text_field(block, "thinking", f"{field}[{i}]"))
            if isinstance(block.get("signature"), str):
                ids.append(block["signature"])
        elif kind in ("tool_use", "server_tool_use"):
            name, arguments = block.get("name"), block.get("input")
            if type(name) is not str:
                name = expect_type(name, str, f"{field}[{i}].name", optional=False)
            if type(arguments) is not dict:
                arguments = expect_type(arguments, dict, f"{field}[{i}].input")
            calls.append(chat_tool_call(name, arguments or {}))
            if isinstance(block.get("id"), str):
                ids.append(block["id"])
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if thinking:
        message["reasoning_content"] = "".join(thinking)
    if calls:
        message["tool_calls"] = calls
    return message, ids


def translate_messages(
    raw_messages: Any, system: Any
) -> tuple[list[dict[str, Any]], tuple[tuple[int, str], ...]]:
    """Anthropic ``system`` + ``messages`` -> chat-template messages and replayed ids."""
    expect_type(raw_messages, list, "messages", optional=False)
    messages: list[dict[str, Any]] = []
    system_text = _text_of(system, "system")
    if system_text:
        messages.append({"role": "system", "content": system_text})
    pending_ids: list[tuple[int, str]] = []
    for i, raw in enumerate(raw_messages):
        field = f"messages[{i}]"
        if type(raw) is not dict:
            expect_type(raw, dict, field, optional=False)
        role = raw.get("role")
        content = raw.get("content")
        if role == "assistant":
            message, ids = translate_assistant(content, f"{field}.content")
            pending_ids.extend((len(messages), wire_id) for wire_id in ids)
            messages.append(message)
        elif role == "system":
            messages.append({"role": "system", "content": _text_of(content, f"{field}.content")})
        elif role == "user":
            if isinstance(content, str):
                messages.append({"role": "user", "content": content})
                continue
            if type(content) is not list:
                expect_type(content, list, f"{field}.content", optional=False)
            texts: list[str] = []
            for j, block in enumerate(content):
                bfield = f"{field}.content[{j}]"
                if type(block) is not dict:
                    expect_type(block, dict, bfield, optional=False)
                if block.get("type") == "tool_result":
                    if texts:
                        messages.append({"role": "user", "content": "\n".join(texts)})
                        texts = []
                    messages.append({"role": "tool", "content": _tool_result_text(block, bfield)})
                else:
                    texts.append(_text_of([block], bfield))
            if texts:
                messages.append({"role": "user", "content": "\n".join(texts)})
        else:
            raise ProtocolError(
                400,
                f"{field}.role: expected 'user', 'assistant' or 'system', got {role!r}",
                param=f"{field}.role",
            )
    return fold_system_messages_with_ids(messages, pending_ids)


def translate_tools(raw_tools: Any) -> list[dict[str, Any]] | None:
    expect_type(raw_tools, list, "tools")
    tools = []
    for i, tool in enumerate(raw_tools or ()):
        expect_type(tool, dict, f"tools[{i}]", optional=False)
        name = expect_type(tool.get("name"), str, f"tools[{i}].name", optional=False)
        if "input_schema" not in tool:
            # A server tool (web_search_…): the policy cannot call it through this proxy.
            logger.debug("skipping Anthropic server tool %s (%s)", name, tool.get("type"))
            continue
        description = expect_type(tool.get("description"), str, f"tools[{i}].description")
        tools.append(function_tool(name, description or "", tool.get("input_schema")))
    return tools or None


class AnthropicAdapter(Adapter):
    """Anthropic Messages (``/v1/messages``, ``/v1/messages/count_tokens``)."""

    name = "anthropic"
    routes = (
        ("POST", "/v1/messages", "turn"),
        ("POST", "/v1/messages/count_tokens", "count"),
    )

    def parse_request(self, body: Any, headers: Mapping[str, str]) -> ChatRequest:
        expect_type(body, dict, "body", optional=False)
        messages, replayed = translate_messages(body.get("messages"), body.get("system"))
        if not messages:
            raise ProtocolError(400, "messages: expected at least one message", param="messages")
        stream = expect_type(body.get("stream"), bool, "stream")
        for key in ("metadata", "context_management", "output_config"):
            expect_type(body.get(key), dict, key)
        thinking = expect_type(body.get("thinking"), dict, "thinking") or {}
        # Any thinking mode but "disabled" (enabled, adaptive, between_tools) shows thinking.
        if thinking.get("type") in (None, "disabled"):
            display = "hidden"
        else:
            display = "omitted" if thinking.get("display") == "omitted" else "full"
        return ChatRequest(
            messages=messages,
            tools=translate_tools(body.get("tools")),
            stream=bool(stream),
            model=expect_type(body.get("model"), str, "model") or "",
            max_tokens=positive_int_field(body, "max_tokens"),
            **sampling_hints(body, stop_key="stop_sequences"),
            replayed_ids=replayed,
            context={"thinking": display},
        )

    def error_body(self, error: ProtocolError) -> dict[str, Any]:
        kind = error.kind or _ERROR_TYPES.get(error.status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": error.message}}

    # -- replies ---------------------------------------------------------------------

    def build_blocks(self, turn: AssistantTurn) -> tuple[list[dict[str, Any]], str]:
        blocks: list[dict[str, Any]] = []
        if turn.reasoning:
            blocks.append(
                {
                    "type": "thinking",
                    "thinking": turn.reasoning,
                    "signature": turn.seal("thinking", turn.reasoning),
                }
            )
        if turn.text:
            blocks.append({"type": "text", "text": turn.text})
        for index, call in enumerate(turn.tool_calls):
            arguments = call.arguments if isinstance(call.arguments, dict) else {}
            blocks.append(
                {
                    "type": "tool_use",
                    "id": turn.mint("toolu", index),
                    "name": call.name,
                    "input": arguments,
                }
            )
        if not blocks:
            blocks.append({"type": "text", "text": ""})
        if turn.tool_calls:
            stop_reason = "tool_use"
        elif turn.finish_reason == "length":
            stop_reason = "max_tokens"
        else:
            stop_reason = "end_turn"
        return blocks, stop_reason

    def respond(
        self, chat: ChatRequest, turn: AssistantTurn
    ) -> tuple[Reply, dict[str, Any] | None]:
        blocks, stop_reason = self.build_blocks(turn)
        # Recorded with its reasoning whatever the client sees: that is what was sampled,
        # and a replay without the thinking block is restored to it by its other wire ids.
        recorded, _ = translate_assistant(blocks, "reply")
        blocks = visible_blocks(blocks, chat.context.get("thinking", "full"))
        usage = {
            "input_tokens": turn.prompt_tokens,
            "output_tokens": turn.output_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }
        message = {
            "id": f"msg_{secrets.token_hex(12)}",
            "type": "message",
            "role": "assistant",
            "model": chat.model,
            "content": blocks,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": usage,
        }
        if not chat.stream:
            return Reply(message), recorded
        start = {**message, "content": [], "stop_reason": None, "usage": {**usage}}
        start["usage"]["output_tokens"] = 0
        events = [{"type": "message_start", "message": start}, {"type": "ping"}]
        for index, block in enumerate(blocks):
            events += _block_events(index, block)
        events += [
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": turn.output_tokens},
            },
            {"type": "message_stop"},
        ]
        return Reply(events=tuple((e["type"], e) for e in events)), recorded


def visible_blocks(blocks: list[dict[str, Any]], display: str) -> list[dict[str, Any]]:
    """The reply's blocks as the client asked to see thinking: ``full``, ``omitted``, ``hidden``."""
    if display == "full":
        return blocks
    if display == "omitted":
        return [{**b, "thinking": ""} if b["type"] == "thinking" else b for b in blocks]
    shown = [b for b in blocks if b["type"] != "thinking"]
    return shown or [{"type": "text", "text": ""}]


def _block_events(index: int, block: dict[str, Any]) -> list[dict[str, Any]]:
    kind = block["type"]
    if kind == "thinking":
        start = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = (
            [{"type": "thinking_delta", "thinking": block["thinking"]}] if block["thinking"] else []
        )
        deltas.append({"type": "signature_delta", "signature": block["signature"]})
    elif kind == "text":
        start = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": block["text"]}] if block["text"] else []
    else:
        start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        partial = json.dumps(block["input"], ensure_ascii=False)
        deltas = [{"type": "input_json_delta", "partial_json": partial}]
    events = [{"type": "content_block_start", "index": index, "content_block": start}]
    events += [{"type": "content_block_delta", "index": index, "delta": d} for d in deltas]
    events.append({"type": "content_block_stop", "index": index})
    return events
