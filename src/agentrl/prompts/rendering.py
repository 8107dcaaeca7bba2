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

    RenderedPrompt(text: str, ids: array, reused_tokens: int, tokenized_chars: int)
    prompt.tail_text(chars) -> str                                  # the text's last chars
    RenderError                                                     # the template failed

``renderer.render(messages).ids`` is always identical to
``tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
tokenize=True)["input_ids"]``.

``RenderedPrompt.ids`` is an ``array('I')`` (``'Q'`` for a vocabulary past 2**32 ids),
no longer a tuple: 4 bytes a token, shared with the renderer that made it, so it is
read-only by convention (copy it before changing it). A list or tuple passed to
``RenderedPrompt`` is converted. ``RenderedPrompt.text`` is still a ``str``, but a
renderer's prompt keeps it as the pieces its renderer keeps anyway and joins them when
asked; ``tail_text`` reads the end without joining.

How: the messages are rendered to text with the compiled chat template (see
:mod:`agentrl.prompts.templates`), the previous turn's text is compared with it piece by
piece (the pieces end at added-token boundaries, ``<|im_end|>``, ``<tool_call>``, …),
the previous ids are reused up to the last piece that still matches, and only the rest is
tokenized, in pieces cut at the boundaries it holds (see :mod:`agentrl.prompts.segments`
for why those cuts never change a token). The previous text is kept only as those pieces
(each a compact string: one non-ASCII character widens its own piece, not the prompt).
Tokenizers without a Rust backend, or whose first token depends on the start of the
input, are tokenized in full.
"""

from __future__ import annotations

import logging
import weakref
from array import array
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from agentrl.prompts.segments import SegmentEncoder, as_id_array, boundary_ids, id_array
from agentrl.prompts.templates import RenderError, render_chat

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

#: Kept for callers of the old private name.
_boundary_ids = boundary_ids


@attrs.frozen(kw_only=True, eq=False)
class RenderedPrompt:
    """One turn's prompt: the rendered text, its token ids and how much was reused.

    ``text`` may be given as a ``str`` or as the pieces it is made of.
    """

    _text: str | tuple[str, ...] = attrs.field(alias="text", repr=False)
    ids: array = attrs.field(converter=as_id_array, repr=len)
    reused_tokens: int = 0
    tokenized_chars: int = 0

    @property
    def text(self) -> str:
        """The whole rendered text."""
        value = self._text
        return value if isinstance(value, str) else "".join(value)

    def tail_text(self, chars: int) -> str:
        """The last ``chars`` characters of :attr:`text` (without joining the rest)."""
        value = self._text
        if chars <= 0:
            return ""
        if isinstance(value, str):
            return value[-chars:]
        out: list[str] = []
        for piece in reversed(value):
            out.append(piece[-chars:])
            chars -= len(piece)
            if chars <= 0:
                break
        return "".join(reversed(out))


@attrs.define
class RenderStats:
    """Running totals for one renderer (benchmarks and logs)."""

    turns: int = 0
    reused_tokens: int = 0
    new_tokens: int = 0
    tokenized_chars: int = 0


_render_text = render_chat  # the template's text, compiled where possible (templates)


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


@attrs.frozen
class _State:
    """One turn, replaced whole after each render, so a fork in another thread (a donor
    chain) sees one consistent turn: the text as its pieces (each ending at a boundary)
    and what follows the last one, the ids, and the id count after each piece."""

    segments: tuple[str, ...] = ()
    counts: array = attrs.field(factory=lambda: array("I"))
    ids: array = attrs.field(factory=lambda: array("I"))
    rest: str = ""
    reused: int = 0
    tokenized: int = 0


_EMPTY = _State()


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
        self._encoder = SegmentEncoder.for_tokenizer(tokenizer)
        self._state = _EMPTY
        self._last: weakref.ref[RenderedPrompt] | None = None

    @property
    def last(self) -> RenderedPrompt | None:
        """The previous turn's prompt (None before the first render or after reset)."""
        state = self._state
        if state is _EMPTY:
            return None
        prompt = self._last() if self._last is not None else None
        if prompt is None:
            prompt = self._prompt(state)
        return prompt

    def reset(self) -> None:
        """Forget the previous turn; the next render tokenizes everything."""
        self._state = _EMPTY
        self._last = None

    def fork(
        self, *, tools: Any = _UNSET, chat_template_kwargs: Mapping[str, Any] | None = None
    ) -> IncrementalRenderer:
        """A new renderer that starts from this one's last prompt (sharing it, no copy).

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
        clone._state = self._state
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
        encoder = self._encoder
        if encoder is None:
            ids = id_array(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            return self._record(_State(ids=ids, rest=text, tokenized=len(text)))
        old = self._state
        keep = position = 0
        for segment in old.segments:
            if not text.startswith(segment, position):
                break
            position += len(segment)
            keep += 1
        reused = old.counts[keep - 1] if keep else 0
        tail = text[position:]
        new = encoder.encode(tail)
        ids = old.ids[:reused]
        if ids.typecode != new.ids.typecode:
            ids = array(new.ids.typecode, ids)
        ids.extend(new.ids)
        counts = old.counts[:keep]
        counts.extend(reused + count for count in new.counts)
        state = _State(
            segments=old.segments[:keep] + tuple(new.segments),
            counts=counts,
            ids=ids,
            rest=new.rest,
            reused=reused,
            tokenized=len(tail),
        )
        return self._record(state)

    def _prompt(self, state: _State) -> RenderedPrompt:
        prompt = RenderedPrompt(
            text=(*state.segments, state.rest),
            ids=state.ids,
            reused_tokens=state.reused,
            tokenized_chars=state.tokenized,
        )
        self._last = weakref.ref(prompt)
        return prompt

    def _record(self, state: _State) -> RenderedPrompt:
        self._state = state
        self.stats.turns += 1
        self.stats.reused_tokens += state.reused
        self.stats.new_tokens += len(state.ids) - state.reused
        self.stats.tokenized_chars += state.tokenized
        return self._prompt(state)
