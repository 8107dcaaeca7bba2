"""The middleware: one aiohttp server for every wire protocol, many sessions.

::

    mw = Middleware(engine=..., tokenizer=..., tool_parser="hermes", reasoning_parser="qwen3",
                    trajectory=TrajectoryManager(), prompt_mode="splice",  # "render", a PromptBuilder
                    max_engine_aborts=8)   # an engine abort is continued; 0: passed on
    await mw.start(host="127.0.0.1", port=0, unix_path=None); mw.url
    token = mw.open_session(sid, sampling_defaults={...}, max_context_tokens=0, max_turns=None)
    samples = await mw.finish_session(sid, reward=1.0, metadata={...})
    await mw.drop_session(sid); await mw.close()

One request: find the session by its token in the headers (401 unknown, 403 closed)
before any of the body is read; read the body up to the session's cap (413; see
:mod:`agentrl.serve.limits`); decode, check and translate it in the render pool (400
in the protocol's error shape; :mod:`agentrl.serve.offload`); take the session lock,
enforce the turn cap (429) and start the turn; the turn itself (prompt, clamp, generate,
parse, reply, record) is :mod:`agentrl.serve.turns`. A started turn is recorded, or
rolled back when the client's request made it fail (a 4xx, the client going away), so
``turns_started - turns_recorded`` counts only turns the engine or the middleware failed.
A client that goes away cancels the handler (``handler_cancellation``), which aborts the
engine request; a generation the engine aborts itself (a weight update) is continued from
what was sampled while the session is open (:mod:`agentrl.serve.aborts`). Each session
keeps what it recorded (``session(sid).turn_facts``) for the rollout that owns it.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from aiohttp import hdrs, web
from aiohttp.http import HttpVersion11

from agentrl import plugins
from agentrl.adapters.base import Adapter, ChatRequest, ProtocolError
from agentrl.engines.base import Engine
from agentrl.parsers.base import ReasoningParser, ToolCallParser
from agentrl.prompts.builders import PromptBuilder, prompt_builder
from agentrl.serve import probes
from agentrl.serve.aborts import DEFAULT_MAX_ENGINE_ABORTS
from agentrl.serve.limits import (
    SERVER_ARGS,
    body_cap,
    count_tokens_allowance,
    decode_json,
    header_problem,
    read_body,
)
from agentrl.serve.offload import Offloader
from agentrl.serve.replies import error_reply, json_reply
from agentrl.serve.sessions import SAMPLING_POLICIES, Session, SessionTable, new_token
from agentrl.serve.turns import TurnPipeline, TurnTiming
from agentrl.tokenizers import check_chat_template_support
from agentrl.trajectory import TrainingSample, TrajectoryManager

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["DEFAULT_MAX_BODY_BYTES", "Middleware", "TurnTiming"]

logger = logging.getLogger(__name__)

#: The ceiling of every session's body cap (:func:`~agentrl.serve.limits.body_cap`).
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024


def _resolve_parser(parser: Any, lookup: Callable[[str], type]) -> Any:
    """A parser instance from a registered name, a class or an instance (None stays None)."""
    if isinstance(parser, str):
        parser = lookup(parser)
    return parser() if isinstance(parser, type) else parser


class Middleware:
    """Serves every registered adapter's routes from one aiohttp app.

    The server, its routes and the session API are here; each turn runs through the
    :class:`~agentrl.serve.turns.TurnPipeline` in :attr:`turns`.
    """

    def __init__(
        self,
        *,
        engine: Engine,
        tokenizer: PreTrainedTokenizerBase,
        tool_parser: ToolCallParser | type[ToolCallParser] | str | None = None,
        reasoning_parser: ReasoningParser | type[ReasoningParser] | str | None = None,
        trajectory: TrajectoryManager | None = None,
        adapters: Iterable[Adapter | str] | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        model_name: str = "agentrl-policy",
        timings_kept: int = 100_000,
        prompt_mode: str | PromptBuilder = "splice",
        render_workers: int | None = None,
        max_engine_aborts: int = DEFAULT_MAX_ENGINE_ABORTS,
    ) -> None:
        check_chat_template_support(tokenizer)
        stop_ids = frozenset(getattr(tokenizer, "all_special_ids", ()) or ())
        if isinstance(prompt_mode, str):
            prompt_mode = prompt_builder(prompt_mode, tokenizer, chat_template_kwargs, stop_ids)
        #: What every turn uses (the properties below read it).
        self.turns = TurnPipeline(
            engine=engine,
            prompts=prompt_mode,
            tokenizer=tokenizer,
            trajectory=trajectory if trajectory is not None else TrajectoryManager(),
            tool_parser=_resolve_parser(tool_parser, plugins.get_tool_parser),
            reasoning_parser=_resolve_parser(reasoning_parser, plugins.get_reasoning_parser),
            timings=collections.deque(maxlen=timings_kept),
            stop_ids=stop_ids,
            offloader=Offloader(render_workers),
            max_engine_aborts=max_engine_aborts,
        )
        self.max_body_bytes = int(max_body_bytes)
        self.model_name = model_name
        if adapters is None:
            adapters = plugins.available("adapter")
        self.adapters: list[Adapter] = [
            plugins.get_adapter(a)() if isinstance(a, str) else a for a in adapters
        ]
        self._sessions = SessionTable()
        self._runner: web.AppRunner | None = None
        self.url: str | None = None
        self.unix_path: str | None = None
        self.app = self._build_app()

    @property
    def engine(self) -> Engine:
        """The inference engine every turn calls (the caller's to close)."""
        return self.turns.engine

    @property
    def trajectory(self) -> TrajectoryManager:
        """Where every recorded turn goes; samples come out of it at finish."""
        return self.turns.trajectory

    @property
    def prompt_mode(self) -> str:
        """``splice``: extend each chain's exact ids; ``render``: render every prompt in full."""
        return self.turns.prompts.mode

    @property
    def splice_stats(self) -> collections.Counter[str]:
        """The recorded turns' prompts: ``"spliced"`` and each fallback reason, counted."""
        return self.turns.prompts.stats

    @property
    def timings(self) -> collections.deque[TurnTiming]:
        """The latest recorded turns' timings (monitoring, benchmarks)."""
        return self.turns.timings

    # -- server ------------------------------------------------------------------------

    def _build_app(self) -> web.Application:
        app = web.Application(
            client_max_size=self.max_body_bytes,
            middlewares=[probes.json_route_errors(self.adapters)],
            handler_args={"logger": probes.server_logger(), **SERVER_ARGS},
        )
        seen: dict[tuple[str, str], str] = {}
        for adapter in self.adapters:
            for method, path, kind in adapter.routes:
                if (method, path) in seen:
                    raise ValueError(
                        f"adapters {seen[(method, path)]!r} and {adapter.name!r} both serve "
                        f"{method} {path}; pass adapters=[...] to choose one"
                    )
                seen[(method, path)] = adapter.name
                app.router.add_route(
                    method, path, self._handler(adapter, kind), expect_handler=self._expect(adapter)
                )
        for path in ("/", "/api/hello"):
            app.router.add_get(path, probes.alive)
        app.router.add_get("/healthz", probes.health_handler(lambda: self.engine))
        app.router.add_get("/v1/models", probes.models_handler(self.model_name))
        return app

    async def start(
        self, host: str | None = "127.0.0.1", port: int = 0, unix_path: str | None = None
    ) -> str:
        """Listen on TCP (``host``/``port``; ``host=None`` skips it) and/or a unix socket.

        A port already in use (or any other bind failure) raises the ``OSError``, with
        nothing left listening.
        """
        if self._runner is not None:
            raise RuntimeError("the middleware is already started; call close() first")
        if host is None and unix_path is None:
            raise ValueError("start() needs a host, a unix_path or both")
        runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None)
        await runner.setup()
        try:
            if host is not None:
                site = web.TCPSite(runner, host, port)
                await site.start()
                bound = site._server.sockets[0].getsockname()  # type: ignore[union-attr]
                shown = f"[{host}]" if ":" in host else host
                self.url = f"http://{shown}:{bound[1]}"
            if unix_path is not None:
                await web.UnixSite(runner, unix_path).start()
                self.unix_path = unix_path
        except BaseException:
            await runner.cleanup()
            self.url = None
            raise
        self._runner = runner
        logger.info("middleware listening on %s", self.url or self.unix_path)
        return self.url or f"unix:{unix_path}"

    async def close(self) -> None:
        """Drop every session and stop the server (the engine is the caller's to close)."""
        for sid in list(self._sessions):
            await self.drop_session(sid)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self.turns.offloader.close()

    async def __aenter__(self) -> Middleware:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- sessions ----------------------------------------------------------------------

    def open_session(
        self,
        sid: str,
        *,
        sampling_defaults: Mapping[str, Any] | None = None,
        max_context_tokens: int = 0,
        max_turns: int | None = None,
        sampling_policy: str = "trainer",
    ) -> str:
        """Open session ``sid``; return the token its client sends as API key."""
        if sampling_policy not in SAMPLING_POLICIES:
            raise ValueError(
                f"sampling_policy: expected one of {SAMPLING_POLICIES}, got {sampling_policy!r}"
            )
        if max_turns is not None and max_turns < 0:
            raise ValueError(f"max_turns: expected None or >= 0, got {max_turns}")
        token = new_token()
        session = Session(
            sid=sid,
            token=token,
            sampling_defaults=dict(sampling_defaults or {}),
            max_context_tokens=int(max_context_tokens or 0),
            max_turns=max_turns,
            sampling_policy=sampling_policy,
        )
        self._sessions.add(session)
        return token

    def session(self, sid: str) -> Session:
        """The open session ``sid`` (KeyError naming it otherwise)."""
        return self._sessions.get(sid)

    async def settle(self, sid: str) -> Session:
        """The open session ``sid`` with everything its finished requests recorded (here at
        once; a sharded middleware's mirror asks its worker)."""
        return self._sessions.get(sid)

    def body_limit(self, sid: str) -> int:
        """The largest request body session ``sid`` may send, in bytes (its routes alike)."""
        return body_cap(self._sessions.get(sid).max_context_tokens, self.max_body_bytes)

    async def finish_session(
        self,
        sid: str,
        *,
        reward: float,
        metadata: Mapping[str, Any] | None = None,
        wait_timeout: float = 30.0,
        max_sample_tokens: int | None = None,
    ) -> list[TrainingSample]:
        """Close ``sid`` (waiting for an in-flight turn) and return its training samples.

        Samples are cut to ``max_sample_tokens`` (default: the session's context budget;
        0 keeps them whole).
        """
        session = self._sessions.close(sid)
        if session is None:
            return []
        try:
            await asyncio.wait_for(session.lock.acquire(), wait_timeout)
            session.lock.release()
        except asyncio.TimeoutError:
            logger.warning(
                "session %s: in-flight turn still running after %.0fs; cancelling",
                sid,
                wait_timeout,
            )
            await self._cancel_inflight(session)
        if max_sample_tokens is None:
            max_sample_tokens = session.max_context_tokens
        return self.trajectory.get_trajectory(
            sid, reward=reward, metadata=metadata, max_sample_tokens=max_sample_tokens
        )

    async def drop_session(self, sid: str) -> None:
        """Close ``sid``, cancel its in-flight turn and forget its trajectory (idempotent)."""
        session = self._sessions.close(sid)
        if session is not None:
            await self._cancel_inflight(session)
        self.trajectory.drop_session(sid)

    async def _cancel_inflight(self, session: Session) -> None:
        tasks = [t for t in session.inflight if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- handlers ----------------------------------------------------------------------

    def _handler(self, adapter: Adapter, kind: str):
        routes = {"turn": self._turn, "count": self._count}
        if kind not in routes:
            raise ValueError(
                f"adapter {adapter.name!r}: route kind must be one of {sorted(routes)}, "
                f"got {kind!r}; fix its routes"
            )
        serve = routes[kind]

        async def handle(request: web.Request) -> web.StreamResponse:
            try:
                return await serve(adapter, request)
            except ProtocolError as error:
                if error.status >= 500:
                    logger.warning(
                        "%s %s -> %d: %s", request.method, request.path, error.status, error.message
                    )
                return error_reply(adapter, error)
            except asyncio.CancelledError:
                raise
            except ConnectionError:
                # The client went away mid-reply (the turn logged it); nothing can reach it.
                return web.Response(status=499)
            except Exception:
                logger.exception("%s %s failed", request.method, request.path)
                return error_reply(
                    adapter,
                    ProtocolError(500, "internal error in the agentrl middleware; see its log"),
                )

        return handle

    def _expect(self, adapter: Adapter):
        """``Expect: 100-continue``: check the headers, authenticate and check the declared
        size before the client is told to send its body."""

        async def expect(request: web.Request) -> web.StreamResponse | None:
            if request.version != HttpVersion11:
                return None
            if request.headers.get(hdrs.EXPECT, "").lower() != "100-continue":
                return error_reply(adapter, ProtocolError(417, "only 100-continue is expected"))
            try:
                problem = header_problem(request)
                if problem is not None:
                    raise problem
                session = self._sessions.authenticate(request.headers)
                cap = body_cap(session.max_context_tokens, self.max_body_bytes)
                if (request.content_length or 0) > cap:
                    await read_body(request, cap)  # raises the 413 without reading
            except ProtocolError as error:
                return probes.refused_unread(request, error_reply(adapter, error))
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            request.writer.output_size = 0
            return None

        return expect

    async def _read_chat(
        self, adapter: Adapter, request: web.Request, session: Session
    ) -> ChatRequest:
        """The body, read up to the session's cap, then decoded, checked and translated in
        the render pool."""
        raw = await read_body(request, body_cap(session.max_context_tokens, self.max_body_bytes))
        headers = request.headers

        def translate() -> ChatRequest:
            return adapter.parse_request(decode_json(raw), headers)

        return await self.turns.offloader.run(session, translate, body_bytes=len(raw))

    async def _count(self, adapter: Adapter, request: web.Request) -> web.StreamResponse:
        session = self._sessions.authenticate(request.headers)
        allowed = count_tokens_allowance(session.turns_started)
        session.count_calls += 1
        if session.count_calls > allowed:
            raise ProtocolError(
                429,
                f"session {session.sid!r} made more than {allowed} count_tokens calls: a "
                "session may make 32, and 4 more per turn it starts",
            )
        chat = await self._read_chat(adapter, request, session)
        size = request.content_length
        count = self.turns.prompt_length
        answer = await self.turns.offloader.run(session, count, session, chat, body_bytes=size)
        return json_reply(adapter.count_reply(answer))

    async def _turn(self, adapter: Adapter, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        session = self._sessions.authenticate(request.headers)
        # Held in a list and popped into the turn: no local keeps the request's messages
        # alive through the engine call once the turn has let them go.
        chat = [await self._read_chat(adapter, request, session)]
        task = asyncio.current_task()
        async with session.lock:
            if session.closed:
                raise ProtocolError(403, f"session {session.sid!r} was closed while waiting")
            if session.max_turns is not None and session.turns_started >= session.max_turns:
                raise ProtocolError(
                    429,
                    f"session {session.sid!r} reached its turn cap of {session.max_turns} "
                    "(open_session(max_turns=...)); the run is over",
                )
            turn_index = session.next_index
            session.next_index += 1
            session.turns_started += 1
            recorded = session.turns_recorded
            if task is not None:
                session.inflight.add(task)
            try:
                return await self.turns.run(
                    adapter, request, session, chat.pop(), index=turn_index, started=started
                )
            except BaseException as exc:
                if session.turns_recorded == recorded and not _infra_failure(exc):
                    session.turns_started -= 1  # the client's doing: roll the turn back
                raise
            finally:
                session.inflight.discard(task)


def _infra_failure(exc: BaseException) -> bool:
    """Whether a turn that raised ``exc`` failed in the engine or the middleware (it stays
    started and unrecorded) rather than by the client's request or its going away."""
    if isinstance(exc, ProtocolError):
        return exc.status >= 500
    return not isinstance(exc, (asyncio.CancelledError, ConnectionError))
