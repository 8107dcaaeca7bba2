"""Shared scanning for tool-call formats wrapped in start/end tags (``<tool_call>…</tool_call>``)."""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from agentrl.parsers.base import (
    ToolCall,
    ToolCallParser,
    ToolCallResult,
    tool_names,
    tool_schemas,
)

#: Parses one block's inner text into a call, or returns the reason it is malformed.
BlockParser = Callable[[str, str, Mapping[str, Mapping[str, Any]]], "ToolCall | str"]


def scan_blocks(
    text: str,
    *,
    start: str,
    end: str,
    parse_block: BlockParser,
    tools: Sequence[Mapping[str, Any]] | None,
) -> ToolCallResult:
    """Find every ``start…end`` block, parse it, and keep malformed ones as text."""
    known = tool_names(tools)
    schemas = tool_schemas(tools)
    segments: list[str] = []
    calls: list[ToolCall] = []
    errors: list[str] = []
    pos = 0
    while True:
        opened = text.find(start, pos)
        if opened == -1:
            segments.append(text[pos:])
            break
        body_at = opened + len(start)
        closed = text.find(end, body_at)
        reopened = text.find(start, body_at)
        if closed == -1:
            errors.append(f"{start} at offset {opened} is never closed with {end}")
            segments.append(text[pos:])
            break
        if reopened != -1 and reopened < closed:
            errors.append(f"{start} at offset {opened} is not closed before the next {start}")
            segments.append(text[pos:reopened])
            pos = reopened
            continue
        block_end = closed + len(end)
        raw = text[opened:block_end]
        segments.append(text[pos:opened])
        outcome = parse_block(text[body_at:closed], raw, schemas)
        if isinstance(outcome, ToolCall) and known is not None and outcome.name not in known:
            outcome = f"tool {outcome.name!r} is not among the offered tools {sorted(known)}"
        if isinstance(outcome, ToolCall):
            calls.append(outcome)
        else:
            errors.append(f"tool call at offset {opened}: {outcome}")
            segments.append(raw)
        pos = block_end
    normal = "".join(segments)
    if calls:
        normal = normal.strip()
    return ToolCallResult(
        normal_text=normal, calls=tuple(calls), ill_formed=bool(errors), errors=tuple(errors)
    )


class TaggedToolCallParser(ToolCallParser):
    """A format with one call per ``start_token…end_token`` block; subclasses parse a block."""

    end_token: ClassVar[str]

    @staticmethod
    @abc.abstractmethod
    def parse_block(
        inner: str, raw: str, schemas: Mapping[str, Mapping[str, Any]]
    ) -> ToolCall | str:
        """One block's inner text as a call, or the reason it is malformed."""

    def parse(
        self, text: str, *, tools: Sequence[Mapping[str, Any]] | None = None
    ) -> ToolCallResult:
        return scan_blocks(
            text,
            start=self.start_token,
            end=self.end_token,
            parse_block=self.parse_block,
            tools=tools if tools is not None else self.tools,
        )
