"""The ``sglang:*`` parser family: SGLang's own tool-call and reasoning parsers, wrapped.

Public API::

    register_sglang_parsers(register) -> list[str]   # names registered ([] without sglang)
    sglang_parser_modules() -> tuple[Any, Any] | None # (FunctionCallParser, ReasoningParser)
    SGLangToolCallParser / SGLangReasoningParser     # bases of the generated classes
        .sglang_name: str                            # the name SGLang knows it by

When SGLang's parser modules import, every name in SGLang's registries
(``FunctionCallParser.ToolCallParserEnum`` and ``ReasoningParser.DetectorMap``) is
registered as ``sglang:<name>`` — for example ``sglang:hermes``, ``sglang:qwen3_coder``,
``sglang:qwen3``, ``sglang:deepseek-r1``. The prefix keeps them apart from the built-ins
(``hermes``, ``qwen3_coder``, ``qwen3``, ``deepseek_r1``); the registry's getters also
resolve a bare SGLang name (``glm45``) to its ``sglang:`` parser unless a built-in is
proven identical (``sglang_equivalents``), and ``sglang:<name>`` always picks SGLang's.
Without SGLang nothing is registered.

The wrappers keep the parser contracts: nothing raises on model output; a tool call SGLang
could not parse (it saw the start marker but returned fewer calls) sets ``ill_formed``, and
when it returned no call at all the whole text stays visible. SGLang reports no per-call
source text, so ``ToolCall.raw`` is empty. Reasoning text and content are SGLang's, as is.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from agentrl.extras import install_hint
from agentrl.parsers.base import (
    ReasoningParser,
    ReasoningResult,
    ToolCall,
    ToolCallParser,
    ToolCallResult,
)
from agentrl.plugins.registry import SGLANG_PREFIX

__all__ = [
    "SGLangReasoningParser",
    "SGLangToolCallParser",
    "register_sglang_parsers",
    "sglang_parser_modules",
]

logger = logging.getLogger(__name__)

PREFIX = SGLANG_PREFIX

_TOOL_MODULES = ("sglang.srt.function_call.function_call_parser", "sglang.srt.function_call_parser")
_REASONING_MODULES = ("sglang.srt.parser.reasoning_parser", "sglang.srt.reasoning_parser")
_PROTOCOL_MODULES = ("sglang.srt.entrypoints.openai.protocol", "sglang.srt.openai_api.protocol")


def _import_first(candidates: Sequence[str], attribute: str) -> Any:
    import importlib

    last: Exception | None = None
    for module_name in candidates:
        try:
            return getattr(importlib.import_module(module_name), attribute)
        except ImportError as exc:  # includes ModuleNotFoundError
            last = exc
        except AttributeError as exc:
            last = exc
    raise ImportError(f"none of {list(candidates)} provides {attribute}: {last}")


def sglang_parser_modules() -> tuple[Any, Any] | None:
    """SGLang's ``FunctionCallParser`` and ``ReasoningParser`` classes, or None if unavailable."""
    try:
        return (
            _import_first(_TOOL_MODULES, "FunctionCallParser"),
            _import_first(_REASONING_MODULES, "ReasoningParser"),
        )
    except ImportError as exc:
        logger.debug("SGLang parsers are not importable: %s", exc)
        return None
    except Exception as exc:  # a broken install must not break plugin loading
        logger.warning("SGLang is installed but its parsers failed to import: %r", exc)
        return None


def _sglang_tools(tools: Sequence[Mapping[str, Any]] | None) -> list[Any]:
    tool_cls = _import_first(_PROTOCOL_MODULES, "Tool")
    converted = []
    for tool in tools or ():
        function = tool.get("function") if isinstance(tool.get("function"), Mapping) else tool
        payload = {
            "type": "function",
            "function": {
                "name": function.get("name"),
                "description": function.get("description", ""),
                "parameters": function.get("parameters", function.get("input_schema", {})),
            },
        }
        converted.append(tool_cls.model_validate(payload))
    return converted


class SGLangToolCallParser(ToolCallParser):
    """Delegates to SGLang's ``FunctionCallParser(tools, sglang_name).parse_non_stream``."""

    name: ClassVar[str] = "sglang"
    sglang_name: ClassVar[str] = ""

    def _parser(self, tools: Sequence[Mapping[str, Any]] | None) -> Any:
        modules = sglang_parser_modules()
        if modules is None:
            raise ImportError(f"SGLang's parsers are not importable; {install_hint('sglang')}")
        return modules[0](tools=_sglang_tools(tools), tool_call_parser=self.sglang_name)

    def has_tool_call(self, text: str) -> bool:
        try:
            return bool(self._parser(self.tools).detector.has_tool_call(text))
        except Exception:
            return False

    def parse(
        self, text: str, *, tools: Sequence[Mapping[str, Any]] | None = None
    ) -> ToolCallResult:
        tools = tools if tools is not None else self.tools
        try:
            parser = self._parser(tools)
            detector = parser.detector
            attempted = bool(detector.has_tool_call(text))
            normal, items = parser.parse_non_stream(text)
            calls = []
            for item in items:
                arguments = json.loads(item.parameters) if item.parameters else {}
                calls.append(ToolCall(name=item.name, arguments=arguments, raw=""))
        except Exception as exc:
            return ToolCallResult(
                normal_text=text, ill_formed=True, errors=(f"SGLang parser failed: {exc!r}",)
            )
        expected = 0
        start = getattr(detector, "bot_token", None)
        if attempted:
            expected = max(1, text.count(start)) if isinstance(start, str) and start else 1
        ill_formed = attempted and len(calls) < expected
        errors = ()
        if ill_formed:
            errors = (f"SGLang parsed {len(calls)} of {expected} tool calls",)
        if ill_formed and not calls:
            normal = text
        return ToolCallResult(
            normal_text=normal or "", calls=tuple(calls), ill_formed=ill_formed, errors=errors
        )


class SGLangReasoningParser(ReasoningParser):
    """Delegates to SGLang's ``ReasoningParser(sglang_name).parse_non_stream``."""

    name: ClassVar[str] = "sglang"
    sglang_name: ClassVar[str] = ""

    def parse(self, text: str, *, in_reasoning: bool | None = None) -> ReasoningResult:
        forced = self._resolve_in_reasoning(in_reasoning)
        try:
            modules = sglang_parser_modules()
            if modules is None:
                raise ImportError("SGLang's parsers are not importable")
            parser = modules[1](
                model_type=self.sglang_name, stream_reasoning=False, force_reasoning=forced
            )
            reasoning, content = parser.parse_non_stream(text)
        except Exception as exc:
            logger.warning("SGLang reasoning parser %s failed: %r", self.sglang_name, exc)
            return ReasoningResult(reasoning="", content=text, has_reasoning=False)
        end = getattr(parser.detector, "think_end_token", None)
        reasoning = reasoning or ""
        closed = not reasoning or not isinstance(end, str) or end in text
        return ReasoningResult(
            reasoning=reasoning,
            content=content or "",
            reasoning_closed=closed,
            has_reasoning=bool(reasoning) or (isinstance(end, str) and end in text),
        )


def _make(base: type, sglang_name: str) -> type:
    safe = "".join(ch if ch.isalnum() else "_" for ch in sglang_name)
    return type(
        f"{base.__name__}_{safe}",
        (base,),
        {
            "name": PREFIX + sglang_name,
            "sglang_name": sglang_name,
            "__doc__": f"SGLang's {sglang_name!r} parser.",
            "__module__": __name__,
        },
    )


def register_sglang_parsers(register: Callable[[type], None]) -> list[str]:
    """Register a wrapper for every parser name SGLang knows; nothing without SGLang."""
    modules = sglang_parser_modules()
    if modules is None:
        return []
    function_call_parser, reasoning_parser = modules
    names = []
    for sglang_name in sorted(getattr(function_call_parser, "ToolCallParserEnum", {})):
        register(_make(SGLangToolCallParser, sglang_name))
        names.append(PREFIX + sglang_name)
    for sglang_name in sorted(getattr(reasoning_parser, "DetectorMap", {})):
        register(_make(SGLangReasoningParser, sglang_name))
        names.append(PREFIX + sglang_name)
    return names
