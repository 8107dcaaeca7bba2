"""Writing an adapter's :class:`~agentrl.adapters.base.Reply` (and errors) to the client.

Public API::

    json_reply(data, *, status=200) -> web.Response     # orjson-encoded, utf-8
    error_reply(adapter, error) -> web.Response         # the protocol's error body, its status
    await write_reply(request, reply) -> web.StreamResponse
    sse_event(event, data) -> bytes                     # one server-sent event

An event stream goes out in one write: the generation is complete before the reply is
built, and every event is encoded before the 200 headers are sent, so an error encoding
them is still answered as an error, not as a broken stream.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from agentrl import jsonio
from agentrl.adapters.base import Adapter, ProtocolError, Reply

__all__ = ["error_reply", "json_reply", "sse_event", "write_reply"]

_SSE_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


def json_reply(data: Any, *, status: int = 200) -> web.Response:
    """A JSON reply (``application/json; charset=utf-8``), encoded by :mod:`agentrl.jsonio`."""
    return web.Response(
        body=jsonio.dumps(data), status=status, content_type="application/json", charset="utf-8"
    )


def error_reply(adapter: Adapter, error: ProtocolError) -> web.Response:
    """``error`` in ``adapter``'s protocol (its JSON error body), with its status."""
    return json_reply(adapter.error_body(error), status=error.status)


def sse_event(event: str | None, data: Any) -> bytes:
    """One server-sent event; ``data`` is JSON-encoded unless it is already a string."""
    payload = data.encode() if isinstance(data, str) else jsonio.dumps(data)
    head = b"event: " + event.encode() + b"\n" if event else b""
    return head + b"data: " + payload + b"\n\n"


async def write_reply(request: web.Request, reply: Reply) -> web.StreamResponse:
    """Send ``reply`` whole: its JSON body, or its events as one 200 stream."""
    if reply.events is None:
        response: web.StreamResponse = json_reply(reply.body, status=reply.status)
        await response.prepare(request)
        await response.write_eof()
        return response
    payload = b"".join(sse_event(event, data) for event, data in reply.events)
    response = web.StreamResponse(status=200, headers=_SSE_HEADERS)
    await response.prepare(request)
    await response.write(payload)
    await response.write_eof()
    return response
