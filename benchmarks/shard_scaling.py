"""Sharded middleware: saturation throughput with 1 vs N workers, and the front's cost.

1. Saturation: ``--sessions`` sessions in a closed loop (no think time, an engine that
   answers at once), each growing by ``--grow`` bytes of tool output a turn for
   ``--turns`` turns. Reported: turns/s and p50/p99 client latency, for ``workers=1``
   (the middleware in this process) and ``workers=N`` (N worker processes behind the
   front). The scripted engine and the load generator run in a child process, so this
   process does only the middleware's (or the front's) work. The middleware's CPU time
   (this process and the workers) per turn says what N cores would give on a calm machine;
   the child's own CPU share says whether the load generator kept up (near 100% of a core:
   the figures are its limit, not the middleware's). ``--repeat R`` runs R interleaved
   rounds (1 N, N 1, …) and ends with the median (min) of each figure and the scaling
   ratio, judged (>= 0.8 N) only where N workers and the child have cores of their own.
2. The front's cost: a ~``--body-mb`` MB body (refused by the worker once read, so only
   the transport is timed) sent alternately through the front and straight to its
   worker's unix socket; the difference of the medians is what the front adds a turn.

    python benchmarks/shard_scaling.py [--workers 2] [--sessions 32] [--turns 24] [--repeat 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _measure import free_cores, goal_line, load_line, median_min, process_cpu

from agentrl.serve.recipe import MiddlewareRecipe
from agentrl.serve.shards import ShardedMiddleware
from agentrl.tokenizers import qwen_tokenizer_dir

FILLER = "The quick brown fox jumps over the lazy dog; the test output reads OK. "


def _reply(body, headers):
    from agentrl.testing.scripted_engine import ScriptedReply

    return ScriptedReply(text=f"Looked at {len(body['input_ids'])} tokens; running the next step.")


def _body(messages: list[dict]) -> dict:
    return {"model": "policy", "max_tokens": 64, "messages": messages}


async def _post(http, url, token, messages, unix=None):
    started = time.perf_counter()
    async with http.post(
        f"{url}/v1/messages", json=_body(messages), headers={"x-api-key": token}
    ) as response:
        text = await response.text()
        assert response.status == 200, text
    return time.perf_counter() - started, json.loads(text)["content"][0]["text"]


async def _session(http, url, token, sid, turns, grow, latencies):
    messages = [{"role": "user", "content": f"Session {sid}: fix the bug. " + FILLER * 40}]
    for index in range(turns):
        took, reply = await _post(http, url, token, messages)
        latencies.append(took)
        messages += [
            {"role": "assistant", "content": reply},
            {"role": "user", "content": f"output {index}: " + FILLER * (grow // len(FILLER))},
        ]


async def _load(conn) -> None:
    from transformers import PreTrainedTokenizerFast

    from agentrl.testing.scripted_engine import ScriptedEngine

    tokenizer = PreTrainedTokenizerFast.from_pretrained(
        str(qwen_tokenizer_dir()), local_files_only=True
    )
    engine = ScriptedEngine(tokenizer, responder=_reply)
    await engine.start()
    conn.send(engine.url)
    loop = asyncio.get_running_loop()
    while True:
        job = await loop.run_in_executor(None, conn.recv)
        if job is None:
            break
        kind, args = job
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as http:
            if kind == "saturate":
                url, tokens, turns, grow = args
                latencies: list[float] = []
                started = time.perf_counter()
                await asyncio.gather(
                    *(
                        _session(http, url, token, sid, turns, grow, latencies)
                        for sid, token in tokens.items()
                    )
                )
                conn.send((time.perf_counter() - started, latencies))
            else:
                conn.send(await _front_cost(http, *args))
    await engine.close()


async def _front_cost(http, url, token, unix_path, direct_token, body_mb, rounds):
    """Alternate a ~``body_mb`` MB body through the front and straight to the worker.

    The body is read whole by the worker and refused at its first byte (400, not JSON),
    so the time is the transport's: the front's bytes in and out, not the turn's work.
    """
    body = b"!" + b"x" * int(body_mb * 1e6)
    front, direct = [], []
    unix = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=unix_path))
    try:
        for index in range(rounds * 2):
            via_front = index % 2 == 0
            client, base, key = (
                (http, url, token) if via_front else (unix, "http://worker", direct_token)
            )
            started = time.perf_counter()
            async with client.post(
                f"{base}/v1/messages",
                data=body,
                headers={"x-api-key": key, "Content-Type": "application/json"},
            ) as response:
                await response.read()
                assert response.status == 400, response.status
            (front if via_front else direct).append(time.perf_counter() - started)
    finally:
        await unix.close()
    return front[2:], direct[2:]


def _child(conn) -> None:
    asyncio.run(_load(conn))


def _cpu_seconds(pids) -> float:
    """User + system CPU seconds of this process and of ``pids`` so far."""
    times = os.times()
    total = times.user + times.system
    ticks = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def _pct(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _saturate(conn, recipe, workers, sessions, turns, grow, child_pid) -> dict:
    sm = ShardedMiddleware(workers=workers, build=recipe)
    await sm.start()
    try:
        tokens = {f"w{workers}-s{i}": sm.open_session(f"w{workers}-s{i}") for i in range(sessions)}
        if workers > 1:
            await asyncio.gather(*(sm.session(sid).opened for sid in tokens))
        cpu, own, driver = _cpu_seconds(sm.pids), _cpu_seconds(()), process_cpu(child_pid)
        conn.send(("saturate", (sm.url, tokens, turns, grow)))
        loop = asyncio.get_running_loop()
        took, latencies = await loop.run_in_executor(None, conn.recv)
        cpu, own = _cpu_seconds(sm.pids) - cpu, _cpu_seconds(()) - own
        driver = (process_cpu(child_pid) - driver) / took
        front = f", the front {own / len(latencies) * 1e3:.1f} ms of it" if workers > 1 else ""
        print(
            f"workers={workers}: {len(latencies)} turns in {took:.1f}s = "
            f"{len(latencies) / took:.1f} turns/s; latency p50 {_pct(latencies, 0.5) * 1e3:.0f} ms "
            f"p99 {_pct(latencies, 0.99) * 1e3:.0f} ms; middleware CPU "
            f"{cpu / len(latencies) * 1e3:.1f} ms a turn{front} ({cpu / took:.2f} cores busy); "
            f"engine + load generator {driver:.0%} of a core",
            flush=True,
        )
        return {"turns_per_s": len(latencies) / took, "driver": driver}
    finally:
        await sm.close()


async def _measure_front(conn, recipe, workers, body_mb, rounds) -> None:
    sm = ShardedMiddleware(workers=workers, build=recipe)
    await sm.start()
    try:
        token = sm.open_session("front")
        mirror = sm.session("front")
        direct_token = await mirror.opened
        unix_path = sm._shards[mirror.worker].unix_path
        conn.send(("front", (sm.url, token, unix_path, direct_token, body_mb, rounds)))
        loop = asyncio.get_running_loop()
        front, direct = await loop.run_in_executor(None, conn.recv)
        added = statistics.median(front) - statistics.median(direct)
        print(
            f"front cost for a {body_mb:g} MB body: median {statistics.median(front) * 1e3:.1f} ms via "
            f"the front vs {statistics.median(direct) * 1e3:.1f} ms direct: "
            f"+{added * 1e3:.2f} ms a turn",
            flush=True,
        )
    finally:
        await sm.close()


def _scaling(runs: dict[int, list[dict]], workers: int, free: float) -> None:
    """The median (min) turns/s of each worker count and the scaling goal, judged only where
    the workers and the child (engine + load generator) have cores of their own."""
    for count, results in runs.items():
        median, least = median_min(r["turns_per_s"] for r in results)
        print(f"workers={count}: median {median:.1f} (min {least:.1f}) turns/s over {len(results)}")
    ratio = (
        median_min(r["turns_per_s"] for r in runs[workers])[0]
        / median_min(r["turns_per_s"] for r in runs[1])[0]
    )
    busiest = max(r["driver"] for rs in runs.values() for r in rs)
    needed = workers + 1
    goal = f">= {0.8 * workers:.1f}x"
    label = f"saturation, {workers} workers vs 1: turns/s"
    if free < needed:
        why = f"{ratio:.2f}x; not measurable here ({needed} cores needed, {free:.1f} free)"
        print(goal_line(label, "n/a", f"{goal} ({why})", None))
    elif busiest >= 0.9:
        print(goal_line(label, "n/a", f"{goal} (load generator saturated: {ratio:.2f}x)", None))
    else:
        print(goal_line(label, f"{ratio:.2f}x", goal, ratio >= 0.8 * workers))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--turns", type=int, default=24)
    parser.add_argument("--grow", type=int, default=8000, help="bytes of tool output a turn")
    parser.add_argument("--body-mb", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=2, help="interleaved rounds (1 N, N 1, ...)")
    parser.add_argument("--skip-front", action="store_true")
    args = parser.parse_args()
    ours, theirs = multiprocessing.get_context("spawn").Pipe()
    child = multiprocessing.get_context("spawn").Process(target=_child, args=(theirs,))
    child.start()
    recipe = MiddlewareRecipe(
        engine="sglang",
        engine_url=ours.recv(),
        tokenizer=str(qwen_tokenizer_dir()),
        tool_parser="hermes",
        reasoning_parser="qwen3",
    )
    free = free_cores()  # before this benchmark's own load counts in the load average
    print(f"machine: {load_line()} ({free:.1f} free)", flush=True)
    runs: dict[int, list[dict]] = {1: [], args.workers: []}
    try:
        for index in range(args.repeat):
            for workers in (1, args.workers) if index % 2 == 0 else (args.workers, 1):
                runs[workers].append(
                    asyncio.run(
                        _saturate(
                            ours, recipe, workers, args.sessions, args.turns, args.grow, child.pid
                        )
                    )
                )
        _scaling(runs, args.workers, free)
        if not args.skip_front:
            asyncio.run(_measure_front(ours, recipe, args.workers, args.body_mb, args.rounds))
    finally:
        ours.send(None)
        child.join(30)


if __name__ == "__main__":
    main()
