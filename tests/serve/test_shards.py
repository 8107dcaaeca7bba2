"""The sharded middleware: real worker processes, real HTTP, the scripted SGLang server."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import aiohttp
import attrs
import pytest
from shard_support import alive, child_pids, conversation, failing_build, recipe, scripted, turn

from agentrl.serve.recipe import check_shardable
from agentrl.serve.shards import ShardedMiddleware, ShardSession, WorkerDiedError

SIDS = [f"s{i}" for i in range(4)]


def sample_rows(samples) -> list[tuple]:
    return [(s.tokens, s.prompt_length, s.loss_mask, s.rollout_logprobs, s.reward) for s in samples]


async def run_sessions(workers, tokenizer, tokenizer_dir) -> tuple[dict, dict]:
    """The same four sessions, turn by turn in one order: samples and serving pids by sid."""
    async with scripted(tokenizer) as engine:
        sm = ShardedMiddleware(workers=workers, build=recipe(engine.url, tokenizer_dir))
        url = await sm.start()
        try:
            tokens = {sid: sm.open_session(sid) for sid in SIDS}
            pids = {}
            async with aiohttp.ClientSession() as http:
                for sid in SIDS:
                    pids[sid] = await conversation(http, url, tokens[sid], sid, turns=3)
            samples = {sid: await sm.finish_session(sid, reward=0.5) for sid in SIDS}
        finally:
            await sm.close()
    return samples, pids


@pytest.mark.slow
async def test_two_workers_give_the_samples_one_gives_and_keep_sessions_sticky(
    agentrl_qwen_tokenizer, agentrl_qwen_tokenizer_dir
):
    """Four sessions of three turns give identical samples in-process and over two workers,
    every turn of a session is served by one worker process, and both workers serve."""
    one, one_pids = await run_sessions(1, agentrl_qwen_tokenizer, agentrl_qwen_tokenizer_dir)
    two, two_pids = await run_sessions(2, agentrl_qwen_tokenizer, agentrl_qwen_tokenizer_dir)
    assert {sid: sample_rows(s) for sid, s in two.items()} == {
        sid: sample_rows(s) for sid, s in one.items()
    }
    assert all(len(one[sid]) >= 1 for sid in SIDS)
    assert set(one_pids["s0"]) == {"in-process"}  # workers=1: no worker process
    for sid in SIDS:
        assert len(set(two_pids[sid])) == 1, two_pids
    assert len({p[0] for p in two_pids.values()}) == 2
    assert str(os.getpid()) not in {p[0] for p in two_pids.values()}


@pytest.fixture
async def sharded(agentrl_qwen_tokenizer, agentrl_qwen_tokenizer_dir):
    """Two workers in front of a scripted engine (replies after ``engine.delay`` seconds)."""
    async with scripted(agentrl_qwen_tokenizer) as engine:
        sm = ShardedMiddleware(workers=2, build=recipe(engine.url, agentrl_qwen_tokenizer_dir))
        await sm.start()
        try:
            yield sm
        finally:
            await sm.close()


@pytest.mark.slow
async def test_mirror_streaming_stats_and_errors(sharded):
    """The parent's mirror follows the worker (counters, facts, settle), SSE streams through
    the front, each worker counts its own sessions, a closed token gets the worker's 403 and
    an unknown one its 401."""
    sm = sharded
    tokens = {sid: sm.open_session(sid) for sid in ("a", "b")}
    async with aiohttp.ClientSession() as http:
        await conversation(http, sm.url, tokens["a"], "a", turns=2)
        status, headers, text = await turn(
            http, sm.url, tokens["b"], [{"role": "user", "content": "stream"}], stream=True
        )
        assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
        assert "event: message_stop" in text and "Reply to a prompt of" in text
        mirror = await sm.settle("a")
        assert isinstance(mirror, ShardSession)
        assert (mirror.turns_started, mirror.turns_recorded, len(mirror.turn_facts)) == (2, 2, 2)
        stats = await sm.stats()
        assert sorted(s["sessions"] for s in stats) == [1, 1]
        assert {s["pid"] for s in stats} == set(sm.pids)
        samples = await sm.finish_session("a", reward=1.0)
        assert samples and samples[0].reward == 1.0 and mirror.closed
        status, _, text = await turn(http, sm.url, tokens["a"], [{"role": "user", "content": "x"}])
        assert status == 403 and json.loads(text)["error"]["type"] == "permission_error"
        status, _, text = await turn(http, sm.url, "nope", [{"role": "user", "content": "x"}])
        assert status == 401 and json.loads(text)["type"] == "error"
    with pytest.raises(ValueError, match="already open"):
        sm.open_session("b")
    with pytest.raises(KeyError):
        sm.session("a")


@pytest.mark.slow
async def test_a_killed_worker_fails_its_sessions_and_spares_the_others(sharded):
    """SIGKILL one worker: its session's requests get a prompt 502, finish_session raises
    WorkerDiedError, drop is a no-op, the other worker's session still serves and finishes,
    and close() leaves no child process."""
    sm = sharded
    tokens = {sid: sm.open_session(sid) for sid in ("x", "y")}
    victim, survivor = sm.session("x"), sm.session("y")
    assert victim.worker != survivor.worker
    async with aiohttp.ClientSession() as http:
        await conversation(http, sm.url, tokens["x"], "x", turns=1)
        os.kill(sm.pids[victim.worker], signal.SIGKILL)
        for _ in range(200):  # the parent notices within 10 s (in practice, at once)
            if victim.lost is not None:
                break
            await asyncio.sleep(0.05)
        assert victim.lost is not None and "is gone" in victim.lost
        started = time.monotonic()
        status, _, text = await turn(http, sm.url, tokens["x"], [{"role": "user", "content": "?"}])
        assert status == 502 and "gone" in json.loads(text)["error"]["message"]
        assert time.monotonic() - started < 2
        await conversation(http, sm.url, tokens["y"], "y", turns=1)
    with pytest.raises(WorkerDiedError):
        await sm.finish_session("x", reward=0.0)
    await sm.drop_session("x")
    assert await sm.finish_session("y", reward=0.0)
    for index in range(3):  # new sessions go to the live worker only
        sm.open_session(f"new{index}")
        assert sm.session(f"new{index}").worker == survivor.worker
    pids = sm.pids
    await sm.close()
    assert not any(alive(pid) for pid in pids)
    assert not (child_pids() & set(pids))


@pytest.mark.slow
async def test_close_with_sessions_and_a_turn_in_flight_leaves_no_worker(
    agentrl_qwen_tokenizer, agentrl_qwen_tokenizer_dir
):
    """close() while sessions are open and a turn waits on a slow engine: the client's
    request ends, close returns within its bound, and no worker process remains."""
    from agentrl.testing.scripted_engine import ScriptedReply

    async with scripted(
        agentrl_qwen_tokenizer, responder=lambda body, headers: ScriptedReply(text="late", delay=30)
    ) as engine:
        sm = ShardedMiddleware(workers=2, build=recipe(engine.url, agentrl_qwen_tokenizer_dir))
        await sm.start()
        pids = sm.pids
        tokens = [sm.open_session(f"open{i}") for i in range(3)]
        async with aiohttp.ClientSession() as http:
            pending = asyncio.create_task(
                turn(http, sm.url, tokens[0], [{"role": "user", "content": "slow"}])
            )
            await engine.wait_for(lambda: engine.generate_requests, timeout=20)
            started = time.monotonic()
            await sm.close()
            assert time.monotonic() - started < 15
            try:
                status, _, _ = await asyncio.wait_for(pending, 10)
            except aiohttp.ClientError:
                status = None  # the connection was cut: as good as a 5xx
            assert status is None or status >= 500
    assert not any(alive(pid) for pid in pids)
    assert not (child_pids() & set(pids))


@pytest.mark.slow
async def test_a_turn_that_failed_on_engine_aborts_reaches_the_parents_mirror(
    agentrl_qwen_tokenizer, agentrl_qwen_tokenizer_dir
):
    """A worker's turn the engine aborted ``max_engine_aborts`` times is a 503, and the
    session's ``aborted_turns`` reaches the parent's mirror without a settle (what slime's
    rollout loop reads while the rollout runs) and stays in its final state."""
    from agentrl.testing.scripted_engine import ScriptedReply

    def aborted(body, headers):
        return ScriptedReply(ids=[9707, 11], finish_reason="abort")

    async with scripted(agentrl_qwen_tokenizer, responder=aborted) as engine:
        build = attrs.evolve(
            recipe(engine.url, agentrl_qwen_tokenizer_dir), middleware={"max_engine_aborts": 2}
        )
        sm = ShardedMiddleware(workers=2, build=build)
        await sm.start()
        try:
            token = sm.open_session("drained")
            mirror = sm.session("drained")
            async with aiohttp.ClientSession() as http:
                status, _, text = await turn(
                    http, sm.url, token, [{"role": "user", "content": "hi"}]
                )
            assert status == 503 and "2 times in a row" in text
            assert len(engine.generate_requests) == 2
            for _ in range(200):  # the worker's progress message, read by the parent's loop
                if mirror.aborted_turns:
                    break
                await asyncio.sleep(0.05)
            assert (mirror.turns_started, mirror.turns_recorded, mirror.aborted_turns) == (1, 0, 1)
            await sm.finish_session("drained", reward=0.0)
            assert mirror.aborted_turns == 1 and mirror.closed
        finally:
            await sm.close()


async def test_a_build_that_fails_raises_from_start_and_leaves_no_worker():
    """The worker's build error reaches start() as itself; no worker process is left."""
    before = child_pids()
    sm = ShardedMiddleware(workers=2, build=failing_build)
    with pytest.raises(ValueError, match="cannot be built"):
        await sm.start()
    assert child_pids() - before == set()


async def test_an_unpicklable_build_is_refused_before_any_process_starts():
    """A lambda cannot reach a spawned worker: start() says so and starts nothing."""
    sm = ShardedMiddleware(workers=2, build=lambda: None)
    with pytest.raises(TypeError, match="picklable"):
        await sm.start()
    assert sm.pids == []


def test_in_process_engines_cannot_be_sharded():
    """--workers 2 with the transformers engine is a clear error; sglang and 1 worker are fine."""
    with pytest.raises(ValueError, match="cannot be shared by worker processes"):
        check_shardable("transformers", 2)
    check_shardable("transformers", 1)
    check_shardable("sglang", 4)
    with pytest.raises(ValueError, match="workers"):
        ShardedMiddleware(workers=0, build=failing_build)


@pytest.mark.slow
def test_the_parent_loads_no_tokenizer_for_its_workers(agentrl_qwen_tokenizer_dir):
    """Starting two workers that each load the Qwen tokenizer leaves transformers and torch
    out of the parent process (a fresh interpreter, so nothing else loaded them)."""
    code = (
        "import asyncio, sys\n"
        "from agentrl.serve.recipe import MiddlewareRecipe\n"
        "from agentrl.serve.shards import ShardedMiddleware\n"
        "async def main():\n"
        f"    recipe = MiddlewareRecipe(engine_url='http://127.0.0.1:9', tokenizer={str(agentrl_qwen_tokenizer_dir)!r})\n"
        "    sm = ShardedMiddleware(workers=2, build=recipe)\n"
        "    await sm.start()\n"
        "    await sm.close()\n"
        "    print(sorted(m for m in sys.modules if m.split('.')[0] in {'transformers', 'torch', 'tokenizers'}))\n"
        "if __name__ == '__main__':\n"
        "    asyncio.run(main())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"
