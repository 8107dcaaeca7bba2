"""What one request may cost: body caps per session, JSON shape checks, count_tokens calls.

A policy runs inside the sandbox with its session's token, so everything here assumes a
hostile client:

- :func:`body_cap`: a session's body cap scales with its context budget,
  ``clamp(BYTES_PER_TOKEN * budget, MIN_BODY_BYTES, ceiling)`` (an unbudgeted session
  counts as :data:`UNBUDGETED_TOKENS`; the ceiling is ``Middleware(max_body_bytes=...)``);
- :func:`read_body`: the body read only up to that cap (413 without reading further when
  ``Content-Length`` says more; a chunked body is counted as it streams and cut at the cap);
- :data:`SERVER_ARGS` / :func:`header_problem`: the HTTP server's own bounds. A request whose
  body is refused unread ends its connection (no lingering read of what the client still
  sends); a request line or header field over :data:`MAX_HEADER_FIELD_BYTES`, or more than
  :data:`MAX_HEADERS` headers, is a 431 in the route's error shape (the HTTP parser itself
  only stops what is past :data:`HEADER_PARSER_CEILING` or :data:`HEADERS_PARSER_CEILING`);
- :func:`decode_json` / :func:`check_json` / :func:`check_depth`: a body (or a tool call's JSON arguments) nested
  deeper than :data:`MAX_JSON_DEPTH` or carrying a lone UTF-16 surrogate (``"\\ud800"``,
  which no tokenizer can encode) is a 400, never a ``RecursionError`` or a
  ``UnicodeEncodeError`` later;
- :func:`count_tokens_allowance`: how many ``count_tokens`` calls a session may make so
  far (each costs a full render and tokenization, and records no turn).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from agentrl import jsonio
from agentrl.adapters.base import ProtocolError

if TYPE_CHECKING:
    from aiohttp import web

__all__ = [
    "BYTES_PER_TOKEN",
    "COUNT_TOKENS_FREE_CALLS",
    "COUNT_TOKENS_PER_TURN",
    "HEADERS_PARSER_CEILING",
    "HEADER_PARSER_CEILING",
    "MAX_HEADERS",
    "MAX_HEADER_FIELD_BYTES",
    "MAX_JSON_DEPTH",
    "MIN_BODY_BYTES",
    "SERVER_ARGS",
    "UNBUDGETED_TOKENS",
    "body_cap",
    "check_depth",
    "check_json",
    "count_tokens_allowance",
    "decode_json",
    "header_problem",
    "read_body",
    "too_deep",
]

#: Body bytes allowed per token of context budget. A token is ~3.5 bytes of code or prose
#: and up to ~9 as JSON-escaped CJK; the rest covers tool schemas, replayed metadata and
#: images (which the middleware replaces with a marker but a client still sends).
BYTES_PER_TOKEN = 32
#: The smallest cap any session gets (Claude Code's first request alone is ~90 KB).
MIN_BODY_BYTES = 4 * 1024 * 1024
#: The budget an unbudgeted session (``max_context_tokens=0``) is capped as: 8 MiB.
UNBUDGETED_TOKENS = 262_144
#: Deepest nesting of objects and arrays accepted in a body or in tool-call arguments
#: (real clients stay under 20: tool schemas and tool inputs).
MAX_JSON_DEPTH = 128
#: ``count_tokens`` calls a session may make before its first turn ...
COUNT_TOKENS_FREE_CALLS = 32
#: ... and the calls each started turn adds to that allowance.
COUNT_TOKENS_PER_TURN = 4

#: The longest request line or header field (name or value) a client may send: aiohttp's
#: own default, answered in the route's error shape rather than by the HTTP parser.
MAX_HEADER_FIELD_BYTES = 8190
#: The most header fields a request may carry (aiohttp's own default).
MAX_HEADERS = 128
#: What the HTTP parser buffers of one line or field before it gives up with its own
#: plain-text 400 (past anything a client sends; the 431 above answers in between).
HEADER_PARSER_CEILING = 4 * MAX_HEADER_FIELD_BYTES
#: The header count past which the HTTP parser gives up with its own plain-text 400.
HEADERS_PARSER_CEILING = 2 * MAX_HEADERS
#: ``handler_args`` for every aiohttp server that faces a client: the parser's ceilings,
#: and no lingering: a response sent while the client's body is still unread ends the
#: connection rather than reading (and dropping) the rest of the body for up to 10 s,
#: which let four unauthenticated 60 MB bodies stall the event loop for 2 s.
SERVER_ARGS = {
    "max_line_size": HEADER_PARSER_CEILING,
    "max_field_size": HEADER_PARSER_CEILING,
    "max_headers": HEADERS_PARSER_CEILING,
    "lingering_time": 0,
}

_CHUNK = 1 << 16


def body_cap(max_context_tokens: int, ceiling: int) -> int:
    """The body cap of a session with context budget ``max_context_tokens`` (0: none)."""
    budget = max_context_tokens if max_context_tokens > 0 else UNBUDGETED_TOKENS
    return min(ceiling, max(MIN_BODY_BYTES, BYTES_PER_TOKEN * budget))


def count_tokens_allowance(turns_started: int) -> int:
    """How many ``count_tokens`` calls a session that started ``turns_started`` turns may make."""
    return COUNT_TOKENS_FREE_CALLS + COUNT_TOKENS_PER_TURN * turns_started


def _too_large(cap: int, what: str) -> ProtocolError:
    return ProtocolError(
        413,
        f"request body is larger than this session's limit of {cap} bytes ({what}); the "
        f"limit is {BYTES_PER_TOKEN} bytes per token of the session's context budget, at "
        f"least {MIN_BODY_BYTES} and at most Middleware(max_body_bytes=...)",
    )


def header_problem(request: web.BaseRequest) -> ProtocolError | None:
    """The 431 for a request whose line or headers pass :data:`MAX_HEADER_FIELD_BYTES` or
    :data:`MAX_HEADERS`, or None when they are within both."""
    fields = request.raw_headers
    if len(fields) > MAX_HEADERS:
        found = f"{len(fields)} header fields, more than the {MAX_HEADERS} allowed"
    elif len(request.raw_path) > MAX_HEADER_FIELD_BYTES:
        found = f"a request target of {len(request.raw_path)} bytes"
    else:
        longest = max(fields, key=lambda f: max(len(f[0]), len(f[1])), default=None)
        size = 0 if longest is None else max(len(longest[0]), len(longest[1]))
        if size <= MAX_HEADER_FIELD_BYTES:
            return None
        name = longest[0][:64].decode("latin-1")  # type: ignore[index]
        found = f"header {name!r} of {size} bytes"
    return ProtocolError(
        431,
        f"request headers are too large ({found}); a request line or header field may be "
        f"at most {MAX_HEADER_FIELD_BYTES} bytes, with at most {MAX_HEADERS} fields: send "
        "large content in the body",
    )


async def read_body(request: web.Request, cap: int) -> bytes:
    """The raw body, read only while it stays within ``cap`` bytes (413 beyond).

    A declared ``Content-Length`` over ``cap`` is refused before anything is read; a
    chunked body is counted as it arrives and refused at the first chunk past ``cap``,
    so no more than ``cap`` bytes are ever held.
    """
    declared = request.content_length
    if declared is not None and declared > cap:
        raise _too_large(cap, f"Content-Length is {declared}")
    chunks, size = [], 0
    while True:
        chunk = await request.content.read(_CHUNK)
        if not chunk:
            break
        size += len(chunk)
        if size > cap:
            raise _too_large(cap, "the body sent is longer")
        chunks.append(chunk)
    return b"".join(chunks)


def decode_json(raw: bytes, what: str = "request body") -> Any:
    """``raw`` parsed as JSON and checked by :func:`check_json`; a 400 otherwise.

    orjson parses it (:func:`agentrl.jsonio.loads_strict`; its strings are valid Unicode,
    so only the depth is checked); what orjson refuses is parsed by :func:`json.loads` and
    checked in full, so ``NaN``, a lone surrogate escape or a syntax error meet the same
    answer as ever.
    """
    try:
        value = jsonio.loads_strict(raw)
    except ValueError:
        pass
    else:
        check_depth(value, what)
        return value
    try:
        value = json.loads(raw)
    except RecursionError:
        raise too_deep(what) from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(400, f"{what} is not valid JSON: {exc}") from None
    check_json(value, what)
    return value


def check_depth(value: Any, what: str = "request body") -> None:
    """A 400 when ``value`` nests objects and arrays deeper than :data:`MAX_JSON_DEPTH`.

    ``value`` is what a JSON parser returns (its containers are exact ``dict`` and
    ``list``). Walks the containers only, one level at a time (strings are not visited);
    exact type checks, not ``isinstance``, since every child of every container is checked.
    """
    level = [value] if type(value) is dict or type(value) is list else []
    depth = 0
    while level:
        if depth >= MAX_JSON_DEPTH:
            raise too_deep(what)
        below: list[Any] = []
        for item in level:
            for child in item.values() if type(item) is dict else item:
                kind = type(child)
                if kind is dict or kind is list:
                    below.append(child)
        level = below
        depth += 1


def too_deep(what: str) -> ProtocolError:
    """The 400 for JSON in ``what`` nested deeper than :data:`MAX_JSON_DEPTH`."""
    return ProtocolError(
        400, f"{what} nests objects and arrays deeper than {MAX_JSON_DEPTH} levels", param=what
    )


def _check_text(text: str, what: str) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ProtocolError(
            400,
            f"{what} holds a lone UTF-16 surrogate ({text[exc.start]!r} at offset "
            f"{exc.start} of a string), which is not valid Unicode; encode text as UTF-8",
            param=what,
        ) from None


def check_json(value: Any, what: str = "request body") -> None:
    """A 400 when ``value`` nests deeper than :data:`MAX_JSON_DEPTH` or a string (key or
    value) holds a lone surrogate. Iterative, so any depth is safe to check."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _check_text(item, what)
            continue
        if isinstance(item, dict):
            children: Any = item.values()
            for key in item:
                _check_text(key, what)
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth >= MAX_JSON_DEPTH:
            raise too_deep(what)
        stack.extend(
            (child, depth + 1) for child in children if isinstance(child, (str, dict, list))
        )
