"""Middleware benchmarks: per-turn overhead, 256 concurrent sessions, token yield.

1. Overhead: a Claude-Code-shaped session (Claude Code 2.1.332's real system prompt and
   tools, from the captured fixtures) grows turn by turn to 128k tokens through the real
   HTTP middleware and a scripted SGLang engine. Overhead is everything but the engine's
   own time (body parsing, translation, rendering, parsing, reply, recording). The same
   session is run again with ``incremental_render=False``, which re-renders and
   re-tokenizes the whole prompt every turn as slime's adapters do; the ratio is reported
   at 16k, 32k, 64k and 128k tokens.
2. Concurrency: 256 sessions (same system prompt and tools, a few turns each) at once. The
   scripted engine and the load generator run in a child process, so the middleware's
   process does only its own work. Reported: turns/s, p50/p99 added latency (client
   latency minus engine time), and resident memory per session.
3. Token yield: trained tokens / sampled tokens over a Claude-Code-shaped session with
   reasoning under the Qwen3 template, which drops earlier turns' thinking once a user
   message follows them, so re-rendered prompts drift from what was sampled.

    python benchmarks/middleware.py [--max-tokens 131072] [--sessions 256] [--turns 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FIXTURE = (
    REPO.parent / "shared" / "fixtures" / "clients" / "claude_code" / "001_post_v1_messages.json"
)
TEMPLATE = REPO / "tests" / "data" / "qwen3_chat_template.jinja"
SIZES = (16_384, 32_768, 65_536, 131_072)


def load_tokenizer():
    from agentrl.tokenizers import build_qwen_tokenizer

    return build_qwen_tokenizer(chat_template=TEMPLATE.read_text())


def base_body() -> dict[str, Any]:
    if not FIXTURE.is_file():
        sys.exit(f"captured Claude Code request not found at {FIXTURE} (shared/ beside the clone)")
    body = json.loads(FIXTURE.read_text())["body"]
    return {**body, "stream": False}


def source_file(index: int, lines: int = 120) -> str:
    """Code-like tool output of roughly 1.5-2k tokens, different for every index."""
    out = [f'"""Module {index}: helpers for the data pipeline."""', "", "import os", ""]
    for i in range(lines // 6):
        name = f"handle_{index}_{i}"
        out += [
            f"def {name}(record, limit={i + index % 7}):",
            f"    # step {i}: normalise field_{i} and check bounds",
            f"    value = record.get('field_{i}', {i * index % 97})",
            "    if value > limit:",
            f"        raise ValueError(f'{name}: {{value}} exceeds {{limit}}')",
            f"    return os.path.join('out', str(value), '{name}.json')",
        ]
    return "\n".join(out)


def tool_call_text(index: int, reasoning: bool) -> str:
    call = {
        "name": "Bash",
        "arguments": {
            "command": f"cat src/module_{index}.py",
            "description": f"Show module {index}",
        },
    }
    text = f"Let me read module {index}.\n<tool_call>\n{json.dumps(call)}\n</tool_call>"
    if reasoning:
        text = f"<think>\nModule {index - 1} looked fine; next I check module {index}.\n</think>\n\n{text}"
    return text


def responder_for(tokenizer, reasoning: bool):
    """A scripted-engine responder that answers each session's turn k with a tool call."""
    from agentrl.testing.scripted_engine import ScriptedReply

    counters: dict[str, int] = {}

    def respond(body, headers):
        key = headers.get("X-SMG-Routing-Key", "")
        counters[key] = counters.get(key, 0) + 1
        return ScriptedReply(text=tool_call_text(counters[key], reasoning))

    return respond


def make_middleware(engine, tokenizer, **options: Any):
    """The benchmarked middleware: Anthropic Messages, Qwen3's parsers."""
    from agentrl.adapters.middleware import Middleware

    return Middleware(
        engine=engine,
        tokenizer=tokenizer,
        tool_parser="hermes",
        reasoning_parser="qwen3",
        adapters=["anthropic"],
        **options,
    )


async def drive_session(http, url, token, *, turns=None, until_tokens=None, reminder_every=0):
    """Play a Claude-Code-like client: replay each reply, answer its tool call with a file."""
    body = base_body()
    messages = list(body["messages"])
    headers = {"Authorization": f"Bearer {token}"}
    latencies = []
    turn = 0
    while True:
        turn += 1
        started = time.perf_counter()
        async with http.post(
            f"{url}/v1/messages", json={**body, "messages": messages}, headers=headers
        ) as r:
            reply = await r.json()
            if r.status != 200:
                raise RuntimeError(f"middleware answered {r.status}: {reply}")
        latencies.append(time.perf_counter() - started)
        call = next(b for b in reply["content"] if b["type"] == "tool_use")
        result: list[dict[str, Any]] = [
            {"type": "tool_result", "tool_use_id": call["id"], "content": source_file(turn)}
        ]
        if reminder_every and turn % reminder_every == 0:
            result.append(
                {
                    "type": "text",
                    "text": "<system-reminder>\nKeep the todo list current.\n</system-reminder>",
                }
            )
        messages += [
            {"role": "assistant", "content": reply["content"]},
            {"role": "user", "content": result},
        ]
        if turns is not None and turn >= turns:
            return latencies
        if until_tokens is not None and reply["usage"]["input_tokens"] >= until_tokens:
            return latencies


async def overhead_run(tokenizer, *, incremental: bool, max_tokens: int) -> list[Any]:
    import aiohttp

    from agentrl.engines.sglang import SGLangEngine
    from agentrl.testing.scripted_engine import ScriptedEngine

    async with ScriptedEngine(tokenizer, responder=responder_for(tokenizer, False)) as scripted:
        engine = SGLangEngine(scripted.url)
        mw = make_middleware(engine, tokenizer, incremental_render=incremental)
        await mw.start()
        try:
            token = mw.open_session("grow")
            async with aiohttp.ClientSession(trust_env=False) as http:
                await drive_session(http, mw.url, token, until_tokens=max_tokens)
            samples = await mw.finish_session("grow", reward=1.0)
            assert len(samples) == 1, "the growing session must stay one chain"
            return list(mw.timings)
        finally:
            await mw.close()
            await engine.aclose()


def at_size(timings, size: int) -> float:
    """Median overhead of the 3 turns whose prompts are closest to ``size`` tokens."""
    nearest = sorted(timings, key=lambda t: abs(t.prompt_tokens - size))[:3]
    return statistics.median(t.overhead_seconds for t in nearest)


def bench_overhead(tokenizer, max_tokens: int) -> dict[str, Any]:
    ours = asyncio.run(overhead_run(tokenizer, incremental=True, max_tokens=max_tokens))
    full = asyncio.run(overhead_run(tokenizer, incremental=False, max_tokens=max_tokens))
    rows = []
    for size in (s for s in SIZES if s <= max_tokens):
        a, b = at_size(ours, size), at_size(full, size)
        rows.append(
            {"tokens": size, "incremental_ms": a * 1e3, "full_render_ms": b * 1e3, "ratio": b / a}
        )
    return {"turns": len(ours), "rows": rows}


# -- concurrency ----------------------------------------------------------------------


def _load_child(conn, sessions: int, turns: int) -> None:
    asyncio.run(_load_main(conn, sessions, turns))


async def _load_main(conn, sessions: int, turns: int) -> None:
    import aiohttp

    from agentrl.testing.scripted_engine import ScriptedEngine

    tokenizer = load_tokenizer()
    async with ScriptedEngine(tokenizer, responder=responder_for(tokenizer, False)) as scripted:
        conn.send(scripted.url)
        url, tokens = await asyncio.get_running_loop().run_in_executor(None, conn.recv)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(trust_env=False, connector=connector) as http:
            started = time.perf_counter()
            results = await asyncio.gather(
                *(drive_session(http, url, token, turns=turns) for token in tokens)
            )
            wall = time.perf_counter() - started
    conn.send({"latencies": results, "wall": wall})


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


async def concurrency_run(tokenizer, sessions: int, turns: int) -> dict[str, Any]:
    from agentrl.engines.sglang import SGLangEngine

    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=_load_child, args=(child, sessions, turns))
    process.start()
    loop = asyncio.get_running_loop()
    engine_url = await loop.run_in_executor(None, parent.recv)
    engine = SGLangEngine(engine_url)
    mw = make_middleware(engine, tokenizer)
    await mw.start()
    try:
        before = rss_bytes()
        tokens = [mw.open_session(f"load-{i}") for i in range(sessions)]
        parent.send((mw.url, tokens))
        report = await loop.run_in_executor(None, parent.recv)
        held = rss_bytes() - before
        stats = [mw.trajectory.session_stats(f"load-{i}") for i in range(sessions)]
        engine_time = {(t.session_id, t.turn_index): t.engine_seconds for t in mw.timings}
        added = []
        for i, latencies in enumerate(report["latencies"]):
            for k, latency in enumerate(latencies):
                added.append(latency - engine_time[(f"load-{i}", k)])
        added.sort()
        total = sessions * turns
        return {
            "sessions": sessions,
            "turns": total,
            "turns_per_s": total / report["wall"],
            "p50_ms": added[len(added) // 2] * 1e3,
            "p99_ms": added[min(len(added) - 1, int(len(added) * 0.99))] * 1e3,
            "rss_per_session_kb": held / sessions / 1024,
            "trajectory_per_session_kb": statistics.mean(s.held_bytes for s in stats) / 1024,
            "prompt_tokens": max(t.prompt_tokens for t in mw.timings),
        }
    finally:
        await mw.close()
        await engine.aclose()
        process.join(timeout=30)


# -- token yield ----------------------------------------------------------------------


async def yield_run(tokenizer, turns: int, reminder_every: int) -> dict[str, Any]:
    import aiohttp

    from agentrl.engines.sglang import SGLangEngine
    from agentrl.testing.scripted_engine import ScriptedEngine

    async with ScriptedEngine(tokenizer, responder=responder_for(tokenizer, True)) as scripted:
        engine = SGLangEngine(scripted.url)
        mw = make_middleware(engine, tokenizer)
        await mw.start()
        try:
            token = mw.open_session("yield")
            async with aiohttp.ClientSession(trust_env=False) as http:
                await drive_session(http, mw.url, token, turns=turns, reminder_every=reminder_every)
            samples = await mw.finish_session("yield", reward=1.0)
            sampled = sum(len(g.output_ids) for g in scripted.served)
            trained = sum(sum(s.loss_mask) for s in samples)
            return {
                "turns": turns,
                "samples": len(samples),
                "sampled_tokens": sampled,
                "trained_tokens": trained,
                "yield": trained / sampled,
                "realigned_turns": sum(len(s.metadata["realigned_turns"]) for s in samples),
            }
        finally:
            await mw.close()
            await engine.aclose()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-tokens", type=int, default=SIZES[-1])
    parser.add_argument("--sessions", type=int, default=256)
    parser.add_argument("--turns", type=int, default=4, help="turns per concurrent session")
    parser.add_argument("--yield-turns", type=int, default=24)
    parser.add_argument(
        "--reminder-every",
        type=int,
        nargs="+",
        default=[1, 4],
        help="every Nth tool result also carries a user text block",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)

    tokenizer = load_tokenizer()
    started = time.perf_counter()
    overhead = bench_overhead(tokenizer, args.max_tokens)
    concurrency = asyncio.run(concurrency_run(tokenizer, args.sessions, args.turns))
    token_yield = [
        {**asyncio.run(yield_run(tokenizer, args.yield_turns, every)), "reminder_every": every}
        for every in args.reminder_every
    ]
    result = {
        "overhead": overhead,
        "concurrency": concurrency,
        "token_yield": token_yield,
        "seconds": time.perf_counter() - started,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"Per-turn middleware overhead, Claude-Code-shaped session ({overhead['turns']} turns):")
    print(f"  {'prompt tokens':>13}  {'incremental':>12}  {'full re-render':>14}  {'ratio':>6}")
    for row in overhead["rows"]:
        print(
            f"  {row['tokens']:>13,}  {row['incremental_ms']:>10.1f}ms  "
            f"{row['full_render_ms']:>12.1f}ms  {row['ratio']:>5.1f}x"
        )
    c = concurrency
    print(
        f"\n{c['sessions']} concurrent sessions, {c['turns']} turns "
        f"(prompts up to {c['prompt_tokens']:,} tokens):"
    )
    print(
        f"  {c['turns_per_s']:.1f} turns/s; added latency p50 {c['p50_ms']:.1f}ms, "
        f"p99 {c['p99_ms']:.1f}ms"
    )
    print(
        f"  memory per session: {c['rss_per_session_kb']:.0f} KiB RSS "
        f"({c['trajectory_per_session_kb']:.0f} KiB held by the trajectory)"
    )
    print(f"\nToken yield with reasoning under the Qwen3 template ({args.yield_turns} turns):")
    for y in token_yield:
        print(
            f"  user text every {y['reminder_every']} turns: {y['trained_tokens']}/"
            f"{y['sampled_tokens']} sampled tokens trained = {100 * y['yield']:.1f}% "
            f"({y['samples']} samples, {y['realigned_turns']} realigned turns)"
        )
    print(f"\ntotal {result['seconds']:.0f}s")


if __name__ == "__main__":
    main()
