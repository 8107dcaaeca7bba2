"""Routes every client may hit besides its protocol's: probes, model list, unknown routes."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from agentrl.adapters.base import Adapter, ProtocolError, generic_error_body
from agentrl.engines.base import Engine, EngineError
from agentrl.serve.limits import decode_json, header_problem, read_body

__all__ = [
    "alive",
    "engine_problem",
    "health_handler",
    "json_route_errors",
    "models_handler",
    "read_json_body",
    "refused_unread",
    "server_logger",
]

logger = logging.getLogger(__name__)


async def alive(request: web.Request) -> web.Response:
    """``GET``/``HEAD`` ``/`` and ``/api/hello``: Claude Code's connectivity probes."""
    return web.json_response({"ok": True})


async def engine_problem(engine: Engine) -> str | None:
    """Why ``engine`` cannot serve now (its ``health()`` check), or None when it can."""
    check = getattr(engine, "health", None)
    if check is None:
        return None
    try:
        await check()
    except EngineError as exc:
        return str(exc)
    except Exception as exc:  # a plugin engine's health() must not take /healthz down
        logger.warning("engine health check failed unexpectedly", exc_info=True)
        return f"the engine's health check failed: {type(exc).__name__}: {exc}"
    return None


def health_handler(get_engine: Callable[[], Any]):
    """``GET /healthz``: 200 when the engine answers its health check, else 503 with the reason."""

    async def healthz(request: web.Request) -> web.Response:
        problem = await engine_problem(get_engine())
        if problem is None:
            return web.json_response({"ok": True, "engine": "ok"})
        body = {
            "ok": False,
            "engine": "unavailable",
            "error": {"type": "engine_unavailable", "message": problem},
        }
        return web.json_response(body, status=503)

    return healthz


def models_handler(model_name: str):
    """``GET /v1/models`` in a shape both OpenAI and Anthropic SDKs read."""
    model = {
        "id": model_name,
        "object": "model",
        "type": "model",
        "display_name": model_name,
        "created": 0,
        "created_at": "1970-01-01T00:00:00Z",
        "owned_by": "agentrl",
    }
    body = {
        "object": "list",
        "data": [model],
        "has_more": False,
        "first_id": model_name,
        "last_id": model_name,
    }

    async def models(request: web.Request) -> web.Response:
        return web.json_response(body)

    return models


async def read_json_body(request: web.Request, limit: int) -> Any:
    """The parsed, checked JSON body (:func:`~agentrl.serve.limits.decode_json`); 413 over
    ``limit`` bytes (nothing past the limit is read), 400 when it is not acceptable JSON.

    It decodes on the calling thread; the middleware decodes in its pool instead.
    """
    return decode_json(await read_body(request, limit))


class _ServerLog(logging.LoggerAdapter):
    """aiohttp's low-level server log with malformed requests on one line, no traceback.

    A header line over ``max_line_size``, a field over ``max_field_size`` or too many
    headers is a client's error (aiohttp answers 400); any other error keeps its traceback.
    """

    def exception(self, msg: Any, *args: Any, exc_info: Any = True, **kwargs: Any) -> None:
        if isinstance(exc_info, HttpProcessingError):
            reason = str(exc_info.message).splitlines()[0][:200]
            self.logger.warning(f"{msg}: %s (HTTP %s)", *args, reason, exc_info.code)
            return
        self.logger.exception(msg, *args, exc_info=exc_info, **kwargs)


def server_logger() -> logging.LoggerAdapter:
    """The ``logger=`` for aiohttp's request handler (``AppRunner(..., logger=...)``)."""
    return _ServerLog(logging.getLogger("aiohttp.server"), {})


def _owner(adapters: Sequence[Adapter], path: str) -> Adapter | None:
    """The adapter with the longest route that ``path`` equals or lies under, if any."""
    best, best_len = None, 0
    for adapter in adapters:
        for _, route, _ in adapter.routes:
            under = path == route or path.startswith(route.rstrip("/") + "/")
            if under and len(route) > best_len:
                best, best_len = adapter, len(route)
    return best


def refused_unread(request: web.BaseRequest, response: web.StreamResponse) -> web.StreamResponse:
    """``response`` marked ``Connection: close`` when it refuses a body not yet all received.

    The server then closes the connection after the response instead of reading the rest
    (:data:`~agentrl.serve.limits.SERVER_ARGS` turns aiohttp's lingering off), so the
    client cannot keep streaming a body nobody will read.
    """
    if not response.prepared and not request.content.is_eof():
        response.force_close()
    return response


def json_route_errors(adapters: Sequence[Adapter]):
    """An aiohttp middleware answering oversized headers (431), unknown routes (404) and
    wrong methods (405) in JSON, and ending the connection of any answer that leaves the
    request's body unread (:func:`refused_unread`).

    A path under an adapter's route (``/v1/messages/batches``) gets that protocol's error
    shape; any other path the OpenAI shape, ``{"error": {"message", "type", ...}}``.
    """
    served = sorted({f"{method} {path}" for a in adapters for method, path, _ in a.routes})

    @web.middleware
    async def middleware(request: web.Request, handler: Any) -> web.StreamResponse:
        headers: dict[str, str] = {}
        error = header_problem(request)
        if error is None:
            try:
                return refused_unread(request, await handler(request))
            except web.HTTPMethodNotAllowed as exc:
                allowed = ", ".join(sorted(exc.allowed_methods))
                error = ProtocolError(
                    405, f"{request.method} {request.path} is not allowed; use {allowed}"
                )
                headers = {"Allow": ",".join(sorted(exc.allowed_methods))}
            except web.HTTPNotFound:
                error = ProtocolError(
                    404,
                    f"agentrl has no route {request.method} {request.path}; it serves "
                    f"{', '.join(served)}, GET /v1/models and GET /healthz",
                )
        owner = _owner(adapters, request.path)
        body = owner.error_body(error) if owner is not None else generic_error_body(error)
        return refused_unread(
            request, web.json_response(body, status=error.status, headers=headers)
        )

    return middleware
