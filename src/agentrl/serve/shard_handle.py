"""The parent's side of one worker of a sharded middleware, and its sessions' mirrors.

:class:`WorkerHandle` holds the worker's process, its pipe (read by one task; every
answer resolves the request that asked for it, every ``progress`` message updates a
:class:`ShardSession`), and the sessions it owns. When the pipe ends (the worker is gone)
everything waiting on it fails with :class:`WorkerDiedError` and its sessions are marked
lost, at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import pickle
import time
from typing import TYPE_CHECKING, Any

import attrs

from agentrl.serve.shard_wire import SessionState, open_stream, recv, send
from agentrl.types import TurnFact

if TYPE_CHECKING:
    import aiohttp

__all__ = ["CALL_TIMEOUT", "ShardSession", "WorkerDiedError", "WorkerHandle"]

logger = logging.getLogger(__name__)

#: Seconds a session request (open, drop, settle) may take; finish adds its wait_timeout.
CALL_TIMEOUT = 60.0


class WorkerDiedError(RuntimeError):
    """The worker process that owned a session is gone; the session is lost."""


@attrs.define(eq=False)
class ShardSession:
    """The parent's mirror of a session a worker owns: what a rollout reads of it."""

    sid: str
    #: the token the client sends (the worker's own replaces it on the way)
    token: str
    worker: int
    turns_started: int = 0
    turns_recorded: int = 0
    #: turns that failed on engine aborts (``Session.aborted_turns``)
    aborted_turns: int = 0
    turn_facts: list[TurnFact] = attrs.field(factory=list)
    closed: bool = False
    #: why the session is lost (its worker is gone), else None
    lost: str | None = None
    #: the worker's token for this session, once it answered the open
    opened: asyncio.Future[str] | None = attrs.field(default=None, repr=False)

    def apply(self, state: SessionState | None, *, final: bool = False) -> None:
        """Take the worker's counters and facts (``final``: all the facts, not the new)."""
        if state is None:
            return
        self.turns_started, self.turns_recorded = state.turns_started, state.turns_recorded
        self.aborted_turns = state.aborted_turns
        if final:
            self.turn_facts[:] = state.new_facts
        else:
            self.turn_facts.extend(state.new_facts)


class WorkerHandle:
    """The parent's handle on one worker: its process, pipe, pending requests, sessions."""

    def __init__(self, index: int, process: Any, unix_path: str) -> None:
        self.index = index
        self.process = process
        self.unix_path = unix_path
        self.pid: int | None = None
        self.dead: str | None = None
        self.ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.sessions: dict[str, ShardSession] = {}
        self.client: aiohttp.ClientSession | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._ids = itertools.count()
        self._reader: asyncio.Task[None] | None = None

    async def attach(self, conn: Any) -> None:
        reader, self._writer = await open_stream(conn)
        self._reader = asyncio.create_task(self._read(reader))

    def request(self, op: str, *args: Any) -> asyncio.Future[Any]:
        """Send ``op`` now (sync); the future is the worker's answer."""
        future = asyncio.get_running_loop().create_future()
        if self.dead is not None or self._writer is None:
            future.set_exception(WorkerDiedError(self.dead or "the worker is not started"))
            return future
        rid = next(self._ids)
        self._pending[rid] = future
        send(self._writer, (op, rid, *args))
        return future

    async def call(self, op: str, *args: Any, timeout: float = CALL_TIMEOUT) -> Any:
        return await asyncio.wait_for(self.request(op, *args), timeout)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                kind, *rest = await recv(reader)
                if kind == "progress":
                    mirror = self.sessions.get(rest[0])
                    if mirror is not None:
                        mirror.apply(rest[1])
                elif kind in ("ok", "err"):
                    future = self._pending.pop(rest[0], None)
                    if future is not None and not future.done():
                        if kind == "ok":
                            future.set_result(rest[1])
                        else:
                            future.set_exception(rest[1])
                elif kind == "ready":
                    self.pid = rest[0]
                    self.ready.set_result(rest[0])
                elif kind == "failed":
                    if not self.ready.done():
                        self.ready.set_exception(rest[0])  # start() raises the error itself
                    self.died(f"middleware worker {self.index} failed to start: {rest[0]}")
                    return
        except (asyncio.IncompleteReadError, ConnectionError, EOFError, pickle.UnpicklingError):
            pass
        code = self.process.exitcode
        self.died(
            f"middleware worker {self.index} (pid {self.pid or self.process.pid}) is gone"
            + (f" (exit code {code})" if code is not None else "")
            + "; its sessions are lost"
        )

    def died(self, reason: str) -> None:
        """Fail everything waiting on this worker and every session it owned."""
        if self.dead is not None:
            return
        self.dead = reason
        logger.error("%s", reason)
        error = WorkerDiedError(reason)
        if not self.ready.done():
            self.ready.set_exception(error)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()
        for mirror in self.sessions.values():
            mirror.lost = reason
            if mirror.opened is not None and not mirror.opened.done():
                mirror.opened.set_exception(error)
        if self._writer is not None:
            self._writer.close()

    async def stop(self, timeout: float) -> None:
        """Ask the worker to close; terminate, then kill it if it does not exit in time."""
        if self.dead is None and self._writer is not None:
            with contextlib.suppress(Exception):
                await self.call("close", timeout=timeout)
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        if self._writer is not None:
            self._writer.close()
        for action in (None, self.process.terminate, self.process.kill):
            if action is not None:
                with contextlib.suppress(Exception):
                    action()
            if await _exited(self.process, timeout if action is None else 5.0):
                break
        with contextlib.suppress(Exception):
            self.process.join(1.0)
        if self.client is not None:
            await self.client.close()


async def _exited(process: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while process.is_alive():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True
