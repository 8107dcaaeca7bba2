"""Incremental prompt rendering: each turn tokenizes only what changed since the last one.

Public API::

    renderer = IncrementalRenderer(tokenizer, tools=None, chat_template=None,
                                   chat_template_kwargs=None)      # one per session
    prompt = renderer.render(messages, tools=<unchanged>)           # -> RenderedPrompt
    renderer.render_text(messages, tools=<unchanged>) -> str        # the template's text only
    renderer.fork(tools=<same>, chat_template_kwargs=None) -> IncrementalRenderer  # shares state
    renderer.reset(); renderer.last -> RenderedPrompt | None; renderer.stats -> RenderStats
    render_full(tokenizer, messages, tools=None, chat_template=None,
                chat_template_kwargs=None) -> list[int]             # reference: full tokenization
    render_text(tokenizer, messages, ...same) -> str                # the template's text only

    RenderedPrompt(text: str, ids: tuple[int, ...], reused_tokens: int, tokenized_chars: int)
    RenderError                                                     # the template failed

``renderer.render(messages).ids`` is always identical to
``tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
tokenize=True)["input_ids"]``.

How: the messages are rendered to text with the chat template (cheap), the longest common
prefix with the previous turn's text is found, and the previous ids are reused up to the
last added-token boundary (``<|im_end|>``, ``<tool_call>``, …) inside that prefix. The
tokenizer splits its input at added tokens before normalising or pre-tokenising, so the
text before such a boundary always tokenizes the same way, whatever follows it. Only the
rest is tokenized. Added tokens whose match could extend past the boundary (one token's
prefix overlapping another's suffix, ``rstrip``, ``single_word`` or normalised matching)
are never used as boundaries. Tokenizers without a Rust backend are tokenized in full.
"""

from __future__ import annotations

import bisect
import logging
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from agentrl.trajectory import common_prefix_length

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "IncrementalRenderer",
    "RenderError",
    "RenderStats",
    "RenderedPrompt",
    "render_full",
    "render_text",
]

logger = logging.getLogger(__name__)

_UNSET: Any = object()


class RenderError(ValueError):
    """The chat template could not render the messages."""


@attrs.frozen(kw_only=True)
class RenderedPrompt:
    """One turn's prompt: the rendered text, its token ids and how much was reused."""

    text: str
    ids: tuple[int, ...] = attrs.field(converter=tuple)
    reused_tokens: int = 0
    tokenized_chars: int = 0


@attrs.define
class RenderStats:
    """Running totals for one renderer (benchmarks and logs)."""

    turns: int = 0
    reused_tokens: int = 0
    new_tokens: int = 0
    tokenized_chars: int = 0


def _render_text(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    chat_template: str | None,
    chat_template_kwargs: Mapping[str, Any],
) -> str:
    if not messages:
        raise RenderError("cannot render an empty conversation; expected at least one message")
    try:
        text = tokenizer.apply_chat_template(
            [dict(m) for m in messages],
            tools=list(tools) if tools else None,
            chat_template=chat_template,
            add_generation_prompt=True,
            tokenize=False,
            **chat_template_kwargs,
        )
    except Exception as exc:
        roles = [m.get("role") for m in messages]
        raise RenderError(
            f"the chat template failed to render {len(messages)} messages (roles {roles}): "
            f"{type(exc).__name__}: {exc}. Check that every message has a role the template "
            "accepts and string content where it expects one"
        ) from exc
    if not isinstance(text, str):
        raise RenderError(f"the chat template returned {type(text).__name__}, expected str")
    return text


def render_text(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    chat_template: str | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """The chat template's text for ``messages`` with the generation prompt (RenderError)."""
    return _render_text(tokenizer, messages, tools, chat_template, chat_template_kwargs or {})


def render_full(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    chat_template: str | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> list[int]:
    """Render and tokenize everything from scratch (the reference the renderer must match)."""
    text = _render_text(tokenizer, messages, tools, chat_template, chat_template_kwargs or {})
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


_boundary_cache: weakref.WeakKeyDictionary[Any, frozenset[int]] = weakref.WeakKeyDictionary()


def _boundary_ids(tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """Ids of added tokens after which a text can be split without changing its tokens."""
    try:
        return _boundary_cache[tokenizer]
    except (KeyError, TypeError):
        pass
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    tokens = {int(tid): tok for tid, tok in decoder.items() if str(tok)}
    # A match of another added token that starts before a split point and ends after it
    # either contains this token inside its proper prefix, or starts inside this token.
    proper_prefixes: set[str] = set()
    inner: set[str] = set()
    for tok in tokens.values():
        content = str(tok)
        for end in range(1, len(content)):
            prefix = content[:end]
            proper_prefixes.add(prefix)
            inner.update(prefix[start:] for start in range(end))
    safe = set()
    for tid, tok in tokens.items():
        content = str(tok)
        if getattr(tok, "rstrip", False) or getattr(tok, "single_word", False):
            continue
        if getattr(tok, "normalized", False) or content in inner:
            continue
        if any(content[start:] in proper_prefixes for start in range(len(content))):
            continue
        safe.add(tid)
    result = frozenset(safe)
    try:
        _boundary_cache[tokenizer] = result
    except TypeError:
        pass
    return result


class IncrementalRenderer:
    """Per-session prompt renderer whose ids equal a full ``apply_chat_template`` tokenization."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.tools = list(tools) if tools else None
        self.chat_template = chat_template
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.stats = RenderStats()
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        if self._backend is None:
            logger.info(
                "tokenizer %s has no Rust backend; every turn is tokenized in full",
                type(tokenizer).__name__,
            )
        self._boundary_ids = _boundary_ids(tokenizer) if self._backend is not None else frozenset()
        # The previous prompt's text and ids, and parallel ascending lists: a safe split
        # point's char offset and the id count before it. One tuple, replaced whole after
        # each render, so a fork in another thread (a donor chain) sees one consistent turn.
        self._state: tuple[str, list[int], list[int], list[int]] = ("", [], [], [])
        self.last: RenderedPrompt | None = None

    def reset(self) -> None:
        """Forget the previous turn; the next render tokenizes everything."""
        self._state = ("", [], [], [])
        self.last = None

    def fork(
        self, *, tools: Any = _UNSET, chat_template_kwargs: Mapping[str, Any] | None = None
    ) -> IncrementalRenderer:
        """A new renderer that starts from this one's last prompt.

        Any earlier prompt is a valid starting point (reuse follows the text), so chains that
        share a long prefix — sub-agents, sessions with the same system prompt and tools —
        tokenize only where they differ. Stats start from zero.
        """
        clone = IncrementalRenderer(
            self.tokenizer,
            tools=self.tools if tools is _UNSET else tools,
            chat_template=self.chat_template,
            chat_template_kwargs=(
                self.chat_template_kwargs if chat_template_kwargs is None else chat_template_kwargs
            ),
        )
        text, ids, cut_chars, cut_ids = self._state
        clone._state = (text, list(ids), list(cut_chars), list(cut_ids))
        return clone

    def render_text(self, messages: Sequence[Mapping[str, Any]], *, tools: Any = _UNSET) -> str:
        """The chat template's text for ``messages`` with the generation prompt appended."""
        if tools is not _UNSET:
            self.tools = list(tools) if tools else None
        return _render_text(
            self.tokenizer, messages, self.tools, self.chat_template, self.chat_template_kwargs
        )

    def render(
        self, messages: Sequence[Mapping[str, Any]], *, tools: Any = _UNSET
    ) -> RenderedPrompt:
        """Render ``messages`` and tokenize only what differs from the previous turn."""
        text = self.render_text(messages, tools=tools)
        if self._backend is None:
            full_ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            self._record(text, full_ids, reused=0, tokenized=len(text))
            return self.last  # type: ignore[return-value]

        old_text, old_ids, old_cut_chars, old_cut_ids = self._state
        common = common_prefix_length(old_text, text)
        cut = bisect.bisect_right(old_cut_chars, common)
        if cut:
            start_char, start_ids = old_cut_chars[cut - 1], old_cut_ids[cut - 1]
        else:
            start_char, start_ids = 0, 0
        ids, cut_chars, cut_ids = old_ids[:start_ids], old_cut_chars[:cut], old_cut_ids[:cut]
        tail = text[start_char:]
        # encode_batch, not encode: it releases the GIL for a text holding added tokens
        # (a chat template's), so renders in the pool do not stall the event loop.
        encoding = self._backend.encode_batch([tail], add_special_tokens=False)[0]
        boundary_ids = self._boundary_ids
        for token_id, (_, end) in zip(encoding.ids, encoding.offsets, strict=True):
            ids.append(token_id)
            if token_id in boundary_ids:
                cut_chars.append(start_char + end)
                cut_ids.append(len(ids))
        self._record(text, ids, reused=start_ids, tokenized=len(tail), cuts=(cut_chars, cut_ids))
        return self.last  # type: ignore[return-value]

    def _record(
        self,
        text: str,
        ids: list[int],
        *,
        reused: int,
        tokenized: int,
        cuts: tuple[list[int], list[int]] | None = None,
    ) -> None:
        cut_chars, cut_ids = cuts if cuts is not None else ([], [])
        self._state = (text, ids, cut_chars, cut_ids)
        self.stats.turns += 1
        self.stats.reused_tokens += reused
        self.stats.new_tokens += len(ids) - reused
        self.stats.tokenized_chars += tokenized
        self.last = RenderedPrompt(
            text=text, ids=tuple(ids), reused_tokens=reused, tokenized_chars=tokenized
        )
