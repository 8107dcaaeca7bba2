"""Routes every client may hit besides its protocol's: probes, model list, body reading."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from agentrl.adapters.protocol import ProtocolError

__all__ = ["health", "models_handler", "read_json_body"]


async def health(request: web.Request) -> web.Response:
    """``GET /healthz``; also ``GET``/``HEAD`` ``/`` and ``/api/hello`` (Claude Code's probes)."""
    return web.json_response({"ok": True})


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
    """The parsed JSON body; 413 over ``limit`` bytes, 400 when it is not JSON."""
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise ProtocolError(
            413,
            f"request body is larger than the middleware's limit of {limit} bytes "
            "(Middleware(max_body_bytes=...))",
        ) from None
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(400, f"request body is not valid JSON: {exc}") from None
