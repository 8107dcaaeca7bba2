"""Sessions sharded across sticky worker processes, behind one address.

::

    sm = ShardedMiddleware(workers=4, build=build)   # build: picklable, zero-arg -> Middleware
    url = await sm.start(host="127.0.0.1", port=0, unix_path=None)
    token = sm.open_session(sid, sampling_defaults={...}, max_context_tokens=0)
    sm.session(sid)              # the parent's mirror: turns_started/recorded, turn_facts
    await sm.settle(sid)         # ... brought up to date by the session's worker
    samples = await sm.finish_session(sid, reward=1.0)     # -> list[TrainingSample]
    await sm.drop_session(sid); await sm.stats(); sm.pids; await sm.close()

One Python process renders, tokenizes and records every session's turns on one core, so
a long render delays every other session and throughput stops at one core. Here each
worker is a process (``spawn`` context) that calls ``build()`` once and serves its own
:class:`~agentrl.serve.middleware.Middleware` on a unix socket
(:mod:`agentrl.serve.shard_worker`). A session is given to the worker with the fewest
open sessions when it opens and stays there: all its turns run in that process. The
parent's front (:mod:`agentrl.serve.shard_proxy`) forwards each request by its token,
bytes only. Session requests (open, finish, drop) go to the owning worker over a pipe
(:mod:`agentrl.serve.shard_wire`); ``session(sid)`` is the parent's mirror of the
session's counters and turn facts, which the worker sends after every request.

``workers=1`` builds the middleware in this process and serves it directly (no front,
no extra process): ``session(sid)`` is then the middleware's own session.

Faults: a worker that dies fails its sessions at once (requests get 502,
``finish_session`` raises :class:`WorkerDiedError`, ``drop_session`` is a no-op) and the
others keep serving. ``close()`` asks every worker to close, then terminates and kills
what is still alive, so no worker outlives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import pathlib
import pickle
import shutil
import tempfile
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from agentrl.serve import shard_worker
from agentrl.serve.limits import SERVER_ARGS
from agentrl.serve.probes import server_logger
from agentrl.serve.sessions import CLOSED_TOKENS_KEPT, SAMPLING_POLICIES, new_token
from agentrl.serve.shard_handle import CALL_TIMEOUT, ShardSession, WorkerDiedError, WorkerHandle
from agentrl.serve.shard_proxy import front_app
from agentrl.trajectory import TrainingSample

if TYPE_CHECKING:
    from agentrl.serve.middleware import Middleware
    from agentrl.serve.sessions import Session

__all__ = ["ShardSession", "ShardedMiddleware", "WorkerDiedError"]

logger = logging.getLogger(__name__)

#: Seconds a worker may take to build its middleware and start serving.
START_TIMEOUT = 600.0
#: Seconds ``close()`` waits for a worker to exit before terminating it.
CLOSE_TIMEOUT = 30.0


class ShardedMiddleware:
    """Sessions served by ``workers`` processes, each session by one of them (sticky)."""

    def __init__(
        self,
        *,
        workers: int,
        build: Callable[[], Middleware],
        start_timeout: float = START_TIMEOUT,
        close_timeout: float = CLOSE_TIMEOUT,
    ) -> None:
        if int(workers) < 1:
            raise ValueError(f"workers: expected >= 1, got {workers}")
        self.workers = int(workers)
        self.build = build
        self.start_timeout = start_timeout
        self.close_timeout = close_timeout
        self.url: str | None = None
        self.unix_path: str | None = None
        #: the in-process middleware (``workers=1``)
        self.local: Middleware | None = None
        self._shards: list[WorkerHandle] = []
        self._open: dict[str, ShardSession] = {}
        #: client token -> session: open ones, then the latest closed (bounded)
        self._tokens: dict[str, ShardSession] = {}
        self._runner: web.AppRunner | None = None
        self._dir: str | None = None

    @property
    def pids(self) -> list[int]:
        """The worker processes' ids (empty with ``workers=1``)."""
        return [s.process.pid for s in self._shards]

    # -- lifecycle ---------------------------------------------------------------------

    async def start(
        self, host: str | None = "127.0.0.1", port: int = 0, unix_path: str | None = None
    ) -> str:
        """Start the workers, then listen like ``Middleware.start``; returns the URL.

        A worker that fails to build or start raises its error here, with every worker
        stopped.
        """
        if self.local is not None or self._shards:
            raise RuntimeError("the middleware is already started; call close() first")
        if self.workers == 1:
            self.local = self.build()
            url = await self.local.start(host=host, port=port, unix_path=unix_path)
            self.url, self.unix_path = self.local.url, self.local.unix_path
            return url
        if host is None and unix_path is None:
            raise ValueError("start() needs a host, a unix_path or both")
        try:
            pickle.dumps(self.build)
        except Exception as exc:
            raise TypeError(
                f"build must be picklable (a module-level function or functools.partial of "
                f"one) to reach the worker processes: {exc}"
            ) from None
        try:
            await self._start_workers()
            self._runner = await self._start_front(host, port, unix_path)
        except BaseException:
            await self.close()
            raise
        return self.url or f"unix:{self.unix_path}"

    async def _start_workers(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._dir = tempfile.mkdtemp(prefix="agentrl-shards-")
        for index in range(self.workers):
            path = str(pathlib.Path(self._dir) / f"w{index}.sock")
            ours, theirs = context.Pipe(duplex=True)
            process = context.Process(
                target=shard_worker.main,
                args=(
                    self.build,
                    index,
                    theirs,
                    path,
                    logging.getLogger("agentrl").getEffectiveLevel(),
                ),
                name=f"agentrl-middleware-{index}",
                daemon=True,
            )
            process.start()
            theirs.close()
            shard = WorkerHandle(index, process, path)
            self._shards.append(shard)
            await shard.attach(ours)
        async with asyncio.timeout(self.start_timeout):
            await asyncio.gather(*(s.ready for s in self._shards))
        for shard in self._shards:
            connector = aiohttp.UnixConnector(path=shard.unix_path, limit=0)
            shard.client = aiohttp.ClientSession(
                connector=connector,
                base_url="http://agentrl-worker",
                auto_decompress=False,
                timeout=aiohttp.ClientTimeout(total=None),
                skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept", "Content-Type"),
            )
        logger.info("middleware workers up: pids %s", [s.pid for s in self._shards])

    async def _start_front(
        self, host: str | None, port: int, unix_path: str | None
    ) -> web.AppRunner:
        runner = web.AppRunner(
            front_app(self._route),
            handler_cancellation=True,
            access_log=None,
            auto_decompress=False,
            shutdown_timeout=5.0,
            logger=server_logger(),
            **SERVER_ARGS,
        )
        await runner.setup()
        try:
            if host is not None:
                site = web.TCPSite(runner, host, port)
                await site.start()
                bound = site._server.sockets[0].getsockname()  # type: ignore[union-attr]
                shown = f"[{host}]" if ":" in host else host
                self.url = f"http://{shown}:{bound[1]}"
            if unix_path is not None:
                await web.UnixSite(runner, unix_path).start()
                self.unix_path = unix_path
        except BaseException:
            await runner.cleanup()
            self.url = self.unix_path = None
            raise
        return runner

    async def close(self) -> None:
        """Drop every session, stop the front and every worker (none outlives this)."""
        if self.local is not None:
            local, self.local = self.local, None
            await local.close()
            return
        # The workers first: closing one cancels its in-flight turns, which ends the front's
        # forwarded requests, so the front then stops at once.
        shards, self._shards = self._shards, []
        await asyncio.gather(*(s.stop(self.close_timeout) for s in shards), return_exceptions=True)
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        for mirror in self._open.values():
            mirror.closed = True
        self._open.clear()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    async def __aenter__(self) -> ShardedMiddleware:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- sessions ----------------------------------------------------------------------

    def open_session(
        self,
        sid: str,
        *,
        sampling_defaults: Mapping[str, Any] | None = None,
        max_context_tokens: int = 0,
        max_turns: int | None = None,
        sampling_policy: str = "trainer",
    ) -> str:
        """Open session ``sid`` on the least busy live worker; return its client token."""
        kwargs = {
            "sampling_defaults": dict(sampling_defaults or {}),
            "max_context_tokens": int(max_context_tokens or 0),
            "max_turns": max_turns,
            "sampling_policy": sampling_policy,
        }
        if self.local is not None:
            return self.local.open_session(sid, **kwargs)
        if sampling_policy not in SAMPLING_POLICIES:
            raise ValueError(
                f"sampling_policy: expected one of {SAMPLING_POLICIES}, got {sampling_policy!r}"
            )
        if max_turns is not None and max_turns < 0:
            raise ValueError(f"max_turns: expected None or >= 0, got {max_turns}")
        if sid in self._open:
            raise ValueError(f"session {sid!r} is already open; session ids must be unique")
        live = [s for s in self._shards if s.dead is None]
        if not live:
            raise WorkerDiedError("no middleware worker is running (start() it, or all died)")
        shard = min(live, key=lambda s: len(s.sessions))
        mirror = ShardSession(sid=sid, token=new_token(), worker=shard.index)
        mirror.opened = shard.request("open", sid, kwargs)
        mirror.opened.add_done_callback(_retrieved)
        shard.sessions[sid] = mirror
        self._open[sid] = mirror
        self._tokens[mirror.token] = mirror
        return mirror.token

    def session(self, sid: str) -> Session | ShardSession:
        """The open session ``sid`` (the parent's mirror with workers); KeyError otherwise."""
        if self.local is not None:
            return self.local.session(sid)
        try:
            return self._open[sid]
        except KeyError:
            raise KeyError(f"no open session {sid!r}; open it with open_session()") from None

    async def settle(self, sid: str) -> Session | ShardSession:
        """The session ``sid`` with everything its finished requests recorded."""
        mirror = self.session(sid)
        if isinstance(mirror, ShardSession) and mirror.lost is None:
            shard = self._shards[mirror.worker]
            mirror.apply(await shard.call("settle", sid), final=True)
        return mirror

    def _close(self, sid: str) -> tuple[WorkerHandle, ShardSession] | None:
        mirror = self._open.pop(sid, None)
        if mirror is None:
            return None
        mirror.closed = True
        shard = self._shards[mirror.worker]
        shard.sessions.pop(sid, None)
        self._tokens.pop(mirror.token, None)
        self._tokens[mirror.token] = mirror  # kept, so its client gets the worker's 403
        if len(self._tokens) > CLOSED_TOKENS_KEPT + len(self._open):
            for token, old in list(self._tokens.items())[: len(self._tokens) // 8]:
                if old.closed:
                    del self._tokens[token]
        return shard, mirror

    async def finish_session(
        self,
        sid: str,
        *,
        reward: float,
        metadata: Mapping[str, Any] | None = None,
        wait_timeout: float = 30.0,
        max_sample_tokens: int | None = None,
    ) -> list[TrainingSample]:
        """Close ``sid`` on its worker and return its training samples.

        Raises :class:`WorkerDiedError` when the session's worker is gone.
        """
        kwargs = {
            "reward": reward,
            "metadata": dict(metadata or {}),
            "wait_timeout": wait_timeout,
            "max_sample_tokens": max_sample_tokens,
        }
        if self.local is not None:
            return await self.local.finish_session(sid, **kwargs)
        closed = self._close(sid)
        if closed is None:
            return []
        shard, mirror = closed
        if mirror.lost is not None:
            raise WorkerDiedError(mirror.lost)
        samples, state = await shard.call(
            "finish", sid, kwargs, timeout=wait_timeout + CALL_TIMEOUT
        )
        mirror.apply(state, final=True)
        return list(samples)

    async def drop_session(self, sid: str) -> None:
        """Close ``sid``, cancel its in-flight turn and forget it (idempotent; never raises
        for a lost session)."""
        if self.local is not None:
            await self.local.drop_session(sid)
            return
        closed = self._close(sid)
        if closed is None:
            return
        shard, mirror = closed
        if mirror.lost is None:
            with contextlib.suppress(WorkerDiedError):
                mirror.apply(await shard.call("drop", sid), final=True)

    async def stats(self) -> list[dict[str, Any]]:
        """Each live worker's own account: index, pid, open sessions, turns timed."""
        if self.local is not None:
            return []
        live = [s for s in self._shards if s.dead is None]
        return list(await asyncio.gather(*(s.call("stats") for s in live)))

    # -- the front's routing -----------------------------------------------------------

    def _session_of(self, headers: Mapping[str, str]) -> tuple[ShardSession | None, str]:
        """The session a request names, as the middleware authenticates: the first token
        (Bearer, then x-api-key) of an open session, else the first of a closed one."""
        auth = headers.get("Authorization", "")
        bearer = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        found = [
            (m, t)
            for t in (bearer, headers.get("x-api-key", "").strip())
            if t and (m := self._tokens.get(t)) is not None
        ]
        for mirror, token in found:
            if not mirror.closed:
                return mirror, token
        return found[0] if found else (None, "")

    async def _route(self, headers: Any) -> tuple[aiohttp.ClientSession | None, Any, bool]:
        """The worker's pool, the headers to send (the worker's token put in) and whether
        the body goes too (not for a request its worker will refuse: 401, 403)."""
        mirror, token = self._session_of(headers)
        if mirror is None:
            live = [s for s in self._shards if s.dead is None]
            if not live:
                return None, "no agentrl middleware worker is running", False
            return live[0].client, headers, False
        if mirror.lost is not None:
            return None, mirror.lost, False
        assert mirror.opened is not None
        try:
            theirs = await mirror.opened
        except Exception as exc:
            return None, f"session {mirror.sid!r} could not be opened on its worker: {exc}", False
        sent = headers.copy()
        for key in ("Authorization", "x-api-key"):
            value = sent.get(key)
            if value is not None and token in value:
                sent[key] = value.replace(token, theirs)
        return self._shards[mirror.worker].client, sent, not mirror.closed


def _retrieved(future: asyncio.Future[Any]) -> None:
    """Mark a fire-and-forget future's exception as seen (it is re-raised where awaited)."""
    if not future.cancelled():
        future.exception()
