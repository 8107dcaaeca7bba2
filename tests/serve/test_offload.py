"""The request-work pool: one job per session at a time, small requests worked on the loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from agentrl.serve.offload import INLINE_BYTES, Offloader


class Key:
    """A session stand-in (the offloader keys its gates weakly)."""


@pytest.fixture
def offloader():
    pool = Offloader(workers=2)
    yield pool
    pool.close()


async def test_small_requests_run_on_the_loop_and_large_ones_in_the_pool(offloader):
    """At most INLINE_BYTES: the loop's own thread; larger or unknown: a pool thread."""
    loop_thread = threading.get_ident()
    key = Key()
    where = threading.get_ident
    assert await offloader.run(key, where, body_bytes=0) == loop_thread
    assert await offloader.run(key, where, body_bytes=INLINE_BYTES) == loop_thread
    assert await offloader.run(key, where, body_bytes=INLINE_BYTES + 1) != loop_thread
    assert await offloader.run(key, where) != loop_thread


async def test_an_inline_job_waits_for_its_sessions_job_in_the_pool(offloader):
    """One session's jobs never overlap: a small request's job waits for the large one
    still running in the pool; another session's small job does not wait."""
    release, order = threading.Event(), []
    session, other = Key(), Key()

    def slow():
        release.wait(5)
        order.append("slow")

    big = asyncio.ensure_future(offloader.run(session, slow, body_bytes=INLINE_BYTES * 4))
    await asyncio.sleep(0.05)
    small = asyncio.ensure_future(offloader.run(session, order.append, "small", body_bytes=10))
    await offloader.run(other, order.append, "other", body_bytes=10)
    await asyncio.sleep(0.05)
    assert order == ["other"] and not small.done()
    release.set()
    await asyncio.gather(big, small)
    assert order == ["other", "slow", "small"]


async def test_an_inline_jobs_error_reaches_the_caller_and_frees_the_session(offloader):
    """The exception is the caller's; the session's next job runs."""
    key = Key()

    def fail():
        raise ValueError("bad body")

    with pytest.raises(ValueError, match="bad body"):
        await offloader.run(key, fail, body_bytes=1)
    assert await asyncio.wait_for(offloader.run(key, lambda: 7, body_bytes=1), 1) == 7
