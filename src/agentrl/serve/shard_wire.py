"""What a sharded middleware's parent and its worker processes say to each other.

One duplex pipe per worker (a unix socket pair made by ``multiprocessing.Pipe``), read
and written as asyncio streams on both sides so neither ever blocks its loop on a worker
that stalls or dies mid-message. Each message is an 8-byte length and a pickle:

* parent → worker: ``("open", rid, sid, kwargs)``, ``("finish", rid, sid, kwargs)``,
  ``("drop", rid, sid)``, ``("settle", rid, sid)``, ``("stats", rid)``, ``("close", rid)``;
* worker → parent: ``("ready", pid)`` or ``("failed", error)`` once at start-up,
  ``("ok", rid, value)`` / ``("err", rid, error)`` for each request, and
  ``("progress", sid, SessionState)`` after every request of a session that changed it.

Also here: :func:`tune_gc`, the garbage-collector policy every long-lived middleware
process applies once start-up is over (workers, ``agentrl serve``, the rollout stack, the
slime service).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import pickle
import socket
import struct
from typing import Any

import attrs

from agentrl.types import TurnFact

__all__ = [
    "GC_THRESHOLD",
    "SessionState",
    "open_stream",
    "portable_error",
    "recv",
    "send",
    "tune_gc",
]

logger = logging.getLogger(__name__)

_HEADER = struct.Struct("!Q")

#: The collector's thresholds once start-up is over (CPython's default: 700, 10, 10).
#: A turn allocates ~100k short-lived objects (the request's JSON, the rendered messages):
#: 700 runs a young collection every 700 of them, each one also scanning what survived.
#: 20k runs ~30x fewer; young objects die by reference counting long before, so each
#: collection finds little to scan (see docs/middleware.md, "Workers and the collector").
GC_THRESHOLD = (20_000, 20, 10)


def tune_gc() -> None:
    """Move every object alive now (modules, the tokenizer, plugins) out of the collector's
    sight (``gc.freeze``) and raise the young generation's threshold.

    Call it once, after start-up: a full collection then scans only what sessions hold
    (compact id arrays), not the hundreds of thousands of start-up objects.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)
    logger.debug(
        "gc: froze %d start-up objects; thresholds %s", gc.get_freeze_count(), GC_THRESHOLD
    )


@attrs.frozen
class SessionState:
    """What the parent mirrors of a worker's session: its counters and turn facts."""

    turns_started: int
    turns_recorded: int
    #: The facts recorded since the state last sent (all of them in a final state).
    new_facts: tuple[TurnFact, ...] = ()
    #: Turns that failed on engine aborts (``Session.aborted_turns``).
    aborted_turns: int = 0


async def open_stream(conn: Any) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Asyncio streams over a ``multiprocessing`` pipe end (which is then closed)."""
    sock = socket.socket(fileno=os.dup(conn.fileno()))
    conn.close()
    sock.setblocking(False)
    return await asyncio.open_unix_connection(sock=sock)


def send(writer: asyncio.StreamWriter, message: tuple[Any, ...]) -> None:
    """Queue one message (never blocks; the transport buffers it)."""
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    writer.write(_HEADER.pack(len(payload)) + payload)


async def recv(reader: asyncio.StreamReader) -> tuple[Any, ...]:
    """The next message; ``asyncio.IncompleteReadError`` when the other side is gone."""
    (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    return pickle.loads(await reader.readexactly(size))


def portable_error(exc: BaseException) -> BaseException:
    """``exc`` if it survives a pickle round trip, else a ``RuntimeError`` saying what it was."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc
