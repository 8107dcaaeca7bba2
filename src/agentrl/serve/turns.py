"""One turn of one session: prompt → clamp → generate → parse → reply → record.

:class:`TurnPipeline` holds what every turn shares (the engine, the prompt builder, the
parsers, the trajectory manager); :meth:`TurnPipeline.run` runs one :class:`Turn`, whose
steps are:

- ``prompt``: restore the client's rewritten replays, then build the prompt with the
  pipeline's :class:`~agentrl.prompts.builders.PromptBuilder` (splice or render, chosen
  when the middleware was built; a template that rejects the conversation is a 400
  quoting it);
- ``generate``: clamp ``max_new_tokens`` to the context budget (a prompt already over
  budget finishes with ``length`` without an engine call) and await the whole generation
  (an engine failure is a 502; cancelling aborts the engine request); a generation the
  engine aborts is continued from what was sampled while the session is open
  (:mod:`agentrl.serve.aborts`), and ``max_engine_aborts`` aborts in a row are a 503;
- ``parse``: decode the sampled ids and split reasoning and tool calls;
- ``reply``: send it in the adapter's shape (a client gone away is not recorded);
- ``record``: the trajectory turn, the session's :class:`~agentrl.types.TurnFact`, the
  timing and the ``on_turn_recorded`` event, in that order.

:meth:`TurnPipeline.prompt_length` answers ``count_tokens``: the length of the prompt
``prompt`` would make, found without changing anything.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from agentrl import plugins
from agentrl.adapters.base import Adapter, AssistantTurn, ChatRequest, ProtocolError
from agentrl.adapters.wire_ids import mint_id, seal
from agentrl.engines.base import (
    Engine,
    EngineAbortedError,
    EngineError,
    Generation,
)
from agentrl.parsers.base import ReasoningParser, ToolCallParser
from agentrl.prompts.builders import BuiltPrompt, PromptBuilder
from agentrl.prompts.rendering import RenderedPrompt, RenderError
from agentrl.prompts.sampled import keep_sampled
from agentrl.prompts.splice import links_by_index
from agentrl.retry import RetryPolicy
from agentrl.serve import aborts, replies
from agentrl.serve.offload import Offloader
from agentrl.serve.output import ParsedOutput, parse_generation
from agentrl.serve.sampling import DEFAULT_MAX_NEW_TOKENS, sampling_params
from agentrl.serve.sessions import Session, new_token
from agentrl.trajectory import TrajectoryManager, TurnRecord
from agentrl.types import TurnFact, TurnRecordedEvent

if TYPE_CHECKING:
    from aiohttp import web
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "DEFAULT_MAX_NEW_TOKENS",
    "ParsedOutput",
    "Turn",
    "TurnPipeline",
    "TurnTiming",
    "parse_generation",
    "renderable",
    "sampling_params",
]

logger = logging.getLogger(__name__)


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


@contextlib.contextmanager
def renderable() -> Iterator[None]:
    """Answer a conversation the chat template rejects with a 400 quoting the template."""
    try:
        yield
    except RenderError as exc:
        raise ProtocolError(400, f"cannot render this conversation: {exc}") from None


def _timings() -> collections.deque[TurnTiming]:
    return collections.deque(maxlen=100_000)


@attrs.define(kw_only=True, eq=False)
class TurnPipeline:
    """What every turn shares: the engine, the prompt builder, the parsers, the trajectory manager.

    The middleware builds one and runs each authenticated turn through :meth:`run`, under
    its session's lock.
    """

    engine: Engine
    #: Builds every prompt (splice or render), chosen once.
    prompts: PromptBuilder
    #: Decodes the sampled ids (the tokenizer whose template the builder renders).
    tokenizer: PreTrainedTokenizerBase
    trajectory: TrajectoryManager
    tool_parser: ToolCallParser | None = None
    reasoning_parser: ReasoningParser | None = None
    #: The latest recorded turns' timings (monitoring, benchmarks).
    timings: collections.deque[TurnTiming] = attrs.field(factory=_timings)
    #: Token ids trimmed from the end of a generation before it is decoded and parsed.
    stop_ids: frozenset[int] = frozenset()
    #: Where prompt building runs: a bounded pool, off the event loop.
    offloader: Offloader = attrs.field(factory=Offloader)
    #: Engine aborts in a row that fail a turn (a 503); each one before is continued while
    #: the session is open. 0: an aborted generation is sent to the client as it is.
    max_engine_aborts: int = attrs.field(
        default=aborts.DEFAULT_MAX_ENGINE_ABORTS,
        validator=lambda _, a, v: aborts.check_max_engine_aborts(v),
    )
    #: The wait before each continuation of an aborted generation.
    abort_backoff: RetryPolicy = aborts.ABORT_BACKOFF

    async def run(
        self,
        adapter: Adapter,
        request: web.Request,
        session: Session,
        chat: ChatRequest,
        *,
        index: int,
        started: float,
    ) -> web.StreamResponse:
        """Run turn ``index`` of ``session`` (request arrived at ``started``); the response sent."""
        turn = Turn(
            pipeline=self, adapter=adapter, session=session, chat=chat, index=index, started=started
        )
        del chat  # the turn holds it, and lets the request's messages go once it is spliced
        return await turn.run(request)

    def prompt_length(self, session: Session, chat: ChatRequest) -> int:
        """How many tokens a turn of ``session`` would send the engine for ``chat`` now.

        :meth:`Turn.prompt`'s choice, read-only (``count_tokens``): the replays restored,
        then the builder's length. Nothing is recorded or counted, no chain is opened and
        no turn index is taken.
        """
        messages, _ = session.restore_replays(chat.messages, chat.replayed_ids)
        links = links_by_index(session.links(chat.replayed_ids))
        with renderable():
            return self.prompts.length(session.prompts, messages, chat.tools, links)

    async def call_engine(
        self, session: Session, index: int, prompt: RenderedPrompt, params: dict[str, Any]
    ) -> aborts.Continued:
        """The engine's whole generation, each engine abort continued while the session is
        open; a failing or unreachable engine is a 502, one that aborts the turn
        ``max_engine_aborts`` times in a row a 503 (counted in ``session.aborted_turns``)."""
        try:
            return await aborts.generate(
                functools.partial(self._attempt, session, index),
                prompt.ids,
                params,
                wanted=lambda: not session.closed,
                max_aborts=self.max_engine_aborts,
                backoff=self.abort_backoff,
                what=f"session {session.sid} turn {index}",
            )
        except EngineAbortedError as exc:
            session.aborted_turns += 1
            raise ProtocolError(
                503, f"{exc}; the turn was not recorded: retry it once the engine serves"
            ) from None

    async def _attempt(
        self, session: Session, index: int, ids: Sequence[int], params: Mapping[str, Any]
    ) -> Generation:
        """One engine call under a fresh rid; a failing or unreachable engine is a 502."""
        rid = f"{session.sid}-t{index}-{new_token()[-8:]}"
        try:
            return await self.engine.generate(ids, params, rid=rid, routing_key=session.sid)
        except asyncio.CancelledError:
            # Cancelling generate aborts the engine request (the Engine contract).
            logger.info(
                "session %s turn %d cancelled; engine request %s aborted", session.sid, index, rid
            )
            raise
        except EngineError as exc:
            status = f" (HTTP {exc.status})" if exc.status else ""
            raise ProtocolError(
                502, f"the inference engine failed{status}: {exc}; the turn was not recorded"
            ) from None
        except (OSError, asyncio.TimeoutError) as exc:
            raise ProtocolError(
                502, f"the inference engine is unreachable: {type(exc).__name__}: {exc}"
            ) from None


@attrs.define(kw_only=True, eq=False)
class Turn:
    """One turn of one session, from the translated request to the recorded turn."""

    pipeline: TurnPipeline
    adapter: Adapter
    session: Session
    #: The client's request; :meth:`prompt` puts the replays it restored into it.
    chat: ChatRequest
    index: int
    #: ``time.perf_counter()`` when the request arrived.
    started: float
    #: Indices of the messages :meth:`prompt` restored to what was recorded.
    restored: list[int] = attrs.field(factory=list)
    #: The prompt :meth:`prompt` built and how (set once it has run).
    built: BuiltPrompt | None = None
    engine_seconds: float = 0.0
    #: Where the generation was resumed after an engine abort (``engine_resumes``).
    resumes: tuple[dict[str, Any], ...] = ()
    #: ``time.time()`` when the turn began (the session page's timeline).
    wall_started: float = attrs.field(factory=time.time)

    async def run(self, request: web.Request) -> web.StreamResponse:
        """Prompt → clamp → generate → parse → reply → record; returns the response sent.

        The prompt is built in the pipeline's :attr:`~TurnPipeline.offloader` pool.
        """
        prompt = await self.pipeline.offloader.run(
            self.session, self.prompt, body_bytes=request.content_length
        )
        generation = await self.generate(prompt)
        turn = self.parse(prompt, generation)
        response, recorded = await self.reply(request, turn)
        self.record(prompt, generation, turn, recorded)
        return response

    def prompt(self) -> RenderedPrompt:
        """The prompt, with each replay the client rewrote put back as it was recorded."""
        messages, self.restored = self.session.restore_replays(
            self.chat.messages, self.chat.replayed_ids
        )
        session, chat = self.session, self.chat
        links = links_by_index(session.links(chat.replayed_ids))
        with renderable():
            self.built = self.pipeline.prompts.build(
                session.prompts, messages, chat.tools, links, sid=session.sid, index=self.index
            )
        if self.built.messages is not chat.messages:
            self.chat = attrs.evolve(chat, messages=self.built.messages)
        return self.built.prompt

    async def generate(self, prompt: RenderedPrompt) -> Generation:
        """The engine's generation, ``max_new_tokens`` clamped to the context budget."""
        session = self.session
        params = sampling_params(session, self.chat, len(prompt.ids))
        if params is None:
            logger.warning(
                "session %s turn %d: prompt of %d tokens fills the context budget of %d; "
                "finishing with 'length' without calling the engine",
                session.sid,
                self.index,
                len(prompt.ids),
                session.max_context_tokens,
            )
            return Generation(output_ids=(), logprobs=(), finish_reason="length")
        started = time.perf_counter()
        continued = await self.pipeline.call_engine(session, self.index, prompt, params)
        self.engine_seconds = time.perf_counter() - started
        self.resumes = continued.resumes
        return continued.generation

    def parse(self, prompt: RenderedPrompt, generation: Generation) -> AssistantTurn:
        """What the adapter replies with: the parsed output and this turn's wire-id minters."""
        pipeline, session, index = self.pipeline, self.session, self.index
        parsed = parse_generation(
            generation,
            tokenizer=pipeline.tokenizer,
            stop_ids=pipeline.stop_ids,
            tools=self.chat.tools,
            tool_parser=pipeline.tool_parser,
            reasoning_parser=pipeline.reasoning_parser,
            prompt_tail=prompt.tail_text(64),
        )
        return AssistantTurn(
            turn_index=index,
            text=parsed.text,
            reasoning=parsed.reasoning,
            tool_calls=parsed.tool_calls,
            finish_reason=generation.finish_reason,
            prompt_tokens=len(prompt.ids),
            output_tokens=len(generation.output_ids),
            ill_formed=parsed.ill_formed,
            mint=lambda kind, i: session.remember(mint_id(kind, index, i), index),
            seal=lambda kind, text: session.remember(seal(kind, index, text), index),
            sampled_text=parsed.sampled_text,
            sampled_reasoning=parsed.sampled_reasoning,
        )

    async def reply(
        self, request: web.Request, turn: AssistantTurn
    ) -> tuple[web.StreamResponse, dict[str, Any] | None]:
        """Send the adapter's reply; the response and the assistant message to record."""
        reply, recorded = self.adapter.respond(self.chat, turn)
        try:
            response = await replies.write_reply(request, reply)
        except ConnectionError as exc:
            logger.warning(
                "session %s turn %d: client went away before the reply was sent "
                "(%s); the turn is not recorded",
                self.session.sid,
                self.index,
                exc,
            )
            raise
        # The client may have been sent trimmed text; the record keeps what was sampled.
        return response, keep_sampled(recorded, turn)

    def record(
        self,
        prompt: RenderedPrompt,
        generation: Generation,
        turn: AssistantTurn,
        recorded: dict[str, Any] | None,
    ) -> None:
        """Record the sent turn: trajectory, session, timing, then ``on_turn_recorded``."""
        session, sampled = self.session, generation.output_ids
        metadata = self._metadata()
        self.pipeline.trajectory.record_turn(
            session.sid,
            turn=TurnRecord(
                prompt_ids=prompt.ids,
                output_ids=sampled,
                output_logprobs=generation.logprobs,
                finish_reason=generation.finish_reason,
                ill_formed=turn.ill_formed,
            ),
            prompt_messages=self.chat.messages,
            response_message=recorded if sampled else None,
            metadata=metadata,
        )
        session.turns_recorded += 1
        session.turn_facts.append(
            TurnFact(
                prompt_tokens=turn.prompt_tokens,
                output_tokens=turn.output_tokens,
                finish_reason=turn.finish_reason,
                index=self.index,
                tool_calls=tuple(call.name for call in turn.tool_calls),
                ill_formed=turn.ill_formed,
                engine_seconds=round(self.engine_seconds, 6),
                started=self.wall_started,
            )
        )
        if sampled and recorded is not None:
            session.record_response(self.index, recorded)
        assert self.built is not None
        self.pipeline.prompts.recorded(session.prompts, self.built, self.index, sampled, recorded)
        self.pipeline.timings.append(self._timing(prompt, turn))
        plugins.notify("on_turn_recorded", self._event(turn, metadata))

    def _metadata(self) -> dict[str, Any]:
        return {
            "protocol": self.adapter.name,
            "middleware_turn": self.index,
            "replayed_turns": self.session.links(self.chat.replayed_ids),
            "restored_replays": self.restored,
            "engine_seconds": round(self.engine_seconds, 6),
            **({"engine_resumes": list(self.resumes)} if self.resumes else {}),
            **(self.built.metadata() if self.built is not None else {}),
        }

    def _timing(self, prompt: RenderedPrompt, turn: AssistantTurn) -> TurnTiming:
        return TurnTiming(
            session_id=self.session.sid,
            turn_index=self.index,
            prompt_tokens=turn.prompt_tokens,
            reused_prompt_tokens=prompt.reused_tokens,
            output_tokens=turn.output_tokens,
            engine_seconds=self.engine_seconds,
            overhead_seconds=time.perf_counter() - self.started - self.engine_seconds,
        )

    def _event(self, turn: AssistantTurn, metadata: dict[str, Any]) -> TurnRecordedEvent:
        return TurnRecordedEvent(
            session_id=self.session.sid,
            turn_index=self.index,
            prompt_tokens=turn.prompt_tokens,
            output_tokens=turn.output_tokens,
            finish_reason=turn.finish_reason,
            protocol=self.adapter.name,
            metadata=metadata,
        )
