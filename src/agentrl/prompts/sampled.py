"""The recorded assistant message keeps what the policy sampled, character for character.

Public API::

    sampled_reasoning(reasoning) -> str             # the text between the tags, as recorded
    sampled_content(content, *, tool_calls=(), trimmed="", after_reasoning=False) -> str
    keep_sampled(recorded, turn) -> dict | None     # the adapter's recorded message, as sampled

A client is sent the turn's text and reasoning trimmed. The message the trajectory records
(and the session restores the client's replays to) keeps them as sampled instead, in the
form a ``<think>\\n…\\n</think>\\n\\n`` chat template (Qwen3's, DeepSeek's) renders back to
the sampled tokens:

- reasoning: the text between ``<think>`` and ``</think>``, whitespace kept, less the one
  newline that opens and the one that closes it (the template writes those itself:
  ``<think>\\n`` + reasoning stripped of newlines + ``\\n</think>``), so the sampled
  ``<think>\\n  X  \\n</think>`` renders back exactly. An empty block keeps its bare
  newlines (``"\\n\\n"``): the template renders that as ``<think>\\n\\n</think>``,
  where an empty string would drop the block.
- content: the text after ``</think>`` without the newlines the template writes there
  itself (it strips them from the content and writes ``\\n\\n``); without reasoning, the
  text as sampled.
- before tool calls: the text before the first call minus the newline the template
  writes before ``<tool_call>``. Text anywhere else (between or after calls) is put where
  no template puts it back, so such a turn keeps the trimmed text, as before.

What the template cannot write (``</think>`` followed by other than one blank line, more
than one newline just inside the tags) no recorded form can reproduce; the turn is then
masked or forked by the trajectory as any drifted turn is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.adapters.base import AssistantTurn
from agentrl.parsers.base import ToolCall

__all__ = ["keep_sampled", "sampled_content", "sampled_reasoning"]


def sampled_reasoning(reasoning: str) -> str:
    """The reasoning to record for ``reasoning`` (all the text sampled between the tags)."""
    if not reasoning.strip("\n"):
        return reasoning
    if reasoning.startswith("\n"):
        reasoning = reasoning[1:]
    return reasoning[:-1] if reasoning.endswith("\n") else reasoning


def sampled_content(
    content: str,
    *,
    tool_calls: Sequence[ToolCall] = (),
    trimmed: str = "",
    after_reasoning: bool = False,
) -> str:
    """The content to record for ``content`` (the sampled text outside the reasoning block).

    ``after_reasoning``: ``content`` followed ``</think>``. ``tool_calls`` were parsed out
    of ``content``; ``trimmed`` is the text the client gets, kept where the layout around
    the calls cannot be reproduced.
    """
    if after_reasoning:
        content = content.lstrip("\n")
    if not tool_calls:
        return content
    first = content.find(tool_calls[0].raw)
    if first == -1:
        return trimmed
    rest = content[first:]
    for call in tool_calls:
        rest = rest.replace(call.raw, "", 1)
    if rest.strip():
        return trimmed
    before = content[:first]
    return before[:-1] if before.endswith("\n") else before


def keep_sampled(recorded: Mapping[str, Any] | None, turn: AssistantTurn) -> dict[str, Any] | None:
    """``recorded`` (the adapter's translation of its reply) with the text and reasoning as sampled.

    The content is replaced only where the adapter recorded the turn's text as it is, so an
    adapter that records something else keeps it.
    """
    if recorded is None:
        return None
    message = dict(recorded)
    if message.get("role") != "assistant":
        return message
    content = message.get("content")
    if turn.sampled_text is not None and content == turn.text:
        content = turn.sampled_text
    rest = {k: v for k, v in message.items() if k not in ("role", "content", "reasoning_content")}
    kept: dict[str, Any] = {"role": "assistant", "content": content}
    if turn.sampled_reasoning is not None:
        kept["reasoning_content"] = turn.sampled_reasoning
    elif "reasoning_content" in message:
        kept["reasoning_content"] = message["reasoning_content"]
    return {**kept, **rest}
