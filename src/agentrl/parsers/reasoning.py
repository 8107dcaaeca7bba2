"""Reasoning parsers for ``<think>…</think>`` models: ``qwen3`` and ``deepseek_r1``.

Public API::

    ThinkTagReasoningParser(*, in_reasoning: bool | None = None).parse(text, *, in_reasoning=None)
    Qwen3ReasoningParser        name "qwen3"        default in_reasoning: None (detect)
    DeepSeekR1ReasoningParser   name "deepseek_r1"  default in_reasoning: True

``in_reasoning`` says whether the output starts inside the reasoning block:
- True: the prompt opened ``<think>`` (DeepSeek-R1 and Qwen3 "thinking" templates end the
  generation prompt with it); a repeated ``<think>`` at the start of the output is dropped.
- False: reasoning only if the output itself opens ``<think>``.
- None (detect): as True when ``</think>`` appears before any ``<think>``, else as False.
  ``ReasoningParser.prompt_opens_reasoning(prompt_text)`` tells it exactly when the prompt
  text is at hand.

Reasoning is returned with surrounding whitespace stripped, and so is the content after
``</think>`` (the Qwen3 template writes ``<think>\\n…\\n</think>\\n\\n``);
``sampled_reasoning`` / ``sampled_content`` keep every character as sampled (the text
between the tags, and the text outside them), for recording what the policy produced. An output cut off
inside the block gives ``reasoning_closed=False`` and empty content, except that for
``qwen3`` a ``<tool_call>`` inside an unclosed block ends the reasoning there (Qwen3.5
sometimes skips ``</think>`` before calling a tool). Output without reasoning comes back
unchanged as content.
"""

from __future__ import annotations

from typing import ClassVar

from agentrl.parsers.base import ReasoningParser, ReasoningResult

__all__ = ["DeepSeekR1ReasoningParser", "Qwen3ReasoningParser", "ThinkTagReasoningParser"]


def _join(prefix: str, content: str) -> str:
    prefix = prefix.strip()
    if not prefix:
        return content
    return f"{prefix}\n\n{content}" if content else prefix


class ThinkTagReasoningParser(ReasoningParser):
    """Reasoning between ``start_token`` and ``end_token``, possibly opened by the prompt."""

    name: ClassVar[str] = "think_tags"
    #: Tokens that end an unclosed reasoning block implicitly (kept in the content).
    implicit_end_tokens: ClassVar[tuple[str, ...]] = ()

    def parse(self, text: str, *, in_reasoning: bool | None = None) -> ReasoningResult:
        mode = self._resolve_in_reasoning(in_reasoning)
        start, end = self.start_token, self.end_token
        start_at, end_at = text.find(start), text.find(end)
        prefix = ""
        if mode is None:
            mode = end_at != -1 and (start_at == -1 or end_at < start_at)
        if mode:
            body = text
            stripped = body.lstrip()
            if stripped.startswith(start):
                body = stripped[len(start) :]
        elif start_at == -1:
            return ReasoningResult(reasoning="", content=text, has_reasoning=False)
        else:
            prefix = text[:start_at]
            body = text[start_at + len(start) :]
        close = body.find(end)
        if close == -1:
            implicit = [i for i in (body.find(t) for t in self.implicit_end_tokens) if i != -1]
            if implicit:
                # The model went straight from reasoning to a tool call without </think>.
                cut = min(implicit)
                return _split(prefix, body[:cut], body[cut:], closed=True)
            return _split(prefix, body, "", closed=False)
        return _split(prefix, body[:close], body[close + len(end) :], closed=True)


def _split(prefix: str, reasoning: str, after: str, *, closed: bool) -> ReasoningResult:
    """The result for a block ``reasoning`` between ``prefix`` and ``after`` (both as sampled)."""
    content = _join(prefix, after.strip()) if closed else prefix.strip()
    return ReasoningResult(
        reasoning=reasoning.strip(),
        content=content,
        reasoning_closed=closed,
        has_reasoning=True,
        sampled_reasoning=reasoning,
        sampled_content=prefix + after,
    )


class Qwen3ReasoningParser(ThinkTagReasoningParser):
    """Qwen3 (hybrid thinking): reasoning only where the output or prompt opened ``<think>``."""

    name: ClassVar[str] = "qwen3"
    #: Proven by tests/parsers/test_parsers_sglang.py.
    sglang_equivalents: ClassVar[tuple[str, ...]] = ("qwen3",)
    default_in_reasoning: ClassVar[bool | None] = None
    implicit_end_tokens: ClassVar[tuple[str, ...]] = ("<tool_call>",)


class DeepSeekR1ReasoningParser(ThinkTagReasoningParser):
    """DeepSeek-R1: the template opens ``<think>``, so output starts inside reasoning."""

    name: ClassVar[str] = "deepseek_r1"
    #: Proven by tests/parsers/test_parsers_sglang.py.
    sglang_equivalents: ClassVar[tuple[str, ...]] = ("deepseek-r1",)
    default_in_reasoning: ClassVar[bool | None] = True
