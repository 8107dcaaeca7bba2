"""One way to build a turn's prompt, chosen once: :class:`SpliceBuilder` or :class:`RenderBuilder`.

Public API::

    builder = prompt_builder(mode, tokenizer, chat_template_kwargs=None, stop_ids=())
    state = PromptState()                  # one per session: its chains and its splice ledger
    built = builder.build(state, messages, tools, links, sid=sid, index=i)    # -> BuiltPrompt
    builder.length(state, messages, tools, links) -> int     # the same choice, nothing kept
    builder.recorded(state, built, index, sampled, recorded)  # the turn was recorded
    builder.mode, builder.stats

``render`` renders the whole conversation with the chain's incremental renderer (ids
identical to ``apply_chat_template``). ``splice`` (the default) feeds the engine the recorded
ids of the chain the conversation extends plus the template's rendering of only the new
messages (:mod:`agentrl.prompts.splice`); where a delta cannot be expressed exactly it
renders, which starts a new chain, and the plan says why. A builder is picked when the
middleware is built; the turn never asks which one it has.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from agentrl.prompts.rendering import IncrementalRenderer, RenderedPrompt, render_full
from agentrl.prompts.splice import (
    SpliceLedger,
    SplicePlan,
    Splicer,
    check_prompt_mode,
    stop_ids_for,
)
from agentrl.trajectory import common_prefix_length

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "BuiltPrompt",
    "Chain",
    "PromptBuilder",
    "PromptState",
    "RenderBuilder",
    "SpliceBuilder",
    "prompt_builder",
]

logger = logging.getLogger(__name__)

#: Conversation chains (each with its own renderer) kept per session.
MAX_CHAINS = 8
#: Recently opened conversation chains kept as donors for new chains (any session).
RECENT_CHAINS = 4

Messages = Sequence[Mapping[str, Any]]
Tools = Sequence[Mapping[str, Any]] | None


@attrs.define(eq=False)
class Chain:
    """One conversation chain: its renderer (and so its tools) and the messages it last rendered."""

    renderer: IncrementalRenderer
    messages: list[dict[str, Any]] = attrs.field(factory=list)
    last_used: int = 0

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        return self.renderer.tools


@attrs.define(eq=False)
class PromptState:
    """One session's prompt-building state: its rendering chains and its splice ledger."""

    chains: list[Chain] = attrs.field(factory=list)
    #: The recorded turns a spliced prompt can extend (splice mode).
    splice: SpliceLedger = attrs.field(factory=SpliceLedger)
    clock: int = 0


@attrs.frozen(kw_only=True)
class BuiltPrompt:
    """A turn's prompt, the messages to record it under, and how it was made."""

    prompt: RenderedPrompt
    #: The conversation as the turn records it (spliced: the replayed part as the chain
    #: recorded it, then the new messages).
    messages: list[dict[str, Any]]
    #: The splice plan (splice mode; its ``reason`` says why a prompt was rendered).
    plan: SplicePlan | None = None

    def metadata(self) -> dict[str, Any]:
        """The recorded turn's ``prompt_mode`` (and the splice's base or fallback reason)."""
        return self.plan.metadata() if self.plan is not None else {"prompt_mode": "render"}


class PromptBuilder:
    """Builds each turn's prompt ids from its messages; one per middleware."""

    mode: ClassVar[str]
    #: What the recorded turns' prompts were: ``"spliced"`` and each fallback reason.
    stats: collections.Counter[str]

    def build(
        self,
        state: PromptState,
        messages: list[dict[str, Any]],
        tools: Tools,
        links: Mapping[int, int],
        *,
        sid: str = "",
        index: int = 0,
    ) -> BuiltPrompt:
        """The prompt for ``messages`` (``links``: message index -> the turn it replays)."""
        raise NotImplementedError

    def length(
        self, state: PromptState, messages: list[dict[str, Any]], tools: Tools, links: Mapping
    ) -> int:
        """How many ids :meth:`build` would give now; nothing is kept or counted."""
        raise NotImplementedError

    def recorded(
        self,
        state: PromptState,
        built: BuiltPrompt,
        index: int,
        sampled: Sequence[int],
        recorded: dict[str, Any] | None,
    ) -> None:
        """Turn ``index``, built as ``built``, was recorded (``recorded``: its message)."""


@attrs.define(eq=False)
class RenderBuilder(PromptBuilder):
    """The whole conversation rendered by its chain's incremental renderer."""

    mode: ClassVar[str] = "render"

    tokenizer: PreTrainedTokenizerBase
    chat_template_kwargs: dict[str, Any] = attrs.field(factory=dict)
    stats: collections.Counter[str] = attrs.field(factory=collections.Counter)
    #: Recently opened chains, any session: a new chain starts from the one sharing most.
    recent: collections.deque[Chain] = attrs.field(
        factory=lambda: collections.deque(maxlen=RECENT_CHAINS)
    )
    #: Guards the chains shared across sessions (builds run in the pool's threads).
    _lock: threading.Lock = attrs.field(factory=threading.Lock)

    def build(self, state, messages, tools, links, *, sid="", index=0) -> BuiltPrompt:
        renderer = self.chain_for(state, messages, tools, sid=sid).renderer
        return BuiltPrompt(prompt=renderer.render(messages, tools=tools), messages=messages)

    def length(self, state, messages, tools, links) -> int:
        kwargs = self.chat_template_kwargs
        return len(render_full(self.tokenizer, messages, tools, chat_template_kwargs=kwargs))

    def chain_for(
        self, state: PromptState, messages: list[dict[str, Any]], tools: Tools, *, sid: str = ""
    ) -> Chain:
        """The chain this conversation continues, with its renderer (a new chain if none).

        A new chain starts from the recent chain (another session's, typically) that shares
        the most leading messages and the same tools, when there is one.
        """
        with self._lock:
            state.clock += 1
            best = _longest(state.chains, messages, tools)
            if best is None:
                if len(state.chains) >= MAX_CHAINS:
                    state.chains.remove(min(state.chains, key=lambda c: c.last_used))
                donor = _longest(self.recent, messages, tools)
                if donor is not None:
                    # Sessions of one agent share a long system prompt and tools: start there.
                    kwargs = self.chat_template_kwargs
                    renderer = donor.renderer.fork(chat_template_kwargs=kwargs)
                else:
                    renderer = IncrementalRenderer(
                        self.tokenizer, tools=tools, chat_template_kwargs=self.chat_template_kwargs
                    )
                best = Chain(renderer=renderer)
                state.chains.append(best)
                logger.debug("session %s: conversation chain %d opened", sid, len(state.chains))
            best.messages = list(messages)
            best.last_used = state.clock
            if best not in self.recent:
                self.recent.append(best)
        return best


@attrs.define(eq=False)
class SpliceBuilder(PromptBuilder):
    """The chain's recorded ids plus the new messages' rendering; else :class:`RenderBuilder`."""

    mode: ClassVar[str] = "splice"

    render: RenderBuilder
    splicer: Splicer

    @property
    def stats(self) -> collections.Counter[str]:  # type: ignore[override]
        return self.splicer.stats

    def build(self, state, messages, tools, links, *, sid="", index=0) -> BuiltPrompt:
        plan = self.splicer.plan(state.splice, messages, tools, links, sid=sid, index=index)
        if plan.prompt is None:
            built = self.render.build(state, messages, tools, links, sid=sid, index=index)
            return attrs.evolve(built, plan=plan)
        # Recorded as the chain recorded the conversation, then the new messages: the
        # replayed part may differ from the record only in what splicing ignores.
        base = plan.base.conversation if plan.base is not None else ()
        if base:
            messages = [*base, *messages[len(base) :]]
        return BuiltPrompt(prompt=plan.prompt, messages=messages, plan=plan)

    def length(self, state, messages, tools, links) -> int:
        plan = self.splicer.preview(state.splice, messages, tools, links)
        if plan.prompt is not None:
            return len(plan.prompt.ids)
        return self.render.length(state, messages, tools, links)

    def recorded(self, state, built, index, sampled, recorded) -> None:
        assert built.plan is not None
        self.splicer.count(built.plan)
        if sampled and recorded is not None:
            state.splice.add(index, built.plan, built.prompt.ids, sampled, recorded, built.messages)


def prompt_builder(
    mode: str,
    tokenizer: PreTrainedTokenizerBase,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    stop_ids: Collection[int] = (),
) -> PromptBuilder:
    """The builder for ``mode`` (``splice`` or ``render``); ValueError naming the modes."""
    kwargs = dict(chat_template_kwargs or {})
    render = RenderBuilder(tokenizer, kwargs)
    if check_prompt_mode(mode) == "render":
        return render
    stops = stop_ids_for(tokenizer, frozenset(stop_ids))
    return SpliceBuilder(render, Splicer(tokenizer, kwargs, stops))


def _longest(
    chains: Collection[Chain], messages: Messages, tools: Tools
) -> tuple[Chain | None, int]:
    """The chain with the same tools sharing the most leading messages (None: none shares one)."""
    best, best_len = None, 0
    for chain in chains:
        if chain.tools != tools:
            continue
        shared = common_prefix_length(chain.messages, messages)
        if shared > best_len:
            best, best_len = chain, shared
    return best
