"""OpenAI Responses API, as Codex 0.171 speaks it.

Requests: ``input`` items — messages (``developer``, ``system``, ``user``, ``assistant``),
``reasoning`` (with ``encrypted_content``), ``function_call`` / ``function_call_output``,
``custom_tool_call`` / ``custom_tool_call_output``, and ``additional_tools`` (Codex's
"code mode" moves its tools into the input) — plus ``tools`` (function, custom freeform,
namespaces), ``parallel_tool_calls`` and ``store: false``. The adapter is stateless:
``previous_response_id`` and ``conversation`` are refused (400), as are structured output
(``text.format`` other than ``text``) and log-probs (``top_logprobs``, ``include`` of
``message.output_text.logprobs``); ``text.verbosity`` is ignored. A freeform (custom) tool is
shown to the model as a function with one string parameter, ``input``; a namespaced
function keeps its plain name unless two namespaces share it.

Replies: ``reasoning``, ``message``, ``function_call`` and ``custom_tool_call`` output
items, as JSON or as the event sequence ``response.created`` … ``response.completed``.
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
from agentrl.adapters.wire_ids import unseal_text

__all__ = ["OpenAIResponsesAdapter"]

logger = logging.getLogger(__name__)

CUSTOM_INPUT = "input"
#: Responses fields that point at server-side state agentrl does not keep.
_STATEFUL_FIELDS = ("previous_response_id", "conversation")
_LOGPROBS_INCLUDE = "message.output_text.logprobs"
_ASSISTANT_ITEMS = ("reasoning", "function_call", "custom_tool_call")


def _part_text(part: Mapping[str, Any], field: str) -> str | None:
    kind = part.get("type")
    if kind in ("input_text", "output_text", "text", "summary_text", "reasoning_text"):
        return expect_type(part.get("text"), str, f"{field}.text") or ""
    if kind in ("input_image", "input_file", "input_audio"):
        return f"[{kind.removeprefix('input_')} omitted]"
    if kind == "refusal":
        return part.get("refusal") or ""
    return None


def _content_text(content: Any, field: str) -> str:
    return content_text(content, field, _part_text)


class ToolTable:
    """Chat-template tool schemas for a request, and how a call maps back to the wire."""

    def __init__(self) -> None:
        self.schemas: list[dict[str, Any]] = []
        #: chat name -> (wire name, namespace or None, is_custom)
        self.by_chat_name: dict[str, tuple[str, str | None, bool]] = {}
        self._wire_names: dict[tuple[str | None, str], str] = {}

    def add_all(self, tools: Any, field: str, namespace: str | None = None) -> None:
        expect_type(tools, list, field)
        for i, tool in enumerate(tools or ()):
            self.add(tool, f"{field}[{i}]", namespace)

    def add(self, tool: Any, field: str, namespace: str | None) -> None:
        expect_type(tool, dict, field, optional=False)
        kind = tool.get("type")
        if kind == "namespace":
            name = expect_type(tool.get("name"), str, f"{field}.name")
            # "functions" is the default namespace: its members are called by plain name.
            inner = None if name in (None, "functions") else name
            self.add_all(tool.get("tools"), f"{field}.tools", inner)
            return
        if kind not in ("function", "custom"):
            logger.debug("skipping hosted tool type %r (the policy cannot call it)", kind)
            return
        name = expect_type(tool.get("name"), str, f"{field}.name", optional=False)
        description = expect_type(tool.get("description"), str, f"{field}.description") or ""
        if kind == "custom":
            fmt = tool.get("format") if isinstance(tool.get("format"), dict) else {}
            if fmt.get("type") == "grammar" and fmt.get("definition"):
                description += (
                    f"\n\nThe `{CUSTOM_INPUT}` argument must match this {fmt.get('syntax', '')} "
                    f"grammar:\n{fmt['definition']}"
                )
            parameters = {
                "type": "object",
                "properties": {CUSTOM_INPUT: {"type": "string", "description": "Freeform input."}},
                "required": [CUSTOM_INPUT],
            }
        else:
            parameters = tool.get("parameters")
        chat_name = name if name not in self.by_chat_name else f"{namespace}.{name}"
        self.by_chat_name[chat_name] = (name, namespace, kind == "custom")
        self._wire_names[(namespace, name)] = chat_name
        self.schemas.append(function_tool(chat_name, description, parameters))

    def chat_name(self, name: str, namespace: str | None) -> str:
        if namespace == "functions":
            namespace = None
        return self._wire_names.get((namespace, name), name)


def translate_input(
    items: Any, instructions: Any, tools: ToolTable
) -> tuple[list[dict[str, Any]], tuple[tuple[int, str], ...]]:
    """Responses ``input`` -> chat-template messages and replayed wire ids."""
    messages: list[dict[str, Any]] = []
    replayed: list[tuple[int, str]] = []
    if instructions:
        messages.append(
            {"role": "system", "content": expect_type(instructions, str, "instructions")}
        )
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    expect_type(items, list, "input", optional=False)
    assistant: dict[str, Any] | None = None

    def open_assistant() -> dict[str, Any]:
        nonlocal assistant
        if assistant is None:
            assistant = {"role": "assistant", "content": ""}
            messages.append(assistant)
        return assistant

    for i, item in enumerate(items):
        field = f"input[{i}]"
        expect_type(item, dict, field, optional=False)
        kind = item.get("type", "message")
        role = item.get("role")
        if kind == "message" and role == "assistant":
            target = open_assistant()
            target["content"] += _content_text(item.get("content"), f"{field}.content")
            if isinstance(item.get("id"), str):
                replayed.append((len(messages) - 1, item["id"]))
            continue
        if kind == "reasoning":
            if assistant is not None and (assistant["content"] or assistant.get("tool_calls")):
                assistant = None  # reasoning opens the next assistant turn
            target = open_assistant()
            text = _content_text(item.get("content"), f"{field}.content") or _content_text(
                item.get("summary"), f"{field}.summary"
            )
            sealed = item.get("encrypted_content")
            if isinstance(sealed, str):
                replayed.append((len(messages) - 1, sealed))
                text = unseal_text(sealed) or text
            target["reasoning_content"] = target.get("reasoning_content", "") + text
            continue
        if kind in ("function_call", "custom_tool_call"):
            target = open_assistant()
            name = expect_type(item.get("name"), str, f"{field}.name", optional=False)
            namespace = expect_type(item.get("namespace"), str, f"{field}.namespace")
            if kind == "function_call":
                arguments = parse_arguments(
                    expect_type(item.get("arguments"), str, f"{field}.arguments"),
                    f"{field}.arguments",
                )
            else:
                arguments = {
                    CUSTOM_INPUT: expect_type(item.get("input"), str, f"{field}.input") or ""
                }
            call = chat_tool_call(tools.chat_name(name, namespace), arguments)
            target.setdefault("tool_calls", []).append(call)
            for key in ("call_id", "id"):
                if isinstance(item.get(key), str):
                    replayed.append((len(messages) - 1, item[key]))
            continue
        assistant = None
        if kind in ("function_call_output", "custom_tool_call_output"):
            output = item.get("output")
            text = output if isinstance(output, str) else _content_text(output, f"{field}.output")
            messages.append({"role": "tool", "content": text})
        elif kind == "additional_tools":
            tools.add_all(item.get("tools"), f"{field}.tools")
        elif kind == "message":
            text = _content_text(item.get("content"), f"{field}.content")
            if role in ("developer", "system"):
                messages.append({"role": "system", "content": text})
            elif role == "user":
                messages.append({"role": "user", "content": text})
            else:
                raise ProtocolError(
                    400,
                    f"{field}.role: expected 'user', 'assistant', 'system' or 'developer', "
                    f"got {role!r}",
                    param=f"{field}.role",
                )
        else:
            logger.debug("ignoring Responses input item of type %r", kind)
    return fold_system_messages_with_ids(messages, replayed)


def refuse_unsupported(body: Mapping[str, Any]) -> None:
    """400 for what a stateless, unconstrained middleware cannot honour (nothing Codex sends)."""
    for key in _STATEFUL_FIELDS:
        if body.get(key) is not None:
            raise ProtocolError(
                400,
                f"{key}: agentrl keeps no responses or conversations (it is stateless, as with "
                "store: false); send the full history in input on every request instead",
                param=key,
            )
    text = expect_type(body.get("text"), dict, "text") or {}
    fmt = expect_type(text.get("format"), dict, "text.format") or {}
    if fmt.get("type", "text") != "text":
        raise refuse_structured_output("text.format", fmt.get("type"))
    top = int_field(body, "top_logprobs")
    if top:
        raise refuse_logprobs("top_logprobs")
    include = expect_type(body.get("include"), list, "include") or []
    if _LOGPROBS_INCLUDE in include:
        raise refuse_logprobs("include")


class OpenAIResponsesAdapter(Adapter):
    """OpenAI Responses (``/v1/responses``)."""

    name = "openai_responses"
    routes = (("POST", "/v1/responses", "turn"),)

    def parse_request(self, body: Any, headers: Mapping[str, str]) -> ChatRequest:
        expect_type(body, dict, "body", optional=False)
        refuse_unsupported(body)
        tools = ToolTable()
        tools.add_all(body.get("tools"), "tools")
        messages, replayed = translate_input(body.get("input"), body.get("instructions"), tools)
        if not messages:
            raise ProtocolError(400, "input: expected at least one item", param="input")
        for key in ("reasoning", "client_metadata", "metadata"):
            expect_type(body.get(key), dict, key)
        expect_type(body.get("parallel_tool_calls"), bool, "parallel_tool_calls")
        expect_type(body.get("store"), bool, "store")
        return ChatRequest(
            messages=messages,
            tools=tools.schemas or None,
            stream=bool(expect_type(body.get("stream"), bool, "stream")),
            model=expect_type(body.get("model"), str, "model") or "",
            max_tokens=positive_int_field(body, "max_output_tokens"),
            **sampling_hints(body, stop_key="stop"),
            replayed_ids=replayed,
            context={"tools": tools},
        )

    # -- replies ---------------------------------------------------------------------

    def build_output(self, chat: ChatRequest, turn: AssistantTurn) -> list[dict[str, Any]]:
        tools: ToolTable = chat.context["tools"]
        output: list[dict[str, Any]] = []
        if turn.reasoning:
            output.append(
                {
                    "type": "reasoning",
                    "id": turn.mint("rs", 0),
                    "summary": [{"type": "summary_text", "text": turn.reasoning}],
                    "encrypted_content": turn.seal("reasoning", turn.reasoning),
                }
            )
        if turn.text or not turn.tool_calls:
            output.append(
                {
                    "type": "message",
                    "id": turn.mint("msg", 0),
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": turn.text, "annotations": []}],
                }
            )
        for index, call in enumerate(turn.tool_calls):
            wire_name, namespace, custom = tools.by_chat_name.get(
                call.name, (call.name, None, False)
            )
            if custom:
                arguments = call.arguments
                text = arguments.get(CUSTOM_INPUT) if isinstance(arguments, dict) else arguments
                item = {
                    "type": "custom_tool_call",
                    "id": turn.mint("ctc", index),
                    "status": "completed",
                    "call_id": turn.mint("call", index),
                    "name": wire_name,
                    "input": text if isinstance(text, str) else dump_arguments(arguments),
                }
            else:
                item = {
                    "type": "function_call",
                    "id": turn.mint("fc", index),
                    "status": "completed",
                    "call_id": turn.mint("call", index),
                    "name": wire_name,
                    "arguments": dump_arguments(call.arguments),
                }
                if namespace:
                    item["namespace"] = namespace
            output.append(item)
        return output

    def respond(
        self, chat: ChatRequest, turn: AssistantTurn
    ) -> tuple[Reply, dict[str, Any] | None]:
        output = self.build_output(chat, turn)
        recorded_messages, _ = translate_input(output, None, chat.context["tools"])
        recorded = recorded_messages[0] if recorded_messages else None
        incomplete = turn.finish_reason == "length" and not turn.tool_calls
        usage = {
            "input_tokens": turn.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": turn.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": turn.prompt_tokens + turn.output_tokens,
        }
        response_obj = {
            "id": f"resp_{secrets.token_hex(12)}",
            "object": "response",
            "created_at": int(time.time()),
            "model": chat.model,
            "status": "incomplete" if incomplete else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "output": output,
            "parallel_tool_calls": True,
            "usage": usage,
        }
        if not chat.stream:
            return Reply(response_obj), recorded
        pending = {**response_obj, "status": "in_progress", "output": [], "usage": None}
        pending["incomplete_details"] = None
        events = [
            {"type": "response.created", "response": pending},
            {"type": "response.in_progress", "response": pending},
        ]
        for index, item in enumerate(output):
            events += _item_events(index, item)
        final = "response.incomplete" if incomplete else "response.completed"
        events.append({"type": final, "response": response_obj})
        stream = tuple(
            (e["type"], {"type": e["type"], "sequence_number": n, **e})
            for n, e in enumerate(events)
        )
        return Reply(events=stream), recorded


def _item_events(index: int, item: dict[str, Any]) -> list[dict[str, Any]]:
    kind = item["type"]
    head = {"output_index": index}
    if kind == "message":
        text = item["content"][0]["text"]
        part = {"type": "output_text", "text": "", "annotations": []}
        ref = {**head, "item_id": item["id"], "content_index": 0}
        added = {**item, "status": "in_progress", "content": []}
        events = [
            {"type": "response.output_item.added", **head, "item": added},
            {"type": "response.content_part.added", **ref, "part": part},
        ]
        if text:
            events.append({"type": "response.output_text.delta", **ref, "delta": text})
        events += [
            {"type": "response.output_text.done", **ref, "text": text},
            {"type": "response.content_part.done", **ref, "part": item["content"][0]},
        ]
    elif kind == "reasoning":
        text = item["summary"][0]["text"]
        ref = {**head, "item_id": item["id"], "summary_index": 0}
        added = {**item, "summary": []}
        events = [
            {"type": "response.output_item.added", **head, "item": added},
            {
                "type": "response.reasoning_summary_part.added",
                **ref,
                "part": {"type": "summary_text", "text": ""},
            },
            {"type": "response.reasoning_summary_text.delta", **ref, "delta": text},
            {"type": "response.reasoning_summary_text.done", **ref, "text": text},
            {"type": "response.reasoning_summary_part.done", **ref, "part": item["summary"][0]},
        ]
    elif kind == "function_call":
        ref = {**head, "item_id": item["id"]}
        added = {**item, "status": "in_progress", "arguments": ""}
        events = [
            {"type": "response.output_item.added", **head, "item": added},
            {"type": "response.function_call_arguments.delta", **ref, "delta": item["arguments"]},
            {
                "type": "response.function_call_arguments.done",
                **ref,
                "arguments": item["arguments"],
            },
        ]
    else:  # custom_tool_call
        ref = {**head, "item_id": item["id"]}
        added = {**item, "status": "in_progress", "input": ""}
        events = [
            {"type": "response.output_item.added", **head, "item": added},
            {"type": "response.custom_tool_call_input.delta", **ref, "delta": item["input"]},
            {"type": "response.custom_tool_call_input.done", **ref, "input": item["input"]},
        ]
    events.append({"type": "response.output_item.done", **head, "item": item})
    return events
