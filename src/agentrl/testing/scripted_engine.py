"""A scripted SGLang server: the test double for the ``sglang`` engine (SGLang needs a GPU).

It is a real aiohttp server on 127.0.0.1 speaking SGLang's HTTP protocol —
``POST /generate`` (``input_ids``, ``sampling_params``, ``return_logprob``, ``rid``;
answering ``text``, ``output_ids`` and ``meta_info`` with ``output_token_logprobs`` as
``[logprob, token_id, null]`` and ``finish_reason.type``), ``POST /abort_request``
(``{"rid"}`` or ``{"abort_all": true}``), ``GET /health``, ``GET /health_generate`` and
``GET /get_model_info`` — so the client under test runs its real HTTP code. Instead of sampling, it replays queued
replies, with deterministic log-probs, and records every request.

Public API::

    ScriptedReply(text=None, ids=None, finish_reason="stop", logprobs=None, delay=0.0,
                  status=200, error="", eos=None)
    engine = ScriptedEngine(tokenizer=None, *, eos_token_id=None, responder=None,
                            host="127.0.0.1", port=0, delay_from_arrival=False)
    url = await engine.start(); await engine.close(); async with engine: ...
    engine.url -> str
    engine.queue(text=None, *, ids=None, finish_reason="stop", logprobs=None, delay=0.0,
                 eos=None, session=None) -> ScriptedReply
    engine.queue_reply(reply: ScriptedReply, *, session=None) -> ScriptedReply
    engine.fail_next(status=500, error="scripted failure", *, session=None) -> ScriptedReply
    engine.health_status = 200                    # what /health and /health_generate answer
    engine.requests -> list[RecordedRequest]      # every request, in arrival order
    engine.generate_requests / engine.abort_requests -> list[RecordedRequest]
    engine.served -> list[ServedGeneration]       # what each /generate call answered
    engine.pending(session=None) -> int           # replies still queued
    await engine.wait_for(predicate, timeout=5.0) # condition wait, no fixed sleeps
    async with scripted_engine(tokenizer=None, **kwargs) as engine: ...
    scripted_logprob(call_index, position, token_id) -> float

Reply selection: a reply queued for ``session`` is served to requests whose
``X-SMG-Routing-Key`` header equals it; otherwise the shared queue is used in order; when
both are empty, ``responder(body, headers)`` is asked (if given), else the request fails
with HTTP 500 naming the problem. Like SGLang, a reply longer than
``sampling_params.max_new_tokens`` is cut there and finishes with ``length``; a reply with
``finish_reason="stop"`` ends with the EOS id (``eos_token_id``, else the tokenizer's),
unless ``eos=False`` or the ids already end with it. A delayed reply that is aborted
answers at once with ``finish_reason`` ``abort`` and the tokens before the abort point
(none). Log-probs are ``scripted_logprob(call_index, position, token_id)`` unless given.
The health routes answer ``health_status`` (200 by default; SGLang answers 503 while it
cannot serve) without touching the reply queues.

With ``delay_from_arrival=True`` a reply's ``delay`` counts from the request's arrival and
holds all of the engine's own work (reading and checking the body, picking and making the
answer), so a reply with ``delay=D`` answers exactly ``D`` after arrival: a known engine
time a benchmark can subtract from its client's latency. ``engine.overruns`` counts the
replies whose own work took longer than their delay.

With ``count_ids=True`` (for a load generator sharing cores with the middleware it
measures) plain-digit ``input_ids`` are checked and counted on the raw bytes, not parsed
into 131k Python ints (~15 ms a 128k prompt): the recorded body holds ``input_ids: []``,
``served`` no input ids, ``prompt_tokens`` the count. Other bodies are parsed whole.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import attrs
from aiohttp import web

from agentrl import jsonio
from agentrl.testing._sglang_wire import all_ints, counted_ids, error_response, generate_reply

__all__ = [
    "RecordedRequest",
    "ScriptedEngine",
    "ScriptedReply",
    "ServedGeneration",
    "scripted_engine",
    "scripted_logprob",
]

logger = logging.getLogger(__name__)


#: How early a delay timed from arrival stops sleeping and yields until its deadline.
TIMER_SLACK = 0.002


def scripted_logprob(call_index: int, position: int, token_id: int) -> float:
    """The deterministic log-prob the scripted engine reports (in ``[-0.97, -0.01]``)."""
    return -(((call_index * 31 + position * 7 + token_id) % 97) + 1) / 100.0


@attrs.frozen(kw_only=True)
class ScriptedReply:
    """One queued answer: text or ids, how it finishes, and how it misbehaves."""

    text: str | None = None
    ids: tuple[int, ...] | None = attrs.field(
        default=None, converter=lambda v: None if v is None else tuple(v)
    )
    finish_reason: str = "stop"
    logprobs: tuple[float, ...] | None = attrs.field(
        default=None, converter=lambda v: None if v is None else tuple(v)
    )
    delay: float = 0.0
    status: int = 200
    error: str = ""
    eos: bool | None = None

    def __attrs_post_init__(self) -> None:
        if self.status == 200 and (self.text is None) == (self.ids is None):
            raise ValueError("ScriptedReply: give exactly one of text= or ids=")
        if self.finish_reason not in ("stop", "length", "abort"):
            raise ValueError(
                f"ScriptedReply.finish_reason: expected stop, length or abort, "
                f"got {self.finish_reason!r}"
            )


@attrs.frozen(kw_only=True)
class RecordedRequest:
    """One HTTP request the scripted engine received."""

    path: str
    body: Any
    headers: dict[str, str]
    received_at: float


@attrs.frozen(kw_only=True)
class ServedGeneration:
    """What one ``/generate`` call answered (for asserting trained tokens)."""

    rid: str | None
    routing_key: str | None
    input_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str
    status: int = 200


class ScriptedEngine:
    """An SGLang-compatible HTTP server that replays queued outputs."""

    def __init__(
        self,
        tokenizer: Any = None,
        *,
        eos_token_id: int | None = None,
        responder: Callable[[Mapping[str, Any], Mapping[str, str]], ScriptedReply | None]
        | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        delay_from_arrival: bool = False,
        count_ids: bool = False,
    ) -> None:
        self.tokenizer = tokenizer
        self.delay_from_arrival = delay_from_arrival
        self.count_ids = count_ids
        self.overruns = 0
        if eos_token_id is None and tokenizer is not None:
            eos_token_id = getattr(tokenizer, "eos_token_id", None)
        self.eos_token_id = eos_token_id
        self.responder = responder
        self.health_status = 200
        self.host, self.port = host, port
        self.requests: list[RecordedRequest] = []
        self.served: list[ServedGeneration] = []
        self._shared: collections.deque[ScriptedReply] = collections.deque()
        self._by_session: dict[str, collections.deque[ScriptedReply]] = {}
        self._aborted: set[str] = set()
        self._abort_events: dict[str, asyncio.Event] = {}
        self._calls = itertools.count()
        self._changed: asyncio.Condition | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""

    # -- lifecycle -----------------------------------------------------------
    async def start(self) -> str:
        """Start serving; returns the base URL (``http://127.0.0.1:PORT``)."""
        if self._runner is not None:
            return self.url
        app = web.Application(client_max_size=1024**3)
        app.router.add_post("/generate", self._generate)
        app.router.add_post("/abort_request", self._abort)
        app.router.add_get("/health", self._health)
        app.router.add_get("/health_generate", self._health)
        app.router.add_get("/get_model_info", self._model_info)
        self._changed = asyncio.Condition()
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://{self.host}:{port}"
        return self.url

    async def close(self) -> None:
        """Stop serving (idempotent)."""
        for event in self._abort_events.values():
            event.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> ScriptedEngine:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- scripting -----------------------------------------------------------
    def queue_reply(self, reply: ScriptedReply, *, session: str | None = None) -> ScriptedReply:
        """Queue a reply (for one routing key, or for whoever asks next)."""
        if session is None:
            self._shared.append(reply)
        else:
            self._by_session.setdefault(session, collections.deque()).append(reply)
        return reply

    def queue(
        self,
        text: str | None = None,
        *,
        ids: Sequence[int] | None = None,
        finish_reason: str = "stop",
        logprobs: Sequence[float] | None = None,
        delay: float = 0.0,
        eos: bool | None = None,
        session: str | None = None,
    ) -> ScriptedReply:
        """Queue an output given as text (tokenized with the tokenizer) or as ids."""
        reply = ScriptedReply(
            text=text,
            ids=ids,
            finish_reason=finish_reason,
            logprobs=logprobs,
            delay=delay,
            eos=eos,
        )
        if text is not None and self.tokenizer is None:
            raise ValueError("ScriptedEngine.queue(text=...) needs a tokenizer; pass ids= instead")
        return self.queue_reply(reply, session=session)

    def fail_next(
        self, status: int = 500, error: str = "scripted failure", *, session: str | None = None
    ) -> ScriptedReply:
        """Make the next ``/generate`` answer an HTTP error."""
        return self.queue_reply(ScriptedReply(status=status, error=error), session=session)

    def pending(self, session: str | None = None) -> int:
        """Replies still queued (shared queue, or one session's)."""
        if session is None:
            return len(self._shared)
        return len(self._by_session.get(session, ()))

    @property
    def generate_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path == "/generate"]

    @property
    def abort_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path == "/abort_request"]

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        """Wait until ``predicate()`` holds, re-checking whenever a request arrives."""
        if self._changed is None:
            raise RuntimeError("ScriptedEngine.wait_for: call start() first")
        async with asyncio.timeout(timeout) if hasattr(asyncio, "timeout") else _timeout(timeout):
            async with self._changed:
                await self._changed.wait_for(predicate)

    # -- HTTP handlers ---------------------------------------------------------
    async def _record(self, request: web.Request, body: Any) -> None:
        self.requests.append(
            RecordedRequest(
                path=request.path,
                body=body,
                headers=dict(request.headers),
                received_at=time.monotonic(),
            )
        )
        await self._notify()

    async def _notify(self) -> None:
        if self._changed is not None:
            async with self._changed:
                self._changed.notify_all()

    def _next_reply(self, body: Mapping[str, Any], headers: Mapping[str, str]) -> ScriptedReply:
        key = headers.get("X-SMG-Routing-Key")
        own = self._by_session.get(key) if key is not None else None
        if own:
            return own.popleft()
        if self._shared:
            return self._shared.popleft()
        if self.responder is not None:
            reply = self.responder(body, headers)
            if reply is not None:
                return reply
        return ScriptedReply(
            status=500,
            error=(
                "scripted engine: no reply queued for this /generate call "
                f"(routing key {key!r}); queue one with ScriptedEngine.queue()"
            ),
        )

    async def _generate(self, request: web.Request) -> web.Response:
        arrived = time.perf_counter()
        raw = await request.read()
        counted = counted_ids(raw) if self.count_ids else None
        try:
            body = jsonio.loads(raw) if counted is None else counted[0]
        except ValueError:
            await self._record(request, None)
            return error_response(400, "request body is not valid JSON")
        await self._record(request, body)
        if not isinstance(body, dict):
            return error_response(400, "request body must be a JSON object")
        input_ids = body.get("input_ids")
        if not isinstance(input_ids, list) or not all_ints(input_ids):
            return error_response(400, "input_ids must be a list of integers")
        prompt_tokens = len(input_ids) if counted is None else counted[1]
        sampling = body.get("sampling_params") or {}
        if not isinstance(sampling, dict):
            return error_response(400, "sampling_params must be an object")
        rid = body.get("rid")
        call_index = next(self._calls)
        reply = self._next_reply(body, request.headers)
        key = request.headers.get("X-SMG-Routing-Key")

        aborted = rid is not None and rid in self._aborted
        # Timed from arrival, every part of the answer (the output ids, their text, the
        # JSON) is made before the wait, so the delay holds all of the engine's own work.
        ready = None
        if self.delay_from_arrival and reply.status == 200 and not aborted:
            ready = self._answer(body, prompt_tokens, reply, call_index, key, aborted=False)
        delay = reply.delay
        if self.delay_from_arrival and delay > 0:
            delay -= time.perf_counter() - arrived
            if delay <= 0:
                self.overruns += 1
        if delay > 0 and not aborted:
            event = asyncio.Event()
            if rid is not None:
                self._abort_events[rid] = event
            deadline = time.perf_counter() + delay
            # asyncio's timers wake ~1.3 ms late (epoll's millisecond ticks); timed from
            # arrival, the last stretch is waited out by yielding, so the delay is exact.
            slack = TIMER_SLACK if self.delay_from_arrival else 0.0
            try:
                await asyncio.wait_for(event.wait(), timeout=max(0.0, delay - slack))
                aborted = True
            except asyncio.TimeoutError:
                while slack and time.perf_counter() < deadline and not event.is_set():  # noqa: ASYNC110
                    await asyncio.sleep(0)
                aborted = event.is_set()
            finally:
                if rid is not None:
                    self._abort_events.pop(rid, None)
        if ready is None or aborted:
            ready = self._answer(body, prompt_tokens, reply, call_index, key, aborted=aborted)
        served, response = ready
        self.served.append(served)
        await self._notify()
        return response

    def _answer(
        self,
        body: dict[str, Any],
        prompt_tokens: int,
        reply: ScriptedReply,
        call_index: int,
        key: str | None,
        *,
        aborted: bool,
    ) -> tuple[ServedGeneration, web.Response]:
        """What was served and the reply to send, for one ``/generate`` call."""
        rid, input_ids = body.get("rid"), body["input_ids"]
        sampling = body.get("sampling_params") or {}
        if reply.status != 200:
            served = ServedGeneration(
                rid=rid,
                routing_key=key,
                input_ids=tuple(input_ids),
                output_ids=(),
                logprobs=(),
                finish_reason="error",
                status=reply.status,
            )
            return served, error_response(reply.status, reply.error)
        ids, logprobs, finish = self._materialise(reply, call_index, sampling)
        if aborted:
            ids, logprobs, finish = [], [], "abort"
        served = ServedGeneration(
            rid=rid,
            routing_key=key,
            input_ids=tuple(input_ids),
            output_ids=tuple(ids),
            logprobs=tuple(logprobs),
            finish_reason=finish,
        )
        text = ""
        if self.tokenizer is not None and ids:
            text = self.tokenizer.decode(
                ids, skip_special_tokens=bool(sampling.get("skip_special_tokens", True))
            )
        reply_body = generate_reply(
            rid or f"scripted-{call_index}",
            ids,
            logprobs,
            finish,
            text=text,
            prompt_tokens=prompt_tokens,
            eos_token_id=self.eos_token_id,
            with_logprobs=bool(body.get("return_logprob")),
        )
        response = web.json_response(reply_body)
        return served, response

    def _materialise(
        self, reply: ScriptedReply, call_index: int, sampling: Mapping[str, Any]
    ) -> tuple[list[int], list[float], str]:
        if reply.ids is not None:
            ids = list(reply.ids)
        else:
            ids = list(self.tokenizer(reply.text, add_special_tokens=False)["input_ids"])
        finish = reply.finish_reason
        add_eos = reply.eos if reply.eos is not None else finish == "stop"
        if add_eos and self.eos_token_id is not None and (not ids or ids[-1] != self.eos_token_id):
            ids.append(self.eos_token_id)
        if reply.logprobs is not None:
            if len(reply.logprobs) != len(ids):
                raise ValueError(
                    f"ScriptedReply.logprobs: expected {len(ids)} values (one per output id, "
                    f"EOS included), got {len(reply.logprobs)}"
                )
            logprobs = list(reply.logprobs)
        else:
            logprobs = [scripted_logprob(call_index, i, t) for i, t in enumerate(ids)]
        limit = sampling.get("max_new_tokens")
        if isinstance(limit, int) and 0 <= limit < len(ids):
            ids, logprobs, finish = ids[:limit], logprobs[:limit], "length"
        return ids, logprobs, finish

    async def _abort(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            body = None
        await self._record(request, body)
        if isinstance(body, dict) and body.get("abort_all"):
            for event in self._abort_events.values():
                event.set()
        elif isinstance(body, dict) and isinstance(body.get("rid"), str):
            rid = body["rid"]
            self._aborted.add(rid)
            event = self._abort_events.get(rid)
            if event is not None:
                event.set()
        return web.Response(status=200)

    async def _health(self, request: web.Request) -> web.Response:
        await self._record(request, None)
        return web.Response(status=self.health_status)

    async def _model_info(self, request: web.Request) -> web.Response:
        name = getattr(self.tokenizer, "name_or_path", "") or "scripted"
        return web.json_response(
            {"model_path": name, "tokenizer_path": name, "is_generation": True}
        )


@contextlib.asynccontextmanager
async def _timeout(seconds: float) -> AsyncIterator[None]:
    # asyncio.timeout arrived in 3.11; this is the 3.10 fallback.
    task = asyncio.current_task()
    assert task is not None
    handle = asyncio.get_running_loop().call_later(seconds, task.cancel)
    try:
        yield
    except asyncio.CancelledError as exc:
        raise TimeoutError(f"condition not met within {seconds} s") from exc
    finally:
        handle.cancel()


@contextlib.asynccontextmanager
async def scripted_engine(tokenizer: Any = None, **kwargs: Any) -> AsyncIterator[ScriptedEngine]:
    """Start a ``ScriptedEngine`` for the duration of the block."""
    engine = ScriptedEngine(tokenizer, **kwargs)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.close()
