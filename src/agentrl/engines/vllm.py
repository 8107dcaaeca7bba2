"""The ``vllm`` engine: token ids in, sampled ids and log-probs out, over vLLM's HTTP API.

Public API::

    engine = VLLMEngine.from_options(options, url="http://a:8000,http://b:8000")
    engine = VLLMEngine(url, *, route="auto", logprobs_mode="auto", model=None,
                        api_key=None, sock_read_timeout=900.0, total_timeout=None,
                        abort_timeout=5.0, health_timeout=5.0, default_sampling=None,
                        connect_retries=2, max_connections=0)
    await engine.generate(input_ids, sampling_params, *, rid=None, routing_key=None) -> Generation
    await engine.health()        # GET /health of every server; EngineError naming the failing one
    await engine.abort(rid)      # POST /inference/v1/abort_requests with the server's id
    await engine.aclose()
    engine.servers               # one per URL: its route, logprobs mode and model, once probed

``url`` is one server or several (a list, or URLs separated by commas): a request with a
``routing_key`` (the middleware sends the session id) always goes to the same server while
it is up, so each turn's prompt hits the prefix that server cached for the turn before;
without one, to the server with the fewest requests in flight. A connection error (the
server is down or restarting) is retried ``connect_retries`` times with jittered backoff,
on the next server when there are several; the first request's id is aborted first.

Each server is probed once, before its first generation (:mod:`agentrl.engines.vllm_wire`):

- **route**: ``/inference/v1/generate`` (``--enable-scale-out`` or ``--tokens-only``), or
  ``/v1/completions`` with ``return_token_ids`` where that route is missing (404).
  ``route="generate"`` or ``"completions"`` skips the detection.
- **logprobs mode**: one-token probes at temperature 1 and 0.5. A server started with
  ``--logprobs-mode processed_logprobs`` reports the log-probs of the distribution it
  sampled from (after temperature, top-k, top-p), which is what rollouts must record.
  vLLM's default, ``raw_logprobs``, reports the model's log-probs before temperature: they
  equal the sampled distribution's only at temperature 1 with top-p 1 and top-k and min-p
  off, so with any other sampling the request is refused with an ``EngineError`` saying
  how to start the server — unless ``logprobs_mode="raw"`` accepts them knowingly (each
  ``Generation.meta`` then says ``logprobs_mode: raw``). A server reporting logits is
  refused. ``logprobs_mode="processed"`` trusts the server without probing.

``sampling_params`` use SGLang's names as everywhere in agentrl (``max_new_tokens``,
``sampling_seed``, ``no_stop_trim``, ``top_k: -1``…), translated to vLLM's; vLLM's own
names pass through; anything else is an ``EngineError`` naming the key. ``stop`` strings
need a server that loads a tokenizer (not ``--tokens-only``). The output keeps every
sampled id, stop and EOS tokens included. ``Generation.finish_reason`` is vLLM's
(``stop``, ``length``, ``abort``); an aborted request returns the ids sampled before the
abort. ``Generation.meta`` carries ``rid``, ``server``, ``latency_s``, ``prompt_tokens``,
``cached_tokens`` (with ``--enable-prompt-tokens-details``), ``matched_stop`` and the
policy's ``weight_version`` (vLLM's ``weight_versions`` spans too) where reported.

Cancelling ``generate`` (the client went away), a timeout or a connection error aborts
the request on its server. HTTP errors, timeouts and unreadable replies raise
``EngineError`` with the server, the status and a body excerpt.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

import aiohttp
import attrs

from agentrl import jsonio
from agentrl.engines import vllm_wire as wire
from agentrl.engines.base import (
    TOKEN_EXACT_SAMPLING,
    Engine,
    EngineError,
    EngineLocation,
    Generation,
    body_excerpt,
)
from agentrl.retry import RetryPolicy, retry

__all__ = ["LOGPROBS_MODES", "ROUTE_CHOICES", "Server", "VLLMEngine"]

logger = logging.getLogger(__name__)

ROUTE_CHOICES = ("auto", "generate", "completions")
LOGPROBS_MODES = ("auto", "processed", "raw")
_NEUTRAL = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0}


def _split_urls(url: str | Sequence[str]) -> list[str]:
    urls = [u.strip() for u in url.split(",")] if isinstance(url, str) else list(url)
    urls = [u.rstrip("/") for u in urls if u]
    bad = [u for u in urls if not u.startswith(("http://", "https://"))]
    if not urls or bad:
        raise ValueError(
            "VLLMEngine url: expected http(s)://host:port of a vLLM server, or several "
            f"separated by commas; got {url!r}"
        )
    if len(set(urls)) != len(urls):
        raise ValueError(f"VLLMEngine url: a server is listed twice in {url!r}")
    return urls


@attrs.define(kw_only=True, eq=False)
class Server:
    """One vLLM server: its URL and what the probe found (None until probed)."""

    url: str
    route: wire.Route | None = None
    logprobs_mode: Literal["processed", "raw"] | None = None
    model: str | None = None
    inflight: int = 0
    #: ``time.monotonic()`` until which a server that refused connections is passed over.
    down_until: float = 0.0
    probe_lock: asyncio.Lock = attrs.field(factory=asyncio.Lock)


class _Unreachable(Exception):
    """A connection to the server failed before a reply (it is down or restarting)."""

    def __init__(self, server: Server, error: BaseException) -> None:
        super().__init__(f"{server.url}: {type(error).__name__}: {error}")
        self.server = server


class VLLMEngine(Engine):
    """Token-level generation over one or several vLLM servers' HTTP API."""

    name: ClassVar[str] = "vllm"
    location: ClassVar[EngineLocation] = "url"
    location_hint: ClassVar[str] = (
        "a vLLM server's URL, http://host:port, or several, comma-separated"
    )

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        route: str = "auto",
        logprobs_mode: str = "auto",
        model: str | None = None,
        api_key: str | None = None,
        sock_read_timeout: float | None = 900.0,
        total_timeout: float | None = None,
        abort_timeout: float = 5.0,
        health_timeout: float = 5.0,
        default_sampling: Mapping[str, Any] | None = None,
        connect_retries: int = 2,
        max_connections: int = 0,
    ) -> None:
        if route not in ROUTE_CHOICES:
            raise ValueError(f"VLLMEngine route: expected one of {ROUTE_CHOICES}, got {route!r}")
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(
                f"VLLMEngine logprobs_mode: expected one of {LOGPROBS_MODES}, got {logprobs_mode!r}"
            )
        self.servers = [Server(url=u) for u in _split_urls(url)]
        for server in self.servers:
            if route != "auto":
                server.route = route  # type: ignore[assignment]
            if logprobs_mode != "auto":
                server.logprobs_mode = logprobs_mode  # type: ignore[assignment]
            server.model = model
        self.url = ",".join(s.url for s in self.servers)
        self.accept_raw = logprobs_mode == "raw"
        self.timeout = aiohttp.ClientTimeout(total=total_timeout, sock_read=sock_read_timeout)
        self.abort_timeout = abort_timeout
        self.health_timeout = health_timeout
        self.default_sampling = {**TOKEN_EXACT_SAMPLING, **(default_sampling or {})}
        self.retry_policy = RetryPolicy.from_retries(connect_retries, base=0.5, cap=5.0)
        self.max_connections = max_connections
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._session: aiohttp.ClientSession | None = None
        #: In-flight request id -> (server, route): where an abort must go.
        self._inflight: dict[str, tuple[Server, wire.Route]] = {}

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.max_connections),
                timeout=self.timeout,
                headers=self._headers,
            )
        return self._session

    # -- choosing a server -------------------------------------------------------------

    def _pick(self, routing_key: str | None, avoid: set[Server]) -> Server:
        now = time.monotonic()
        candidates = [s for s in self.servers if s not in avoid and s.down_until <= now]
        if not candidates:
            candidates = [s for s in self.servers if s not in avoid] or self.servers
        if routing_key:
            # Rendezvous hashing: a key keeps its server while that server is up.
            return max(candidates, key=lambda s: zlib.crc32(f"{routing_key}|{s.url}".encode()))
        return min(candidates, key=lambda s: s.inflight)

    # -- generate ----------------------------------------------------------------------

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: Mapping[str, Any],
        *,
        rid: str | None = None,
        routing_key: str | None = None,
    ) -> Generation:
        """Sample a continuation of ``input_ids`` on one of the servers."""
        rid = rid or uuid.uuid4().hex
        try:
            sampling = wire.vllm_sampling({**self.default_sampling, **sampling_params})
        except wire.WireError as exc:
            raise EngineError(f"vLLM engine: {exc}") from None
        tried: set[Server] = set()

        async def attempt() -> Generation:
            server = self._pick(routing_key, tried)
            try:
                return await self._generate_on(server, rid, input_ids, sampling)
            except _Unreachable:
                server.down_until = time.monotonic() + 5.0
                tried.add(server)
                if len(tried) == len(self.servers):
                    tried.clear()
                raise

        def on_retry(failed: int, exc: Exception, delay: float) -> None:
            logger.warning("vLLM server %s; retrying rid %s in %.2fs", exc, rid, delay)

        try:
            return await retry(
                attempt, policy=self.retry_policy, retryable=_Unreachable, on_retry=on_retry
            )
        except _Unreachable as exc:
            raise EngineError(
                f"vLLM server {exc}; tried {self.retry_policy.attempts} time(s). Check that the "
                "server is running and reachable"
            ) from None

    async def _generate_on(
        self, server: Server, rid: str, input_ids: Sequence[int], sampling: dict[str, Any]
    ) -> Generation:
        await self._ensure_probed(server)
        route = server.route
        assert route is not None
        self._check_logprobs(server, sampling)
        body = wire.request_body(route, rid, input_ids, sampling, model=server.model)
        started = time.monotonic()
        status, raw = await self._post(server, route, rid, body)
        if status >= 400:
            raise EngineError(
                f"vLLM {wire.ROUTES[route]} at {server.url} returned HTTP {status}: "
                f"{body_excerpt(raw)}",
                status=status,
                body=body_excerpt(raw),
            )
        try:
            reply = wire.parse_reply(route, jsonio.loads(raw))
        except (ValueError, RecursionError) as exc:  # WireError, JSONDecodeError
            raise EngineError(
                f"vLLM {wire.ROUTES[route]} at {server.url} sent a reply agentrl cannot read "
                f"({exc}): {body_excerpt(raw)}",
                status=status,
                body=body_excerpt(raw),
            ) from None
        meta = {
            "rid": rid,
            "server": server.url,
            "latency_s": time.monotonic() - started,
            **reply.meta,
        }
        if server.logprobs_mode == "raw":
            meta["logprobs_mode"] = "raw"
        return Generation(
            output_ids=reply.output_ids,
            logprobs=reply.logprobs,
            finish_reason=reply.finish_reason,
            meta=meta,
        )

    async def _post(
        self, server: Server, route: wire.Route, rid: str, body: bytes
    ) -> tuple[int, bytes]:
        """POST ``body``; a failure aborts ``rid`` on the server before it is raised."""
        url = f"{server.url}{wire.ROUTES[route]}"
        self._inflight[rid] = (server, route)
        server.inflight += 1
        try:
            async with self._client().post(url, data=body) as response:
                return response.status, await response.read()
        except asyncio.CancelledError:
            await self._abort_quietly(rid)
            raise
        except asyncio.TimeoutError as exc:
            await self._abort_quietly(rid)
            raise EngineError(
                f"vLLM {wire.ROUTES[route]} at {server.url} timed out (rid {rid}); the request "
                "was aborted. Raise sock_read_timeout/total_timeout or lower max_new_tokens"
            ) from exc
        except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError) as exc:
            await self._abort_quietly(rid)
            raise _Unreachable(server, exc) from exc
        except aiohttp.ClientError as exc:
            await self._abort_quietly(rid)
            raise EngineError(
                f"vLLM {wire.ROUTES[route]} at {server.url} failed: {type(exc).__name__}: {exc}"
            ) from exc
        finally:
            server.inflight -= 1
            self._inflight.pop(rid, None)

    def _check_logprobs(self, server: Server, sampling: Mapping[str, Any]) -> None:
        if server.logprobs_mode != "raw" or self.accept_raw:
            return
        changed = {
            k: sampling[k] for k, v in _NEUTRAL.items() if k in sampling and sampling[k] != v
        }
        if changed:
            raise EngineError(
                f"the vLLM server at {server.url} reports raw log-probs (its default "
                "--logprobs-mode raw_logprobs): the model's before temperature and top-k/top-p, "
                f"not those of the distribution sampled with {changed}, so rollouts would record "
                "wrong log-probs. Start it with --logprobs-mode processed_logprobs, or pass the "
                "engine option logprobs_mode='raw' to record raw log-probs knowingly"
            )

    # -- probing -----------------------------------------------------------------------

    async def _ensure_probed(self, server: Server) -> None:
        if server.route is not None and server.logprobs_mode is not None and server.model:
            return
        async with server.probe_lock:
            if server.model is None:
                server.model = await self._model_name(server)
            if server.route is None or server.logprobs_mode is None:
                await self._probe(server)

    async def _request(self, server: Server, method: str, path: str, body: bytes | None = None):
        timeout = aiohttp.ClientTimeout(total=max(self.health_timeout, 60.0))
        try:
            async with self._client().request(
                method, f"{server.url}{path}", data=body, timeout=timeout
            ) as response:
                return response.status, await response.read()
        except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError) as exc:
            raise _Unreachable(server, exc) from exc
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise EngineError(
                f"vLLM {path} at {server.url} failed: {type(exc).__name__}: {exc}"
            ) from exc

    async def _model_name(self, server: Server) -> str:
        status, raw = await self._request(server, "GET", "/v1/models")
        try:
            models = jsonio.loads(raw)["data"] if status == 200 else None
            return str(models[0]["id"])
        except (ValueError, KeyError, IndexError, TypeError):
            raise EngineError(
                f"vLLM /v1/models at {server.url} answered HTTP {status} without a model: "
                f"{body_excerpt(raw)}; is this a vLLM server?",
                status=status,
                body=body_excerpt(raw),
            ) from None

    async def _probe(self, server: Server) -> None:
        """Find the server's token route and logprobs mode (see the module docstring)."""
        routes: list[wire.Route] = (
            [server.route] if server.route is not None else ["generate", "completions"]
        )
        for route in routes:
            tops: list[list[float]] = []
            for temperature in (1.0, 0.5):
                body = wire.probe_body(route, temperature, model=server.model)
                status, raw = await self._request(server, "POST", wire.ROUTES[route], body)
                if status == 404 and route == "generate" and len(routes) > 1:
                    break
                if status != 200:
                    raise EngineError(
                        f"vLLM {wire.ROUTES[route]} at {server.url} refused agentrl's probe "
                        f"with HTTP {status}: {body_excerpt(raw)}",
                        status=status,
                        body=body_excerpt(raw),
                    )
                try:
                    tops.append(wire.probe_top(route, jsonio.loads(raw)))
                except (ValueError, RecursionError) as exc:
                    raise EngineError(
                        f"vLLM {wire.ROUTES[route]} at {server.url}: {exc}: {body_excerpt(raw)}"
                    ) from None
            if len(tops) < 2:
                continue
            server.route = route
            if server.logprobs_mode is None:
                mode = wire.judge_logprobs_mode(tops[0], tops[1])
                if mode == "logits":
                    raise EngineError(
                        f"the vLLM server at {server.url} reports logits, not log-probs "
                        "(--logprobs-mode raw_logits or processed_logits); start it with "
                        "--logprobs-mode processed_logprobs"
                    )
                server.logprobs_mode = mode  # type: ignore[assignment]
            logger.info(
                "vLLM server %s: route %s, %s log-probs, model %s",
                server.url,
                wire.ROUTES[route],
                server.logprobs_mode,
                server.model,
            )
            return
        raise EngineError(f"vLLM server at {server.url} serves neither token route")

    # -- health, abort, close ----------------------------------------------------------

    async def health(self) -> None:
        """GET ``/health`` on every server; ``EngineError`` naming the first that is not ready."""
        timeout = aiohttp.ClientTimeout(total=self.health_timeout)
        for server in self.servers:
            where = f"vLLM /health at {server.url}"
            try:
                async with self._client().get(f"{server.url}/health", timeout=timeout) as response:
                    status, body = response.status, await response.text()
            except asyncio.TimeoutError:
                raise EngineError(
                    f"{where} did not answer within {self.health_timeout:g}s; the server may "
                    "still be loading the model, or be overloaded"
                ) from None
            except aiohttp.ClientError as exc:
                raise EngineError(
                    f"{where} is unreachable: {type(exc).__name__}: {exc}. Check that the "
                    "server is running at that URL"
                ) from None
            if status != 200:
                raise EngineError(
                    f"{where} answered HTTP {status}: {body_excerpt(body) or '(empty body)'}",
                    status=status,
                    body=body_excerpt(body),
                )

    async def abort(self, rid: str) -> None:
        """Ask the server running ``rid`` to stop it (best effort, never raises)."""
        await self._abort_quietly(rid)

    async def _abort_quietly(self, rid: str) -> None:
        where = self._inflight.get(rid)
        session = self._session
        if where is None or session is None or session.closed:
            return
        server, route = where
        body = {"request_ids": [wire.server_request_id(route, rid)]}
        try:
            await asyncio.shield(self._post_abort(session, server, body))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning("vLLM abort of rid %s at %s failed: %r", rid, server.url, exc)

    async def _post_abort(
        self, session: aiohttp.ClientSession, server: Server, body: dict[str, Any]
    ) -> None:
        timeout = aiohttp.ClientTimeout(total=self.abort_timeout)
        url = f"{server.url}/inference/v1/abort_requests"
        async with session.post(url, json=body, timeout=timeout) as response:
            if response.status == 404:
                # No abort route (a plain server): closing the connection aborts instead.
                return
            if response.status >= 400:
                logger.warning("vLLM abort at %s returned HTTP %s", server.url, response.status)

    async def aclose(self) -> None:
        """Close the pooled HTTP session."""
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None
