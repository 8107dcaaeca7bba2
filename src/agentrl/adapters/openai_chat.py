"""OpenAI Chat Completions, for Codex up to 0.94 (``wire_api = "chat"``) and OpenAI SDK clients.

Requests: ``messages`` (``system``, ``developer``, ``user``, ``assistant`` with
``tool_calls`` whose ``arguments`` are JSON strings, ``tool``), ``tools`` (including
Codex 0.94's shape with ``name`` beside ``function``). Replies: one choice with
``content``, ``reasoning_content`` and ``tool_calls``, as JSON or as
``chat.completion.chunk`` events ending in ``data: [DONE]``. Structured output
(``response_format`` other than ``text``) and log-probs (``logprobs: true``,
``top_logprobs``) are refused with a 400.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Mapping
from typing import Any

from agentrl.adapters.base import Adapter, AssistantTurn, ChatRequest, ProtocolError, Reply
from agentrl.adapters.wire import (
    chat_tool_call,
    content_text,
    dump_arguments,
    expect_type,
    fold_system_messages_with_ids,
    function_tool,
    int_field,
    parse_arguments,
    positive_int_field,
    refuse_logprobs,
    refuse_structured_output,
    sampling_hints,
)

__all__ = ["OpenAIChatAdapter"]

logger = logging.getLogger(__name__)


def _part_text(part: Mapping[str, Any], field: str) -> str | None:
    kind = part.get("type")
    if kind in ("text", "input_text", "output_text"):
        return expect_type(part.get("text"), str, f"{field}.text") or ""
    if kind in ("image_url", "input_audio", "file"):
        return f"[{kind} omitted]"
    return None


def _content_text(content: Any, field: str) -> str:
    return content_text(content, field, _part_text)


def translate_assistant(raw: Mapping[str, Any], field: str) -> tuple[dict[str, Any], list[str]]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": _content_text(raw.get("content"), f"{field}.content"),
    }
    reasoning = raw.get("reasoning_content", raw.get("reasoning"))
    if isinstance(reasoning, str) and reasoning:
        message["reasoning_content"] = reasoning
    ids = []
    calls = expect_type(raw.get("tool_calls"), list, f"{field}.tool_calls")
    if calls:
        message["tool_calls"] = []
        for j, call in enumerate(calls):
            cfield = f"{field}.tool_calls[{j}]"
            expect_type(call, dict, cfield, optional=False)
            function = expect_type(call.get("function"), dict, f"{cfield}.function", optional=False)
            name = expect_type(function.get("name"), str, f"{cfield}.function.name", optional=False)
            arguments = expect_type(
                function.get("arguments"), (str, dict), f"{cfield}.function.arguments"
            )
            message["tool_calls"].append(
                chat_tool_call(name, parse_arguments(arguments, f"{cfield}.function.arguments"))
            )
            if isinstance(call.get("id"), str):
                ids.append(call["id"])
    return message, ids


def translate_messages(
    raw_messages: Any,
) -> tuple[list[dict[str, Any]], tuple[tuple[int, str], ...]]:
    expect_type(raw_messages, list, "messages", optional=False)
    messages: list[dict[str, Any]] = []
    replayed: list[tuple[int, str]] = []
    for i, raw in enumerate(raw_messages):
        field = f"messages[{i}]"
        expect_type(raw, dict, field, optional=False)
        role = raw.get("role")
        if role == "assistant":
            message, ids = translate_assistant(raw, field)
            replayed.extend((len(messages), wire_id) for wire_id in ids)
            messages.append(message)
        elif role in ("system", "developer"):
            text = _content_text(raw.get("content"), f"{field}.content")
            messages.append({"role": "system", "content": text})
        elif role in ("user", "tool", "function"):
            text = _content_text(raw.get("content"), f"{field}.content")
            messages.append({"role": "user" if role == "user" else "tool", "content": text})
        else:
            raise ProtocolError(
                400,
                f"{field}.role: expected 'system', 'developer', 'user', 'assistant' or 'tool', "
                f"got {role!r}",
                param=f"{field}.role",
            )
    return fold_system_messages_with_ids(messages, replayed)


def translate_tools(raw_tools: Any) -> list[dict[str, Any]] | None:
    expect_type(raw_tools, list, "tools")
    tools = []
    for i, tool in enumerate(raw_tools or ()):
        expect_type(tool, dict, f"tools[{i}]", optional=False)
        if tool.get("type", "function") != "function":
            logger.debug("skipping tool type %r", tool.get("type"))
            continue
        function = expect_type(tool.get("function"), dict, f"tools[{i}].function") or tool
        name = expect_type(
            function.get("name", tool.get("name")), str, f"tools[{i}].function.name", optional=False
        )
        description = expect_type(
            function.get("description"), str, f"tools[{i}].function.description"
        )
        tools.append(function_tool(name, description or "", function.get("parameters")))
    return tools or None


class OpenAIChatAdapter(Adapter):
    """OpenAI Chat Completions (``/v1/chat/completions``)."""

    name = "openai_chat"
    routes = (("POST", "/v1/chat/completions", "turn"),)

    def parse_request(self, body: Any, headers: Mapping[str, str]) -> ChatRequest:
        expect_type(body, dict, "body", optional=False)
        messages, replayed = translate_messages(body.get("messages"))
        if not messages:
            raise ProtocolError(400, "messages: expected at least one message", param="messages")
        options = expect_type(body.get("stream_options"), dict, "stream_options") or {}
        max_tokens = positive_int_field(body, "max_completion_tokens")
        if max_tokens is None:
            max_tokens = positive_int_field(body, "max_tokens")
        n = int_field(body, "n")
        if n not in (None, 1):
            raise ProtocolError(400, f"n: only n=1 is supported, got {n}", param="n")
        fmt = expect_type(body.get("response_format"), dict, "response_format") or {}
        if fmt.get("type", "text") != "text":
            raise refuse_structured_output("response_format", fmt.get("type"))
        if expect_type(body.get("logprobs"), bool, "logprobs"):
            raise refuse_logprobs("logprobs")
        if int_field(body, "top_logprobs"):
            raise refuse_logprobs("top_logprobs")
        return ChatRequest(
            messages=messages,
            tools=translate_tools(body.get("tools")),
            stream=bool(expect_type(body.get("stream"), bool, "stream")),
            model=expect_type(body.get("model"), str, "model") or "",
            max_tokens=max_tokens,
            **sampling_hints(body, stop_key="stop"),
            replayed_ids=replayed,
            context={"include_usage": bool(options.get("include_usage"))},
        )

    def build_message(self, turn: AssistantTurn) -> tuple[dict[str, Any], str]:
        message: dict[str, Any] = {"role": "assistant", "content": turn.text or None}
        if turn.reasoning:
            message["reasoning_content"] = turn.reasoning
        if turn.tool_calls:
            message["tool_calls"] = [
                {
                    "id": turn.mint("call", index),
                    "type": "function",
                    "function": {"name": call.name, "arguments": dump_arguments(call.arguments)},
                }
                for index, call in enumerate(turn.tool_calls)
            ]
            finish = "tool_calls"
        else:
            finish = "length" if turn.finish_reason == "length" else "stop"
        return message, finish

    def respond(
        self, chat: ChatRequest, turn: AssistantTurn
    ) -> tuple[Reply, dict[str, Any] | None]:
        message, finish = self.build_message(turn)
        recorded, _ = translate_assistant(message, "reply")
        usage = {
            "prompt_tokens": turn.prompt_tokens,
            "completion_tokens": turn.output_tokens,
            "total_tokens": turn.prompt_tokens + turn.output_tokens,
        }
        head = {
            "id": f"chatcmpl-{secrets.token_hex(12)}",
            "created": int(time.time()),
            "model": chat.model,
        }
        if not chat.stream:
            body = {
                **head,
                "object": "chat.completion",
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": usage,
            }
            return Reply(body), recorded

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> tuple[None, Any]:
            choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
            return None, {**head, "object": "chat.completion.chunk", "choices": [choice]}

        events = [chunk({"role": "assistant", "content": ""})]
        if turn.reasoning:
            events.append(chunk({"reasoning_content": turn.reasoning}))
        if turn.text:
            events.append(chunk({"content": turn.text}))
        for index, call in enumerate(message.get("tool_calls", ())):
            events.append(chunk({"tool_calls": [{"index": index, **call}]}))
        events.append(chunk({}, finish))
        if chat.context.get("include_usage"):
            body = {**head, "object": "chat.completion.chunk", "choices": [], "usage": usage}
            events.append((None, body))
        events.append((None, "[DONE]"))
        return Reply(events=tuple(events)), recorded
