"""The sampled ids of one generation, decoded and split into text, reasoning and tool calls."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from agentrl.engines.base import Generation
from agentrl.parsers.base import ReasoningParser, ToolCall, ToolCallParser
from agentrl.prompts.sampled import sampled_content, sampled_reasoning

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["ParsedOutput", "parse_generation"]


@attrs.frozen(kw_only=True)
class ParsedOutput:
    """One generation's text, reasoning and tool calls, and whether a call was malformed.

    ``text`` and ``reasoning`` are trimmed (what a client is sent); ``sampled_text`` and
    ``sampled_reasoning`` are what the recorded message keeps
    (:func:`~agentrl.prompts.sampled.sampled_content`).
    """

    text: str
    reasoning: str | None
    tool_calls: tuple[ToolCall, ...]
    ill_formed: bool
    sampled_text: str | None = None
    sampled_reasoning: str | None = None


def parse_generation(
    generation: Generation,
    *,
    tokenizer: PreTrainedTokenizerBase,
    stop_ids: Collection[int],
    tools: Sequence[dict[str, Any]] | None,
    tool_parser: ToolCallParser | None,
    reasoning_parser: ReasoningParser | None,
    prompt_tail: str = "",
) -> ParsedOutput:
    """Decode the sampled ids (minus trailing stop tokens) and split reasoning and tool calls."""
    ids = list(generation.output_ids)
    while ids and ids[-1] in stop_ids:
        ids.pop()
    text = tokenizer.decode(ids, skip_special_tokens=False) if ids else ""
    reasoning = kept_reasoning = None
    sampled, after_reasoning = text, False
    if reasoning_parser is not None:
        in_reasoning = None
        if hasattr(reasoning_parser, "prompt_opens_reasoning") and prompt_tail:
            in_reasoning = reasoning_parser.prompt_opens_reasoning(prompt_tail)
        split = reasoning_parser.parse(text, in_reasoning=in_reasoning or None)
        if split.has_reasoning:
            reasoning = split.reasoning
            kept_reasoning = sampled_reasoning(_first(split.sampled_reasoning, split.reasoning))
            sampled, after_reasoning = _first(split.sampled_content, split.content), True
        text = split.content
    calls: tuple[ToolCall, ...] = ()
    ill_formed = False
    if tool_parser is not None:
        result = tool_parser.parse(text, tools=tools)
        text = result.normal_text
        calls = tuple(result.calls)
        ill_formed = bool(result.ill_formed)
    text = text.strip()
    return ParsedOutput(
        text=text,
        reasoning=reasoning,
        tool_calls=calls,
        ill_formed=ill_formed,
        sampled_text=sampled_content(
            sampled, tool_calls=calls, trimmed=text, after_reasoning=after_reasoning
        ),
        sampled_reasoning=kept_reasoning,
    )


def _first(value: str | None, default: str) -> str:
    return default if value is None else value
