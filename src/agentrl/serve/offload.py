"""CPU-heavy request work (JSON decoding, chat-template rendering, tokenization) off the loop.

The event loop serves every session; a 4 MiB prompt takes seconds to tokenize, so that
work runs in a bounded thread pool instead. The Rust tokenizer releases the GIL while it
encodes, and Python switches threads every few milliseconds otherwise, so the loop keeps
answering other sessions. Each session has at most one job queued or running at a time
(its turns and ``count_tokens`` calls wait their turn), so the queue holds at most one job
per open session and one session cannot take the whole pool. Each job is itself bounded by
the session's body cap (:mod:`agentrl.serve.limits`).

A job whose request body is at most :data:`INLINE_BYTES` runs on the loop instead, still
after its session's previous job: decoding, translating, rendering and (ASCII)
tokenizing are Python holding the GIL, so a thread would not let the loop run any sooner
than the job's end or the interpreter's 5 ms switch, and the hand-off cost 0.4 ms and
more a job (a 0.9 ms job took 1.3 ms in the pool). Larger bodies (a few ms of work and
up, and the Rust tokenizer's GIL-free encoding of huge prompts) go to the pool.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = ["DEFAULT_WORKERS", "INLINE_BYTES", "Offloader"]

_T = TypeVar("_T")

#: Worker threads when none is given: the CPUs plus a few (tokenizing releases the GIL).
DEFAULT_WORKERS = min(16, (os.cpu_count() or 1) + 2)
#: Request bodies up to this size are worked on the loop (about 3 ms of work at 512 KiB,
#: a Claude Code request at 128k tokens); see the module docstring.
INLINE_BYTES = 512 * 1024


class Offloader:
    """A bounded thread pool for request work, one job per key (session) at a time."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = int(workers or DEFAULT_WORKERS)
        if self.workers < 1:
            raise ValueError(f"workers: expected >= 1, got {workers}")
        self._pool: ThreadPoolExecutor | None = None
        self._gates: weakref.WeakKeyDictionary[Any, asyncio.Semaphore] = weakref.WeakKeyDictionary()

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="agentrl-render")
        return self._pool

    def _gate(self, key: Any) -> asyncio.Semaphore:
        gate = self._gates.get(key)
        if gate is None:
            gate = self._gates[key] = asyncio.Semaphore(1)
        return gate

    async def run(
        self, key: Any, fn: Callable[..., _T], *args: Any, body_bytes: int | None = None
    ) -> _T:
        """``fn(*args)`` in the pool, after ``key``'s previous job; its result or exception.

        ``body_bytes``: the size of the request the job works on; at most
        :data:`INLINE_BYTES` runs it on the loop (None: the pool). Cancelling the caller
        stops waiting; a job already running finishes in its thread (its result is
        dropped), and ``key``'s next job waits for it.
        """
        gate = self._gate(key)
        await gate.acquire()
        if body_bytes is not None and body_bytes <= INLINE_BYTES:
            try:
                return fn(*args)
            finally:
                gate.release()
        call = functools.partial(contextvars.copy_context().run, fn, *args)
        try:
            future = asyncio.get_running_loop().run_in_executor(self._executor(), call)
        except BaseException:
            gate.release()
            raise

        def done(finished: asyncio.Future[Any]) -> None:
            gate.release()
            if not finished.cancelled():
                finished.exception()  # retrieved: a dropped job's error is not "never retrieved"

        future.add_done_callback(done)
        return await asyncio.shield(future)

    def close(self) -> None:
        """Stop the pool (running jobs finish; later :meth:`run` calls start a new pool)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
