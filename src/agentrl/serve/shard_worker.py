"""The main of one worker process of a :class:`~agentrl.serve.shards.ShardedMiddleware`.

The parent starts it with the ``spawn`` context:
``main(build, index, conn, unix_path, log_level)``.
The worker calls ``build()`` (its own engine client, tokenizer and plugins), adds two
hooks to the app (every response says which worker served it in ``X-Agentrl-Worker``
and ``X-Agentrl-Worker-Pid``; after every request of a session the changed counters and
new turn facts go to the parent), freezes its start-up objects (:func:`tune_gc`), serves
HTTP on ``unix_path`` and answers the parent's session requests on ``conn``
(:mod:`agentrl.serve.shard_wire`).

It ignores SIGINT (a Ctrl-C reaches the whole process group; the parent finishes the
sessions first, then closes the workers) and exits when the parent says ``close`` or
when the pipe reaches end of file (the parent is gone).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from aiohttp import web

from agentrl.serve.shard_wire import (
    SessionState,
    open_stream,
    portable_error,
    recv,
    send,
    tune_gc,
)

if TYPE_CHECKING:
    from agentrl.serve.middleware import Middleware

__all__ = ["WORKER_HEADER", "WORKER_PID_HEADER", "main"]

logger = logging.getLogger(__name__)

#: The response header naming the worker (its index) that served a request.
WORKER_HEADER = "X-Agentrl-Worker"
#: The response header with that worker's process id.
WORKER_PID_HEADER = "X-Agentrl-Worker-Pid"


def main(
    build: Callable[[], Middleware],
    index: int,
    conn: Any,
    unix_path: str,
    log_level: int = logging.WARNING,
) -> None:
    """Run worker ``index`` until the parent closes it or goes away (logging at the
    parent's ``agentrl`` level, to stderr)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(
        level=log_level, format=f"%(asctime)s [worker {index}] %(levelname)s %(name)s: %(message)s"
    )
    asyncio.run(_Worker(index).run(build, conn, unix_path))


class _Worker:
    """One worker's middleware and its side of the pipe."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.middleware: Middleware | None = None
        self.writer: asyncio.StreamWriter | None = None
        #: the middleware's token of each session this worker opened, to its id
        self.sids: dict[str, str] = {}
        #: what the parent was last told of each open session: (started, recorded, facts,
        #: aborted turns)
        self.told: dict[str, tuple[int, int, int, int]] = {}
        self.tasks: set[asyncio.Task[None]] = set()

    async def run(self, build: Callable[[], Middleware], conn: Any, unix_path: str) -> None:
        reader, self.writer = await open_stream(conn)
        try:
            middleware = self.middleware = build()
            self.hook(middleware.app)
            tune_gc()
            await middleware.start(host=None, unix_path=unix_path)
        except BaseException as exc:
            logger.exception("middleware worker %d failed to start", self.index)
            send(self.writer, ("failed", portable_error(exc)))
            with contextlib.suppress(Exception):
                await self.writer.drain()
            await self.shutdown()
            return
        send(self.writer, ("ready", os.getpid()))
        closing = None
        try:
            while True:
                try:
                    message = await recv(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    break  # the parent is gone
                if message[0] == "close":
                    closing = message[1]
                    break
                if message[0] == "open":
                    self.answer(message[1], self.open, *message[2:])  # in order: sync
                else:
                    task = asyncio.create_task(self.handle(message))
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
        finally:
            await self.shutdown()
            if closing is not None:
                send(self.writer, ("ok", closing, None))
                with contextlib.suppress(Exception):
                    await self.writer.drain()

    async def shutdown(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        middleware, self.middleware = self.middleware, None
        if middleware is not None:
            with contextlib.suppress(Exception):
                await middleware.close()
            with contextlib.suppress(Exception):
                await middleware.engine.aclose()

    # -- the app's hooks ---------------------------------------------------------------

    def hook(self, app: web.Application) -> None:
        pid = str(os.getpid())
        index = str(self.index)

        async def stamp(request: web.Request, response: web.StreamResponse) -> None:
            response.headers[WORKER_HEADER] = index
            response.headers[WORKER_PID_HEADER] = pid

        @web.middleware
        async def report(request: web.Request, handler: Any) -> web.StreamResponse:
            try:
                return await handler(request)
            finally:
                sid = self.sid_of(request.headers)
                if sid is not None:
                    self.report(sid)

        app.on_response_prepare.append(stamp)
        app.middlewares.append(report)

    def sid_of(self, headers: Mapping[str, str]) -> str | None:
        auth = headers.get("Authorization", "")
        if auth[:7].lower() == "bearer ":
            sid = self.sids.get(auth[7:].strip())
            if sid is not None:
                return sid
        return self.sids.get(headers.get("x-api-key", "").strip())

    def state(self, sid: str, *, final: bool = False) -> SessionState | None:
        """The session's state, with the facts the parent was not told yet (all if final)."""
        assert self.middleware is not None
        try:
            session = self.middleware.session(sid)
        except KeyError:
            return None
        told = 0 if final else self.told.get(sid, (0, 0, 0, 0))[2]
        self.told[sid] = _counts(session)
        return _state(session, session.turn_facts[told:])

    def report(self, sid: str) -> None:
        """Tell the parent what changed in session ``sid`` (nothing when nothing did)."""
        assert self.middleware is not None and self.writer is not None
        try:
            session = self.middleware.session(sid)
        except KeyError:
            return
        if _counts(session) != self.told.get(sid):
            send(self.writer, ("progress", sid, self.state(sid)))

    # -- the parent's requests ---------------------------------------------------------

    def answer(self, rid: int, call: Callable[..., Any], *args: Any) -> None:
        assert self.writer is not None
        try:
            send(self.writer, ("ok", rid, call(*args)))
        except Exception as exc:
            send(self.writer, ("err", rid, portable_error(exc)))

    async def handle(self, message: tuple[Any, ...]) -> None:
        op, rid, *args = message
        assert self.writer is not None
        try:
            value = await getattr(self, op)(*args)
        except Exception as exc:
            send(self.writer, ("err", rid, portable_error(exc)))
        else:
            send(self.writer, ("ok", rid, value))

    def open(self, sid: str, kwargs: dict[str, Any]) -> str:
        assert self.middleware is not None
        token = self.middleware.open_session(sid, **kwargs)
        self.sids[token] = sid
        self.told[sid] = (0, 0, 0, 0)
        return token

    def _held(self, sid: str) -> Any:
        assert self.middleware is not None
        try:
            return self.middleware.session(sid)
        except KeyError:
            return None

    def _final(self, sid: str, held: Any) -> SessionState | None:
        """The closed session's final state (all its facts); the worker forgets it."""
        self.told.pop(sid, None)
        for token in [t for t, s in self.sids.items() if s == sid]:
            del self.sids[token]
        if held is None:
            return None
        return _state(held, held.turn_facts)

    async def finish(self, sid: str, kwargs: dict[str, Any]) -> tuple[list[Any], Any]:
        assert self.middleware is not None
        held = self._held(sid)
        samples = await self.middleware.finish_session(sid, **kwargs)
        return samples, self._final(sid, held)

    async def drop(self, sid: str) -> SessionState | None:
        assert self.middleware is not None
        held = self._held(sid)
        await self.middleware.drop_session(sid)
        return self._final(sid, held)

    async def settle(self, sid: str) -> SessionState | None:
        return self.state(sid, final=True)

    async def stats(self) -> dict[str, Any]:
        assert self.middleware is not None
        return {
            "index": self.index,
            "pid": os.getpid(),
            "sessions": len(self.told),
            "turns_timed": len(self.middleware.timings),
        }


def _counts(session: Any) -> tuple[int, int, int, int]:
    """What changes in a session that the parent mirrors (turn facts by their count)."""
    return (
        session.turns_started,
        session.turns_recorded,
        len(session.turn_facts),
        session.aborted_turns,
    )


def _state(session: Any, facts: Any) -> SessionState:
    return SessionState(
        session.turns_started,
        session.turns_recorded,
        tuple(facts),
        aborted_turns=session.aborted_turns,
    )
