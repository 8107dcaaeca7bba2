"""The protocol-independent steps of a turn: sampling parameters and output parsing."""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from typing import Any

import attrs

from agentrl.adapters.protocol import ChatRequest, ToolCall
from agentrl.engines.base import TOKEN_EXACT_SAMPLING

__all__ = [
    "DEFAULT_MAX_NEW_TOKENS",
    "ParsedOutput",
    "TurnTiming",
    "parse_generation",
    "sampling_params",
]

logger = logging.getLogger(__name__)

#: ``max_new_tokens`` when neither the session nor the client sets one.
DEFAULT_MAX_NEW_TOKENS = 8192
_CLIENT_SAMPLING = ("temperature", "top_p", "top_k")


@attrs.frozen(kw_only=True)
class TurnTiming:
    """Where one recorded turn's time went: the engine, and everything else (overhead).

    ``overhead_seconds`` runs from the request's arrival to the recorded turn, minus the
    engine call: body parsing, translation, rendering, output parsing, the reply, recording.
    """

    session_id: str
    turn_index: int
    prompt_tokens: int
    reused_prompt_tokens: int
    output_tokens: int
    engine_seconds: float
    overhead_seconds: float


def sampling_params(session: Any, chat: ChatRequest, prompt_tokens: int) -> dict[str, Any] | None:
    """The engine's sampling parameters for one turn, or None when the prompt fills the budget.

    ``max_new_tokens`` is the smallest of the session's, the client's and what is left of
    the context budget. Under the ``trainer`` policy the client's temperature / top_p /
    top_k are ignored; under ``client`` they override the session's.
    """
    params: dict[str, Any] = {**TOKEN_EXACT_SAMPLING, **session.sampling_defaults}
    for key in _CLIENT_SAMPLING:
        value = getattr(chat, key)
        if value is None:
            continue
        if session.sampling_policy == "client":
            params[key] = value
        elif params.get(key) != value:
            logger.debug(
                "session %s: ignoring client %s=%r (trainer policy)", session.sid, key, value
            )
    limits = [v for v in (params.get("max_new_tokens"), chat.max_tokens) if v is not None]
    max_new = min(int(v) for v in limits) if limits else DEFAULT_MAX_NEW_TOKENS
    if session.max_context_tokens > 0:
        remaining = session.max_context_tokens - prompt_tokens
        if remaining <= 0:
            return None
        max_new = min(max_new, remaining)
    params["max_new_tokens"] = max(1, max_new)
    if chat.stop:
        own = params.get("stop") or []
        own = [own] if isinstance(own, str) else list(own)
        params["stop"] = own + [s for s in chat.stop if s not in own]
    return params


@attrs.frozen(kw_only=True)
class ParsedOutput:
    text: str
    reasoning: str | None
    tool_calls: tuple[ToolCall, ...]
    ill_formed: bool


def parse_generation(
    generation: Any,
    *,
    tokenizer: Any,
    stop_ids: Collection[int],
    tools: Sequence[dict[str, Any]] | None,
    tool_parser: Any,
    reasoning_parser: Any,
    prompt_tail: str = "",
) -> ParsedOutput:
    """Decode the sampled ids (minus trailing stop tokens) and split reasoning and tool calls."""
    ids = list(generation.output_ids)
    while ids and ids[-1] in stop_ids:
        ids.pop()
    text = tokenizer.decode(ids, skip_special_tokens=False) if ids else ""
    reasoning = None
    if reasoning_parser is not None:
        in_reasoning = None
        if hasattr(reasoning_parser, "prompt_opens_reasoning") and prompt_tail:
            in_reasoning = reasoning_parser.prompt_opens_reasoning(prompt_tail)
        split = reasoning_parser.parse(text, in_reasoning=in_reasoning or None)
        if split.has_reasoning:
            reasoning = split.reasoning
        text = split.content
    calls: tuple[ToolCall, ...] = ()
    ill_formed = False
    if tool_parser is not None:
        result = tool_parser.parse(text, tools=tools)
        text = result.normal_text
        calls = tuple(ToolCall(name=c.name, arguments=c.arguments) for c in result.calls)
        ill_formed = bool(result.ill_formed)
    return ParsedOutput(
        text=text.strip(), reasoning=reasoning, tool_calls=calls, ill_formed=ill_formed
    )
