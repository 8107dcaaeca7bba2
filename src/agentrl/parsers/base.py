"""Parser contracts: tool calls and reasoning out of a model's raw output text.

Public API::

    ToolCall(name: str, arguments: dict[str, Any], raw: str)
    ToolCallResult(normal_text: str, calls: tuple[ToolCall, ...], ill_formed: bool = False,
                   errors: tuple[str, ...] = ())
    ToolCallParser(tools: Sequence[Mapping] | None = None)     # abstract; class attrs
        name: str; parser_type = "tool_call"; sglang_equivalents: tuple[str, ...]
        parse(text: str, *, tools: Sequence[Mapping] | None = None) -> ToolCallResult
        has_tool_call(text: str) -> bool

    ReasoningResult(reasoning: str, content: str, reasoning_closed: bool, has_reasoning: bool,
                    sampled_reasoning: str | None = None, sampled_content: str | None = None)
    ReasoningParser(*, in_reasoning: bool | None = None)      # abstract; class attrs
        name: str; parser_type = "reasoning"; start_token: str; end_token: str
        sglang_equivalents: tuple[str, ...]
        parse(text: str, *, in_reasoning: bool | None = None) -> ReasoningResult
        prompt_opens_reasoning(prompt_text: str) -> bool       # classmethod

    ParserError                                               # only for misuse, never for bad model output

Rules every parser keeps:
- ``parse`` never raises on model output. A tool call that cannot be parsed (bad JSON, a
  missing closing tag, an unknown tool when ``tools`` are known) sets ``ill_formed`` and
  stays in ``normal_text`` verbatim, so the client sees what the model wrote.
- With no tool calls found, ``normal_text`` is exactly the input text.
- ``in_reasoning=True`` means the prompt already opened the reasoning block (the template
  ended the generation prompt with ``<think>``), so the output starts inside it.

``sglang_equivalents`` names the SGLang parsers (``--tool-call-parser`` /
``--reasoning-parser`` names) a parser is proven to read identically — by the differential
test, tests/parsers/test_parsers_sglang.py. The registry hands out this parser for those
names instead of SGLang's own (see ``agentrl.plugins.get_tool_parser``); claim a name only
with a test that proves it.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import attrs

__all__ = [
    "ParserError",
    "ReasoningParser",
    "ReasoningResult",
    "ToolCall",
    "ToolCallParser",
    "ToolCallResult",
    "tool_names",
    "tool_schemas",
]


class ParserError(ValueError):
    """A parser was misused (bad arguments); model output never raises this."""


@attrs.frozen(kw_only=True)
class ToolCall:
    """One parsed tool call: the function name, its arguments and the exact text it came from.

    The one tool-call value: the middleware hands these to the adapters as they are.
    """

    name: str
    arguments: dict[str, Any] = attrs.field(factory=dict)
    raw: str = ""


@attrs.frozen(kw_only=True)
class ToolCallResult:
    """The text outside tool calls, the calls themselves, and whether any call was malformed."""

    normal_text: str
    calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=tuple)
    ill_formed: bool = False
    errors: tuple[str, ...] = attrs.field(default=(), converter=tuple)


@attrs.frozen(kw_only=True)
class ReasoningResult:
    """Reasoning text and answer text split out of one output.

    ``reasoning_closed`` is False when the output ended inside the reasoning block (e.g.
    truncated by ``max_new_tokens``); ``has_reasoning`` is True when a block was present.
    ``reasoning`` and ``content`` may be trimmed; ``sampled_reasoning`` and
    ``sampled_content`` are the same split with every character kept as sampled (the text
    between the tags, the text outside them), None where a parser does not say.
    """

    reasoning: str
    content: str
    reasoning_closed: bool = True
    has_reasoning: bool = False
    sampled_reasoning: str | None = None
    sampled_content: str | None = None


def _function_of(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    # OpenAI chat ({"type": "function", "function": {...}}) or a bare function schema.
    inner = tool.get("function")
    return inner if isinstance(inner, Mapping) else tool


def tool_names(tools: Sequence[Mapping[str, Any]] | None) -> frozenset[str] | None:
    """The function names in OpenAI-style tool schemas, or None when no tools are known."""
    if not tools:
        return None
    names = {_function_of(tool).get("name") for tool in tools}
    return frozenset(name for name in names if isinstance(name, str))


def tool_schemas(tools: Sequence[Mapping[str, Any]] | None) -> dict[str, Mapping[str, Any]]:
    """Function name -> its JSON-schema ``parameters`` (``input_schema`` is accepted too)."""
    schemas: dict[str, Mapping[str, Any]] = {}
    for tool in tools or ():
        function = _function_of(tool)
        name = function.get("name")
        params = function.get("parameters", function.get("input_schema"))
        if isinstance(name, str):
            schemas[name] = params if isinstance(params, Mapping) else {}
    return schemas


class ToolCallParser(abc.ABC):
    """Extracts tool calls from a model's full output text."""

    name: ClassVar[str]
    parser_type: ClassVar[str] = "tool_call"
    #: SGLang parser names this parser is proven to read identically (see the module doc).
    sglang_equivalents: ClassVar[tuple[str, ...]] = ()
    #: The marker whose presence means the model tried to call a tool.
    start_token: ClassVar[str] = "<tool_call>"

    def __init__(self, tools: Sequence[Mapping[str, Any]] | None = None) -> None:
        self.tools = list(tools) if tools else None

    def has_tool_call(self, text: str) -> bool:
        """Whether the text contains the start of a tool call (well-formed or not)."""
        return self.start_token in text

    @abc.abstractmethod
    def parse(
        self, text: str, *, tools: Sequence[Mapping[str, Any]] | None = None
    ) -> ToolCallResult:
        """Split ``text`` into normal text and tool calls; never raises on model output."""


class ReasoningParser(abc.ABC):
    """Splits a model's output into reasoning and answer content."""

    name: ClassVar[str]
    parser_type: ClassVar[str] = "reasoning"
    #: SGLang parser names this parser is proven to read identically (see the module doc).
    sglang_equivalents: ClassVar[tuple[str, ...]] = ()
    start_token: ClassVar[str] = "<think>"
    end_token: ClassVar[str] = "</think>"
    #: Default for ``in_reasoning`` when neither the constructor nor ``parse`` sets it.
    default_in_reasoning: ClassVar[bool | None] = None

    def __init__(self, *, in_reasoning: bool | None = None) -> None:
        self.in_reasoning = in_reasoning

    @classmethod
    def prompt_opens_reasoning(cls, prompt_text: str) -> bool:
        """Whether the prompt ends inside an unclosed reasoning block (template opened it)."""
        opened = prompt_text.rfind(cls.start_token)
        return opened != -1 and prompt_text.find(cls.end_token, opened) == -1

    @abc.abstractmethod
    def parse(self, text: str, *, in_reasoning: bool | None = None) -> ReasoningResult:
        """Split ``text``; ``in_reasoning`` overrides the constructor's and class default."""

    def _resolve_in_reasoning(self, in_reasoning: bool | None) -> bool | None:
        if in_reasoning is not None:
            return in_reasoning
        if self.in_reasoning is not None:
            return self.in_reasoning
        return self.default_in_reasoning
