"""The front of a sharded middleware: bytes in, to the session's worker, bytes back.

Every request is routed by its session token (``Authorization: Bearer`` or
``x-api-key``) to the worker that owns the session and forwarded over that worker's unix
socket without its body being parsed: the body streams through as it arrives (its
``Content-Length`` kept, or chunked), the worker's answer streams back as it is written
(SSE included), compressed bodies stay compressed both ways. The only change is the
token: the client holds the parent's token, the worker's own replaces it on the way.
A request without a known token (or with a closed session's) goes to a live worker
without its body, so the 401 / 403 is the middleware's own, in the client's error shape,
and no byte of a body nobody will read is moved. A worker that is gone answers 502 (a JSON
error body Anthropic and OpenAI clients both read), at once. Whenever the worker answers
before the client's body is all read (a refusal), the front ends the client's connection
after the answer rather than reading the rest (``limits.SERVER_ARGS`` for its server). A
refusal's answer can lose the race with the reset of the upload it cut short; when the
worker is still alive, the front then answers the 413 itself.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import hdrs, web

from agentrl.serve.probes import refused_unread

__all__ = ["HOP_BY_HOP", "Route", "front_app", "gone", "too_large"]

logger = logging.getLogger(__name__)

#: Headers that describe one connection, not the request: never forwarded.
HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        hdrs.CONNECTION,
        hdrs.KEEP_ALIVE,
        hdrs.PROXY_AUTHENTICATE,
        hdrs.PROXY_AUTHORIZATION,
        hdrs.TE,
        hdrs.TRAILER,
        hdrs.TRANSFER_ENCODING,
        hdrs.UPGRADE,
        hdrs.HOST,
        hdrs.EXPECT,
    )
)

#: ``route(headers)``: the worker's connection pool, the headers to send it and whether the
#: body goes too (no body for a request the worker will refuse from its headers), or
#: ``(None, reason, False)`` when the session's worker is gone.
Route = Callable[[Any], Awaitable[tuple[aiohttp.ClientSession | None, Any, bool]]]


def _front_error(status: int, kind: str, message: str) -> web.Response:
    """An error the front answers itself, in a shape Anthropic and OpenAI clients both read."""
    return web.json_response(
        {"type": "error", "error": {"type": kind, "message": message}}, status=status
    )


def gone(reason: str) -> web.Response:
    """The 502 for a request whose worker is gone."""
    return _front_error(502, "api_error", reason)


def front_app(route: Route, read_chunk: int = 1 << 20) -> web.Application:
    """The front's app: one catch-all route that forwards to ``route``'s worker."""

    async def forward(request: web.Request) -> web.StreamResponse:
        client, sent, with_body = await route(request.headers)
        if client is None:
            return refused_unread(request, gone(sent))
        headers = [(k, v) for k, v in sent.items() if k.lower() not in HOP_BY_HOP]
        if not with_body:
            headers = [(k, v) for k, v in headers if k.lower() != hdrs.CONTENT_LENGTH.lower()]
        progress = _Progress()
        body = _body(request, read_chunk, progress) if with_body and request.body_exists else None
        try:
            upstream = await client.request(
                request.method, request.rel_url, headers=headers, data=body
            )
        except aiohttp.ClientError as exc:
            if progress.started and not progress.done and (await route(request.headers))[0]:
                # The live worker stopped reading mid-body: it refused the body (over the
                # session's cap) and closed, and the upload's reset beat its answer here.
                return refused_unread(request, too_large())
            reason = f"the agentrl middleware worker for this session is gone ({exc})"
            return refused_unread(request, gone(reason))
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for key, value in upstream.headers.items():
            if key.lower() not in HOP_BY_HOP:
                response.headers.add(key, value)
        refused_unread(request, response)
        try:
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
        except aiohttp.ClientError:
            # The worker died mid-reply: the client sees its connection end early.
            logger.warning("%s %s: the worker went away mid-reply", request.method, request.path)
            if request.transport is not None:
                request.transport.close()
            return response
        finally:
            upstream.release()
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


class _Progress:
    """How far a forwarded body got: a chunk taken by the worker's connection, or all of it."""

    started = False
    done = False


def too_large() -> web.Response:
    """The 413 for a body the worker stopped reading (its own answer was lost to the reset)."""
    message = "request body too large: the session's body cap was reached before its end"
    return _front_error(413, "request_too_large", message)


async def _body(request: web.Request, size: int, progress: _Progress) -> Any:
    while True:
        chunk = await request.content.readany()
        if not chunk:
            progress.done = True
            return
        progress.started = True
        yield chunk
