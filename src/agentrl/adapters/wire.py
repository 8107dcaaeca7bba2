"""Helpers for writing an adapter: field checks, content parts, tool calls.

The contract itself (:class:`~agentrl.adapters.base.Adapter` and its values) is in
:mod:`agentrl.adapters.base`; these are the pieces every built-in protocol shares when it
translates a request body or writes its reply.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentrl.adapters.base import ProtocolError
from agentrl.serve.limits import check_json, too_deep

__all__ = [
    "SYSTEM_REMINDER_CLOSE",
    "SYSTEM_REMINDER_OPEN",
    "chat_tool_call",
    "content_text",
    "dump_arguments",
    "expect_type",
    "fold_system_messages",
    "fold_system_messages_with_ids",
    "function_tool",
    "int_field",
    "number_field",
    "parse_arguments",
    "positive_int_field",
    "refuse_logprobs",
    "refuse_structured_output",
    "sampling_hints",
    "stop_field",
]

SYSTEM_REMINDER_OPEN = "<system-reminder>\n"
SYSTEM_REMINDER_CLOSE = "\n</system-reminder>"


_TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    list: "an array",
    dict: "an object",
}


def expect_type(value: Any, types: type | tuple[type, ...], field: str, *, optional: bool = True):
    """``value`` if it has one of ``types`` (or is None when optional), else a 400 naming ``field``."""
    if value is None and optional:
        return None
    wanted = types if isinstance(types, tuple) else (types,)
    ok = isinstance(value, wanted)
    if ok and isinstance(value, bool) and bool not in wanted:
        ok = False
    if ok and int in wanted and float not in wanted and isinstance(value, float):
        ok = False
    if not ok:
        expected = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in wanted)
        got = "null" if value is None else type(value).__name__
        raise ProtocolError(
            400, f"{field}: expected {expected}, got {got}", param=field.split("[")[0]
        )
    return value


def number_field(body: Mapping[str, Any], key: str) -> float | None:
    """``body[key]`` as a number, None when absent; a 400 naming ``key`` otherwise."""
    return expect_type(body.get(key), (int, float), key)


def int_field(body: Mapping[str, Any], key: str) -> int | None:
    """``body[key]`` as an integer (``3.0`` counts), None when absent; a 400 otherwise."""
    value = expect_type(body.get(key), (int, float), key)
    if value is None:
        return None
    if isinstance(value, float) and not value.is_integer():
        raise ProtocolError(400, f"{key}: expected an integer, got {value!r}", param=key)
    return int(value)


def positive_int_field(body: Mapping[str, Any], key: str) -> int | None:
    """:func:`int_field`, which must be at least 1 (a token limit: 0 or less is a 400)."""
    value = int_field(body, key)
    if value is not None and value < 1:
        raise ProtocolError(400, f"{key}: expected an integer >= 1, got {value}", param=key)
    return value


def stop_field(body: Mapping[str, Any], key: str) -> tuple[str, ...]:
    """Stop strings: ``body[key]`` as one string or a list of strings (a 400 otherwise)."""
    value = body.get(key)
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    expect_type(value, list, key)
    for i, item in enumerate(value):
        expect_type(item, str, f"{key}[{i}]", optional=False)
    return tuple(value)


def sampling_hints(body: Mapping[str, Any], *, stop_key: str) -> dict[str, Any]:
    """The client's ``temperature``, ``top_p``, ``top_k`` and stop strings, validated.

    Every protocol spells the first three the same; ``stop_key`` names its stop field.
    The result is keyword arguments for :class:`ChatRequest`.
    """
    return {
        "temperature": number_field(body, "temperature"),
        "top_p": number_field(body, "top_p"),
        "top_k": int_field(body, "top_k"),
        "stop": stop_field(body, stop_key),
    }


def refuse_structured_output(field: str, kind: Any) -> ProtocolError:
    """The 400 for a structured-output request (a JSON schema the reply must match)."""
    return ProtocolError(
        400,
        f"{field}: structured output ({kind!r}) is not supported: agentrl does not constrain "
        "decoding, so the recorded log-probs stay the policy's own; describe the format in "
        "the prompt instead and drop this field",
        param=field,
    )


def refuse_logprobs(field: str) -> ProtocolError:
    """The 400 for a client asking for token log-probs in the reply."""
    return ProtocolError(
        400,
        f"{field}: log-probs are not returned to clients (agentrl records every sampled "
        "token's log-prob in the trajectory, for training); drop this field",
        param=field,
    )


def content_text(
    content: Any, field: str, part_text: Callable[[Mapping[str, Any], str], str | None]
) -> str:
    """The text of a string or a list of typed content parts, parts joined by newlines.

    ``None`` is empty; every part must be an object. ``part_text(part, part_field)`` gives
    one part's text in the protocol's terms, or ``None`` to leave the part out.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    expect_type(content, list, field)
    parts = []
    for i, part in enumerate(content):
        part_field = f"{field}[{i}]"
        expect_type(part, dict, part_field, optional=False)
        text = part_text(part, part_field)
        if text is not None:
            parts.append(text)
    return "\n".join(parts)


def fold_system_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Keep one leading system message; fold later ones into user turns.

    Leading system messages merge into one. A later system message (Claude Code and Codex
    put some mid-conversation) is appended to the preceding user message as a
    ``<system-reminder>`` block, or becomes a user message of its own when the previous
    message is not a user message. Appending only backwards keeps earlier turns unchanged
    as the conversation grows, so the fold never perturbs an already-sampled prefix.
    """
    folded: list[dict[str, Any]] = []
    leading: list[str] = []
    seen_other = False
    for message in messages:
        role = message.get("role")
        if role == "system" and not seen_other:
            leading.append(message.get("content") or "")
            continue
        seen_other = True
        if role != "system":
            folded.append(message)
            continue
        reminder = SYSTEM_REMINDER_OPEN + (message.get("content") or "") + SYSTEM_REMINDER_CLOSE
        previous = folded[-1] if folded else None
        if previous is not None and previous.get("role") == "user":
            folded[-1] = {**previous, "content": previous["content"] + "\n\n" + reminder}
        else:
            folded.append({"role": "user", "content": reminder})
    if leading:
        folded.insert(0, {"role": "system", "content": "\n\n".join(leading)})
    return folded


def fold_system_messages_with_ids(
    messages: Sequence[dict[str, Any]], replayed: Sequence[tuple[int, str]]
) -> tuple[list[dict[str, Any]], tuple[tuple[int, str], ...]]:
    """:func:`fold_system_messages`, moving each replayed id's message index along.

    Replayed ids point at assistant messages. Folding merges only system and user
    messages, so the k-th assistant message before the fold is the k-th after it.
    """
    folded = fold_system_messages(messages)
    before = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
    after = [k for k, m in enumerate(folded) if m["role"] == "assistant"]
    remap = dict(zip(before, after, strict=False))
    return folded, tuple((remap[k], wire_id) for k, wire_id in replayed)


def parse_arguments(arguments: Any, field: str = "arguments") -> dict[str, Any] | str:
    """Tool-call arguments as a dict when they are a JSON object, else the raw string.

    JSON nested too deep or holding a lone surrogate is a 400 naming ``field``
    (:func:`~agentrl.serve.limits.check_json`).
    """
    if isinstance(arguments, dict):
        return arguments
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments)
        except RecursionError:
            raise too_deep(field) from None
        except ValueError:
            return arguments
        check_json(value, field)
        return value if isinstance(value, dict) else arguments
    return {} if arguments is None else str(arguments)


def dump_arguments(arguments: dict[str, Any] | str) -> str:
    """Tool-call arguments as the JSON string the wire carries (a string stays as it is)."""
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, ensure_ascii=False)


def chat_tool_call(name: str, arguments: dict[str, Any] | str) -> dict[str, Any]:
    """The chat-template tool call; wire ids stay out so a replay compares equal."""
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def function_tool(name: str, description: str, parameters: Any) -> dict[str, Any]:
    """A chat-template function tool; parameters that are not a schema object become empty."""
    if not isinstance(parameters, dict):
        parameters = {"type": "object", "properties": {}}
    return {
        "type": "function",
        "function": {"name": name, "description": description or "", "parameters": parameters},
    }
