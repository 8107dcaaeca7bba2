"""The ``qwen3_coder`` tool-call format (Qwen3-Coder, Qwen3.5/3.6): XML-ish parameters.

Public API::

    Qwen3CoderToolCallParser(tools=None).parse(text, *, tools=None) -> ToolCallResult

Format (one block per call)::

    <tool_call>
    <function=write_file>
    <parameter=path>
    a.py
    </parameter>
    <parameter=content>
    print("hi")
    </parameter>
    </function>
    </tool_call>

A value loses one leading and one trailing newline (the template adds them) and is
otherwise kept exactly. Values are typed by the tool's JSON schema: string as is;
integer, number, boolean by their literal; object, array (and any other type) as JSON
(or a Python literal); ``null`` as None unless the type is a non-nullable string. A parameter the schema doesn't declare stays a
string; a value that doesn't fit its declared type stays a string too, as the model wrote
it. Missing ``</function>`` / ``</parameter>`` or a tool not offered is malformed: kept
as text with ``ill_formed`` set.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping
from typing import Any, ClassVar

from agentrl.parsers._blocks import TaggedToolCallParser
from agentrl.parsers.base import ToolCall

__all__ = ["Qwen3CoderToolCallParser", "convert_parameter"]

_FUNCTION = re.compile(r"\A\s*<function=([^>\n]+)>(.*)</function>\s*\Z", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)
_STRING_TYPES = {"string", "str", "text", "varchar", "char", "enum"}


def _declared_type(schema: Mapping[str, Any] | None) -> str | None:
    if not isinstance(schema, Mapping):
        return None
    kind = schema.get("type")
    if isinstance(kind, list):
        non_null = [k for k in kind if k != "null"]
        kind = non_null[0] if non_null else "null"
    if kind is None and ("anyOf" in schema or "oneOf" in schema):
        return "object"
    return kind.lower() if isinstance(kind, str) else None


def convert_parameter(value: str, schema: Mapping[str, Any] | None) -> Any:
    """Type one parameter's text by its JSON schema; text that doesn't fit stays a string."""
    kind = _declared_type(schema)
    literal = value.strip()
    declared = schema.get("type") if isinstance(schema, Mapping) else None
    nullable = isinstance(declared, list) and "null" in declared
    if literal.lower() == "null" and (nullable or (kind is not None and kind not in _STRING_TYPES)):
        return None
    if kind is None or kind in _STRING_TYPES:
        return value
    if kind in ("integer", "int"):
        try:
            return int(literal)
        except ValueError:
            return value
    if kind in ("number", "float", "double"):
        try:
            return int(literal) if re.fullmatch(r"[+-]?\d+", literal) else float(literal)
        except ValueError:
            return value
    if kind in ("boolean", "bool"):
        lowered = literal.lower()
        return {"true": True, "false": False}.get(lowered, value)
    try:
        return json.loads(literal)
    except (json.JSONDecodeError, RecursionError):
        pass
    try:
        return ast.literal_eval(literal)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return value


def _trim_one_newline(value: str) -> str:
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def _parse_xml_call(inner: str, raw: str, schemas: Mapping[str, Any]) -> ToolCall | str:
    match = _FUNCTION.match(inner)
    if match is None:
        if "<function=" not in inner:
            return "no <function=NAME> inside the tool call"
        return "<function=NAME> is not closed with </function>"
    name, body = match.group(1).strip(), match.group(2)
    if not name:
        return "empty function name"
    properties = schemas.get(name, {}).get("properties", {})
    if not isinstance(properties, Mapping):
        properties = {}
    arguments: dict[str, Any] = {}
    pos = 0
    for param in _PARAMETER.finditer(body):
        if body[pos : param.start()].strip():
            return f"unexpected text between parameters: {body[pos : param.start()].strip()[:40]!r}"
        key = param.group(1).strip()
        arguments[key] = convert_parameter(_trim_one_newline(param.group(2)), properties.get(key))
        pos = param.end()
    rest = body[pos:].strip()
    if rest:
        if "<parameter=" in rest:
            return "a <parameter=…> is not closed with </parameter>"
        return f"unexpected text after the parameters: {rest[:40]!r}"
    return ToolCall(name=name, arguments=arguments, raw=raw)


class Qwen3CoderToolCallParser(TaggedToolCallParser):
    """``<tool_call><function=NAME><parameter=K>V</parameter>…</function></tool_call>``."""

    name: ClassVar[str] = "qwen3_coder"
    #: Proven by tests/parsers/test_parsers_sglang.py.
    sglang_equivalents: ClassVar[tuple[str, ...]] = ("qwen3_coder",)
    start_token: ClassVar[str] = "<tool_call>"
    end_token: ClassVar[str] = "</tool_call>"
    parse_block = staticmethod(_parse_xml_call)
