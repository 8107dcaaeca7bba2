"""The ``sglang`` engine: a client for SGLang's (or its router's) ``POST /generate``.

Public API::

    engine = SGLangEngine.from_options(options, url=url)   # how every command builds it
    engine = SGLangEngine(url, *, sock_read_timeout=900.0, total_timeout=None,
                          abort_timeout=5.0, default_sampling=None, headers=None,
                          max_connections=0, health_path="/health", health_timeout=5.0,
                          ids_text_bytes=64 MiB)
    await engine.generate(input_ids, sampling_params, *, rid=None, routing_key=None) -> Generation
    await engine.health()        # GET /health (or /health_generate); EngineError unless 200
    await engine.abort(rid)      # POST /abort_request {"rid": rid}; never raises
    await engine.aclose()
    DEFAULT_SAMPLING             # what every request starts from (caller's params win)
    generate_payload(rid, input_ids, sampling_params) -> bytes   # the /generate body

Each call sends ``{"rid", "input_ids", "sampling_params", "return_logprob": true}`` and, for
a ``routing_key``, the ``X-SMG-Routing-Key`` header (the SGLang router's session
affinity). The reply's ``meta_info.output_token_logprobs`` entries are
``[logprob, token_id, …]``; ``meta_info.finish_reason.type`` becomes
``Generation.finish_reason`` (``stop`` when absent). ``Generation.meta`` carries ``rid``,
``prompt_tokens``, ``cached_tokens``, ``weight_version``, ``matched_stop`` and
``latency_s`` where known.

The ``input_ids`` text of each ``routing_key``'s last call is kept (up to
``ids_text_bytes`` in all, least recently used dropped): a spliced prompt extends the
previous one, so only its new ids are written (:class:`agentrl.jsonio.IdsText`; the text
is always exactly what :func:`~agentrl.jsonio.encode_ids` writes).

Cancelling ``generate`` (the client went away), a timeout or a connection error sends
``/abort_request`` for its ``rid`` so the server stops decoding. HTTP errors, connection
errors, timeouts and malformed replies raise ``EngineError`` with the status and a body
excerpt. One pooled ``aiohttp.ClientSession`` serves every call.

``health()`` asks ``health_path``: SGLang's (and its router's) ``GET /health`` answers 200
once the server is up; ``/health_generate`` also runs a one-token generation, so it proves
the model serves but waits behind a busy server. An error, a timeout (``health_timeout``)
or any status but 200 raises ``EngineError`` with the reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import aiohttp

from agentrl import jsonio
from agentrl.engines.base import (
    TOKEN_EXACT_SAMPLING,
    Engine,
    EngineError,
    EngineLocation,
    Generation,
    body_excerpt,
)

__all__ = ["DEFAULT_SAMPLING", "SGLangEngine", "generate_payload"]

logger = logging.getLogger(__name__)

#: Token-in-token-out needs the raw tokens: no special-token skipping, no stop trimming.
DEFAULT_SAMPLING: Mapping[str, Any] = TOKEN_EXACT_SAMPLING

_JSON_HEADERS = {"Content-Type": "application/json"}


def generate_payload(
    rid: str, input_ids: Sequence[int], sampling_params: Mapping[str, Any]
) -> bytes:
    """The ``/generate`` body: ``{"rid", "input_ids", "sampling_params", "return_logprob"}``.

    The ids are encoded by :func:`agentrl.jsonio.encode_ids` (an ``array('I')`` without a
    Python ``int`` per id) and spliced in as bytes, so the ~130k ids of a 128k prompt cost
    well under a millisecond instead of a ``json.dumps`` of a list (~7 ms).
    """
    return _payload(rid, jsonio.encode_ids(input_ids), sampling_params)


def _payload(rid: str, ids_text: bytes, sampling_params: Mapping[str, Any]) -> bytes:
    return b"".join(
        (
            b'{"rid":',
            jsonio.dumps(rid),
            b',"input_ids":',
            ids_text,
            b',"sampling_params":',
            jsonio.dumps(dict(sampling_params)),
            b',"return_logprob":true}',
        )
    )


class SGLangEngine(Engine):
    """Token-level generation over SGLang's native HTTP API."""

    name: ClassVar[str] = "sglang"
    location: ClassVar[EngineLocation] = "url"
    location_hint: ClassVar[str] = "the SGLang router's URL, http://host:port"

    def __init__(
        self,
        url: str,
        *,
        sock_read_timeout: float | None = 900.0,
        total_timeout: float | None = None,
        abort_timeout: float = 5.0,
        default_sampling: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        max_connections: int = 0,
        health_path: str = "/health",
        health_timeout: float = 5.0,
        ids_text_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(
                f"SGLangEngine url: expected http(s)://host:port of an SGLang server or "
                f"router, got {url!r}"
            )
        self.url = url.rstrip("/")
        self.timeout = aiohttp.ClientTimeout(total=total_timeout, sock_read=sock_read_timeout)
        self.abort_timeout = abort_timeout
        self.default_sampling = {**DEFAULT_SAMPLING, **(default_sampling or {})}
        self.headers = dict(headers or {})
        self.max_connections = max_connections
        if not health_path.startswith("/"):
            raise ValueError(
                f"SGLangEngine health_path: expected a path such as '/health', got {health_path!r}"
            )
        self.health_path = health_path
        self.health_timeout = health_timeout
        self._session: aiohttp.ClientSession | None = None
        #: Each routing key's last ``input_ids`` text: a spliced prompt extends the previous
        #: one, so only its new ids are written (:class:`agentrl.jsonio.IdsText`).
        self.ids_text = jsonio.IdsText(ids_text_bytes)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self.max_connections)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=self.timeout, headers=self.headers
            )
        return self._session

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: Mapping[str, Any],
        *,
        rid: str | None = None,
        routing_key: str | None = None,
    ) -> Generation:
        """POST /generate and return exactly what was sampled."""
        rid = rid or uuid.uuid4().hex
        ids_text = self.ids_text.encode(routing_key or None, input_ids)
        payload = _payload(rid, ids_text, {**self.default_sampling, **sampling_params})
        headers = _JSON_HEADERS
        if routing_key:
            headers = {**_JSON_HEADERS, "X-SMG-Routing-Key": routing_key}
        started = time.monotonic()
        try:
            async with self._client().post(
                f"{self.url}/generate", data=payload, headers=headers
            ) as response:
                status = response.status
                body = await response.read()
        except asyncio.CancelledError:
            await self._abort_quietly(rid)
            raise
        except asyncio.TimeoutError as exc:
            await self._abort_quietly(rid)
            raise EngineError(
                f"SGLang /generate at {self.url} timed out (rid {rid}); the request was "
                "aborted. Raise sock_read_timeout/total_timeout or lower max_new_tokens"
            ) from exc
        except aiohttp.ClientError as exc:
            await self._abort_quietly(rid)
            raise EngineError(
                f"SGLang /generate at {self.url} failed: {type(exc).__name__}: {exc}. "
                "Check that the server or router is running and reachable"
            ) from exc
        if status >= 400:
            raise EngineError(
                f"SGLang /generate at {self.url} returned HTTP {status}: {body_excerpt(body)}",
                status=status,
                body=body_excerpt(body),
            )
        return self._parse(body, status, rid, time.monotonic() - started)

    def _parse(self, body: bytes, status: int, rid: str, latency: float) -> Generation:
        def bad(reason: str) -> EngineError:
            return EngineError(
                f"SGLang /generate at {self.url} sent a reply agentrl cannot read ({reason}): "
                f"{body_excerpt(body)}",
                status=status,
                body=body_excerpt(body),
            )

        try:
            data = jsonio.loads(body)
        except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError
            raise bad("not JSON") from None
        if isinstance(data, list) and len(data) == 1:
            data = data[0]
        meta = data.get("meta_info") if isinstance(data, dict) else None
        if not isinstance(meta, dict):
            raise bad("no meta_info object")
        entries = meta.get("output_token_logprobs")
        if entries is None:
            raise bad("no meta_info.output_token_logprobs; is return_logprob supported?")
        try:
            output_ids = [int(entry[1]) for entry in entries]
            logprobs = [float(entry[0]) if entry[0] is not None else 0.0 for entry in entries]
        except (TypeError, ValueError, IndexError):
            raise bad("output_token_logprobs entries must be [logprob, token_id, …]") from None
        finish = meta.get("finish_reason")
        finish_type = finish.get("type") if isinstance(finish, dict) else finish
        extra: dict[str, Any] = {"rid": rid, "latency_s": latency}
        for key in ("prompt_tokens", "cached_tokens", "completion_tokens", "weight_version"):
            if key in meta:
                extra[key] = meta[key]
        if isinstance(finish, dict) and "matched" in finish:
            extra["matched_stop"] = finish["matched"]
        return Generation(
            output_ids=output_ids,
            logprobs=logprobs,
            finish_reason=str(finish_type or "stop"),
            meta=extra,
        )

    async def health(self) -> None:
        """GET ``health_path``; raise ``EngineError`` unless the server answers 200 in time."""
        where = f"SGLang {self.health_path} at {self.url}"
        timeout = aiohttp.ClientTimeout(total=self.health_timeout)
        try:
            async with self._client().get(
                f"{self.url}{self.health_path}", timeout=timeout
            ) as response:
                status = response.status
                body = await response.text()
        except asyncio.TimeoutError:
            raise EngineError(
                f"{where} did not answer within {self.health_timeout:g}s; the server may still "
                "be loading the model, or be overloaded"
            ) from None
        except aiohttp.ClientError as exc:
            raise EngineError(
                f"{where} is unreachable: {type(exc).__name__}: {exc}. Check that the server or "
                "router is running at that URL"
            ) from None
        if status != 200:
            raise EngineError(
                f"{where} answered HTTP {status}: {body_excerpt(body) or '(empty body)'}; the server "
                "is not ready to serve",
                status=status,
                body=body_excerpt(body),
            )

    async def abort(self, rid: str) -> None:
        """Ask the server to stop ``rid`` (best effort, never raises)."""
        await self._abort_quietly(rid)

    async def _abort_quietly(self, rid: str) -> None:
        session = self._session
        if session is None or session.closed:
            return
        try:
            # Shielded: the caller may itself be cancelled while the abort is in flight.
            await asyncio.shield(self._post_abort(session, rid))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning("SGLang /abort_request for rid %s failed: %r", rid, exc)

    async def _post_abort(self, session: aiohttp.ClientSession, rid: str) -> None:
        timeout = aiohttp.ClientTimeout(total=self.abort_timeout)
        async with session.post(
            f"{self.url}/abort_request", json={"rid": rid}, timeout=timeout
        ) as response:
            if response.status >= 400:
                logger.warning(
                    "SGLang /abort_request for rid %s returned HTTP %s", rid, response.status
                )

    async def aclose(self) -> None:
        """Close the pooled HTTP session."""
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None
