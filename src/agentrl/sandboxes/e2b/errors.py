"""Which e2b SDK failures are worth re-sending, and how to get fresh connections.

The SDK surfaces a failure in several shapes: its own exceptions (a 502 from the edge
proxy becomes ``SandboxUnreachableException``, a gone sandbox ``SandboxNotRunningException``),
httpx transport errors from file transfers, Connect-RPC errors, and builtin ``OSError``s
from the transport. ``classify`` maps each to one verdict.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import re
import ssl
from typing import Any

__all__ = ["Verdict", "classify", "rebuild_handle", "reset_sdk_transports"]

logger = logging.getLogger(__name__)


class Verdict(enum.Enum):
    TRANSIENT = "transient"  # the call may succeed if re-sent
    GONE = "gone"  # the sandbox no longer exists
    FATAL = "fatal"  # re-sending cannot help (bad request, auth, missing file, ...)


#: Messages of a sandbox that no longer exists (E2B proxy / API, and slime-style gateways).
_GONE_RE = re.compile(
    r"was not found|sandbox .* not found|does not exist|STOPPED state|is not running",
    re.IGNORECASE,
)
#: Transport errors by class name, whichever library raised them (httpx, pyqwest, h2, ssl).
_TRANSIENT_NAMES = frozenset(
    {
        "ProtocolError",
        "RemoteProtocolError",
        "LocalProtocolError",
        "StreamError",
        "ReadError",
        "WriteError",
        "ConnectError",
        "ConnectTimeout",
        "ReadTimeout",
        "WriteTimeout",
        "PoolTimeout",
        "TimeoutException",
        "NetworkError",
        "SSLError",
    }
)
#: SDK exceptions that are the server refusing the request itself: re-sending cannot help.
_FATAL_SDK_CLASSES = (
    "AuthenticationException",
    "InvalidArgumentException",
    "FileNotFoundException",
    "TemplateException",
    "NotEnoughSpaceException",
)
_TRANSIENT_CONNECT_CODES = frozenset(
    {"unavailable", "unknown", "internal", "aborted", "deadline_exceeded", "resource_exhausted"}
)
_STATUS_PREFIX_RE = re.compile(r"^\s*(\d{3})\s*:")


def _sdk_class(exc: BaseException, name: str) -> bool:
    """Whether ``exc`` is an instance of the e2b SDK exception class ``name`` (by MRO)."""
    return any(
        klass.__name__ == name and klass.__module__.startswith("e2b") for klass in type(exc).__mro__
    )


def _status_code(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        return status
    match = _STATUS_PREFIX_RE.match(str(exc))
    return int(match.group(1)) if match else None


def _classify_one(exc: BaseException) -> Verdict | None:
    """A verdict for this exception alone, or None when it says nothing either way."""
    if _sdk_class(exc, "SandboxNotRunningException") or _sdk_class(exc, "SandboxNotFoundException"):
        return Verdict.GONE
    if _sdk_class(exc, "SandboxUnreachableException"):
        return Verdict.TRANSIENT
    if _sdk_class(exc, "RateLimitException") or _sdk_class(exc, "ServiceBusyException"):
        return Verdict.TRANSIENT
    # Typed refusals go before the message test: envd says "cwd '/x' does not exist" for a
    # missing working directory, which is a bad request, not a gone sandbox.
    for name in _FATAL_SDK_CLASSES:
        if _sdk_class(exc, name):
            return Verdict.FATAL
    if _GONE_RE.search(str(exc)):
        return Verdict.GONE
    if _sdk_class(exc, "NotFoundException"):
        return Verdict.FATAL
    if type(exc).__module__.startswith("connectrpc"):
        code = getattr(getattr(exc, "code", None), "value", None)
        if code in _TRANSIENT_CONNECT_CODES:
            return Verdict.TRANSIENT
        return Verdict.FATAL
    if isinstance(exc, (ssl.SSLError, ConnectionError, TimeoutError, asyncio.TimeoutError)):
        return Verdict.TRANSIENT
    if type(exc).__name__ in _TRANSIENT_NAMES:
        return Verdict.TRANSIENT
    if "ended without an end event" in str(exc):
        # A command stream that closed before the process's end event: a cut stream.
        return Verdict.TRANSIENT
    status = _status_code(exc)
    if status is not None:
        return Verdict.TRANSIENT if status >= 500 or status == 429 else Verdict.FATAL
    return None


def classify(exc: BaseException) -> Verdict:
    """The verdict on an SDK failure, looking through its causes for a transport error."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        verdict = _classify_one(current)
        if verdict is not None:
            return verdict
        current = current.__cause__ or current.__context__
    return Verdict.FATAL


def reset_sdk_transports() -> bool:
    """Drop the SDK's process-wide connection pools so the next request dials afresh.

    The SDK caches one pool per (proxy, read timeout, HTTP version) for the whole process;
    clients already built keep the pool they hold, so only handles rebuilt afterwards use
    new connections. Returns whether anything was reset (False on an SDK without these
    caches, where a rebuilt handle is all we can do).
    """
    try:
        from e2b.api import client_async
    except ImportError:
        return False
    lock = getattr(client_async, "_transport_lock", None)
    caches = [
        cache
        for cache in (
            getattr(client_async, name, None)
            for name in ("_transports", "_pools", "_httpx_transports")
        )
        if isinstance(cache, dict)
    ]
    if lock is None or not caches:
        return False
    with lock:
        for cache in caches:
            cache.clear()
    return True


def rebuild_handle(handle: Any) -> Any:
    """A new ``AsyncSandbox`` for the same sandbox, with new RPC and HTTP clients."""
    try:
        return type(handle)(
            sandbox_id=handle.sandbox_id,
            sandbox_domain=handle.sandbox_domain,
            envd_version=handle._envd_version,
            envd_access_token=handle._envd_access_token,
            traffic_access_token=handle.traffic_access_token,
            connection_config=handle.connection_config,
        )
    except Exception as exc:  # an SDK whose constructor differs: keep the old handle
        logger.debug("could not rebuild the e2b sandbox handle (%s); keeping the old one", exc)
        return handle
