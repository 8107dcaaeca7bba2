"""The adapter contract: what a wire protocol gives the middleware and gets back.

An adapter turns a request body in its protocol into a :class:`ChatRequest` (chat-template
messages, tool schemas, the client's sampling hints) and turns an :class:`AssistantTurn`
(what the engine sampled, parsed) into its protocol's reply, a :class:`Reply` of plain
values (a JSON body, or server-sent events). Everything else — the HTTP server, sessions,
prompt building, the engine call, writing the reply, recording — is the middleware's
(:mod:`agentrl.serve`), so a protocol is tested by calling it, without a server.

The assistant message recorded in the trajectory is the adapter's own translation of the
wire reply it sent (the second value :meth:`Adapter.respond` returns), so the client's
verbatim replay of that reply on the next turn translates to the same message; the
middleware then puts back the text and reasoning exactly as sampled
(:mod:`agentrl.prompts.sampled`), which the reply may show trimmed, and restores a
replay that differs from it only so.
Helpers for writing an adapter (field checks, content parts, tool calls) are in
:mod:`agentrl.adapters.wire`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import attrs

from agentrl.parsers.base import ToolCall

__all__ = [
    "Adapter",
    "AssistantTurn",
    "ChatRequest",
    "ProtocolError",
    "Reply",
    "generic_error_body",
]

#: The ``type`` of OpenAI's error object per HTTP status (``server_error`` otherwise).
OPENAI_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_api_key",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    431: "invalid_request_error",
    429: "rate_limit_exceeded",
}


class ProtocolError(Exception):
    """A request the adapter cannot serve; answered in the protocol's error shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param


def generic_error_body(error: ProtocolError) -> dict[str, Any]:
    """OpenAI's JSON error object, the shape for anything not owned by another protocol."""
    kind = error.kind or OPENAI_ERROR_TYPES.get(error.status, "server_error")
    return {"error": {"message": error.message, "type": kind, "param": error.param, "code": None}}


@attrs.frozen(kw_only=True)
class ChatRequest:
    """One client request translated to chat-template terms."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    stream: bool = False
    model: str = ""
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: tuple[str, ...] = ()
    #: wire ids the client replayed (tool call ids, signatures, ...), in message order:
    #: ``(index into messages, wire id)``. The middleware links the ones it minted.
    replayed_ids: tuple[tuple[int, str], ...] = ()
    #: protocol-specific context the reply builder needs (tool name mapping, ...).
    context: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class AssistantTurn:
    """What one engine turn produced, parsed, plus what the reply needs to say about it.

    ``finish_reason`` is the engine's (``stop``, ``length``, ``abort``); the adapter maps it
    and the presence of tool calls to its protocol's stop reason. ``mint(kind, index)``
    returns a fresh wire id that encodes this turn (``kind`` is ``tool``, ``call``,
    ``item``, ``message``), ``seal(kind, payload)`` an opaque token (thinking signature,
    reasoning ``encrypted_content``) that the middleware can map back to this turn.
    ``text`` and ``reasoning`` are trimmed for the client; ``sampled_text`` and
    ``sampled_reasoning`` are what the recorded message keeps (whitespace as sampled, an
    empty reasoning block as its newlines), None where they are the same.
    """

    turn_index: int
    text: str
    reasoning: str | None
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str
    prompt_tokens: int
    output_tokens: int
    ill_formed: bool = False
    mint: Callable[[str, int], str] | None = None
    seal: Callable[[str, str | None], str] | None = None
    sampled_text: str | None = None
    sampled_reasoning: str | None = None


@attrs.frozen
class Reply:
    """A protocol's reply as plain values; the middleware writes it to the client.

    ``events`` None: ``body`` (a JSON value) is sent with ``status``. Otherwise the reply is
    a 200 event stream of ``events``, each ``(event name or None, data)``; ``data`` is
    JSON-encoded unless it is already a string (OpenAI's ``[DONE]``).
    """

    body: Any = None
    status: int = 200
    events: tuple[tuple[str | None, Any], ...] | None = None


class Adapter:
    """A wire protocol served by the middleware. Subclasses set ``name`` and ``routes``."""

    name: ClassVar[str]
    #: ``(method, path, kind)``: ``turn`` runs the turn pipeline, ``count`` answers with the
    #: prompt's token count (:meth:`count_reply`).
    routes: ClassVar[tuple[tuple[str, str, str], ...]] = ()

    def parse_request(self, body: Any, headers: Mapping[str, str]) -> ChatRequest:
        """Translate a parsed JSON body; raise :class:`ProtocolError` on bad input."""
        raise NotImplementedError

    def respond(
        self, chat: ChatRequest, turn: AssistantTurn
    ) -> tuple[Reply, dict[str, Any] | None]:
        """The reply to send and the assistant message to record (its translation)."""
        raise NotImplementedError

    def error_body(self, error: ProtocolError) -> dict[str, Any]:
        """The protocol's JSON error object (OpenAI's shape unless overridden)."""
        return generic_error_body(error)

    def count_reply(self, input_tokens: int) -> dict[str, Any]:
        """The body answering a token-count request (protocols that have one)."""
        return {"input_tokens": input_tokens}
