"""The ``hermes`` tool-call format (Qwen2.5, Qwen3): JSON inside ``<tool_call>`` tags.

Public API::

    HermesToolCallParser(tools=None).parse(text, *, tools=None) -> ToolCallResult

Format (one block per call)::

    <tool_call>
    {"name": "read_file", "arguments": {"path": "a.py"}}
    </tool_call>

``arguments`` may also be a JSON string holding an object, or be spelled ``parameters``;
a missing ``arguments`` means no arguments. Anything else (bad JSON, no ``name``, an
unclosed tag, a tool not offered) is malformed: kept as text and ``ill_formed`` set.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar

from agentrl.parsers._blocks import TaggedToolCallParser
from agentrl.parsers.base import ToolCall

__all__ = ["HermesToolCallParser"]


def _parse_json_call(inner: str, raw: str, schemas: Mapping[str, Any]) -> ToolCall | str:
    try:
        payload = json.loads(inner)
    except json.JSONDecodeError as exc:
        return f"invalid JSON ({exc.msg} at position {exc.pos})"
    except RecursionError:
        return "JSON nested too deep to parse"
    if not isinstance(payload, dict):
        return f"expected a JSON object, got {type(payload).__name__}"
    name = payload.get("name")
    if not isinstance(name, str) or not name:
        return "missing a non-empty string 'name'"
    arguments = payload.get("arguments", payload.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (json.JSONDecodeError, RecursionError):
            return "'arguments' is a string that is not a JSON object"
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return f"'arguments' must be an object, got {type(arguments).__name__}"
    return ToolCall(name=name, arguments=arguments, raw=raw)


class HermesToolCallParser(TaggedToolCallParser):
    """JSON tool calls in ``<tool_call>…</tool_call>`` (the Qwen3 chat template's format)."""

    name: ClassVar[str] = "hermes"
    #: Proven by tests/parsers/test_parsers_sglang.py.
    sglang_equivalents: ClassVar[tuple[str, ...]] = ("hermes",)
    start_token: ClassVar[str] = "<tool_call>"
    end_token: ClassVar[str] = "</tool_call>"
    parse_block = staticmethod(_parse_json_call)
