"""Wire formats shared by the E2B test double: Connect-RPC framing and proto3 JSON events.

The e2b Python SDK talks to envd with Connect-RPC over HTTP using the JSON codec
(``application/connect+json`` for streams, ``application/json`` for unary calls). A
stream is a sequence of envelopes: one flags byte, a 4-byte big-endian length, then the
JSON message; the last envelope has flag ``0x02`` and carries ``{"error": …}`` or ``{}``.
Messages follow the proto3 JSON mapping (lowerCamelCase names, bytes as base64).
"""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

from aiohttp import web

__all__ = [
    "CONNECT_STREAM_CONTENT_TYPE",
    "ConnectFramingError",
    "connect_error_response",
    "data_event",
    "decode_envelopes",
    "end_event",
    "end_stream_envelope",
    "envelope",
    "plain_proxy_error",
    "start_event",
]

CONNECT_STREAM_CONTENT_TYPE = "application/connect+json"
_END_STREAM_FLAG = 0x02
_HEADER = struct.Struct(">BI")

#: Connect error code -> HTTP status, as the Connect protocol specifies for unary errors.
_CODE_STATUS = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}


class ConnectFramingError(ValueError):
    """A request body is not a well-formed sequence of Connect envelopes."""


def envelope(message: dict[str, Any], *, flags: int = 0) -> bytes:
    """One Connect envelope holding ``message`` as compact JSON."""
    payload = json.dumps(message, separators=(",", ":")).encode()
    return _HEADER.pack(flags, len(payload)) + payload


def end_stream_envelope(error_code: str | None = None, message: str = "") -> bytes:
    """The envelope that ends a Connect stream, with an error when ``error_code`` is set."""
    body: dict[str, Any] = {}
    if error_code is not None:
        body["error"] = {"code": error_code, "message": message}
    return envelope(body, flags=_END_STREAM_FLAG)


def decode_envelopes(body: bytes) -> list[dict[str, Any]]:
    """The JSON messages of a Connect streaming request body."""
    messages: list[dict[str, Any]] = []
    offset = 0
    while offset < len(body):
        if len(body) - offset < _HEADER.size:
            raise ConnectFramingError(f"truncated envelope header at byte {offset}")
        flags, length = _HEADER.unpack_from(body, offset)
        offset += _HEADER.size
        if flags & 0x01:
            raise ConnectFramingError("compressed envelopes are not supported")
        if len(body) - offset < length:
            raise ConnectFramingError(
                f"envelope at byte {offset} declares {length} bytes, {len(body) - offset} left"
            )
        messages.append(json.loads(body[offset : offset + length]))
        offset += length
    return messages


def start_event(pid: int) -> dict[str, Any]:
    return {"event": {"start": {"pid": pid}}}


def data_event(stream: str, chunk: bytes) -> dict[str, Any]:
    return {"event": {"data": {stream: base64.b64encode(chunk).decode("ascii")}}}


def end_event(exit_code: int, *, error: str | None = None) -> dict[str, Any]:
    end: dict[str, Any] = {
        "exitCode": exit_code,
        "exited": exit_code >= 0,
        "status": f"exit status {exit_code}" if exit_code >= 0 else f"signal: {-exit_code}",
    }
    if error is not None:
        end["error"] = error
    return {"event": {"end": end}}


def connect_error_response(code: str, message: str) -> web.Response:
    """A Connect unary error: the code's HTTP status and a JSON body with a string code."""
    return web.json_response({"code": code, "message": message}, status=_CODE_STATUS.get(code, 500))


def plain_proxy_error(status: int, message: str, *, sandbox_id: str | None = None) -> web.Response:
    """What the edge proxy in front of envd answers with: an integer code, not a Connect one."""
    body: dict[str, Any] = {"code": status, "message": message}
    if sandbox_id is not None:
        body["sandboxId"] = sandbox_id
    return web.json_response(body, status=status)
