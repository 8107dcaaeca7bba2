"""Middleware per-turn CPU at 16k-128k, finish_session, and bytes held, in interleaved rounds.

1. Per-turn all-in cost. Claude-Code-shaped sessions (Claude Code 2.1.332's real system
   prompt and tools, from the captured fixtures) grow turn by turn to 128k tokens through
   the real HTTP middleware, one session per column, played in lockstep by one client in
   a child process (``_driver.py``): one request in flight at a time, the columns taken in
   turn and their order reversed every turn (A B C, C B A, …), so every column shares each
   moment of the machine's load; ``--rounds`` rounds, each with fresh middlewares and
   sessions, the first column alternating. The scripted engine (in the child) answers
   every ``/generate`` exactly ``--engine-ms`` after it arrived, its own work inside that.

   The figure is the serving process's CPU per turn (``time.process_time()``, threads
   included): marked as each request reaches its handler, so one turn's figure is all its
   work from the request's bytes in to the response's bytes out (aiohttp, body read and
   parse, translation, prompt building, the engine payload and its reply's parse, output
   parsing, the reply, SSE or JSON, recording) and nothing of the engine's or the client's,
   which run in another process. Beside it is the wall figure at the client (latency less
   the engine's delay), which a loaded machine inflates. Reported at each size: median and
   min over the rounds' 3 turns nearest it; ratios are medians of same-round, same-turn
   ratios.

   Columns: ``splice`` (the default prompt mode; the client streams, as Claude Code does),
   ``splice-json`` (the same, ``stream=False``), ``render`` (incremental renderer; every
   turn asserts that the engine got exactly the full render of the request), ``full``
   (every prompt rendered and tokenized from scratch, as slime's adapters do: a
   ``PromptBuilder`` of this benchmark's, the previous baseline), ``edits`` (splice mode, the session edits
   its history every ``--edit-every`` turns: a system-reminder inserted, an earlier tool
   result rewritten, a tool added; those turns are the fallbacks, reported apart) and,
   with ``--slime-src``, ``slime``: slime's own ``AnthropicAdapter`` in this process.
   ``--baseline-src DIR`` adds ``splice@base`` and ``render@base``, the same sessions
   served by another checkout (``_baseline.py``); then ``splice`` and ``render`` are
   served by a process of their own too, so both versions run in processes alike, and
   "no slower than the previous code" is a same-turn ratio (DIR = this tree: an A/A run,
   whose ratios are the method's noise).
2. ``finish_session`` at the end of every round's session (columns in alternating order):
   its CPU and wall time, and the samples it built (count, tokens, approximate bytes).
3. Bytes held per 128k session, in splice and render mode: tracemalloc of everything the
   middleware and its trajectory hold once a session reached 128k tokens, before
   ``finish_session`` (after a short warm-up session, so one-time caches are not counted).

Every goal is judged on figures from this run. Load (realistic and saturation modes, 1 and
N workers) is ``benchmarks/middleware_load.py``.

    python benchmarks/middleware.py [--quick] [--rounds 2] [--max-tokens 131072]
        [--baseline-src DIR] [--slime-src DIR] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _baseline import BASE_COLUMNS, BaselineServer, here, slime_server
from _client import EDITS
from _driver import Driver, Lockstep, Plan, Target, load_tokenizer
from _measure import (
    CpuMarks,
    goal_line,
    load_line,
    median_min,
    runqueue_wait,
    switches_hook,
    timed_finish,
)

from agentrl.serve.shard_wire import tune_gc

SIZES = (16_384, 32_768, 65_536, 131_072)
QUICK_SIZES = (16_384, 20_480)
#: Goals (issues 15 and 34).
GOAL_CPU_MS = 5.0
GOAL_FINISH_MS = 5.0
GOAL_HELD_BYTES = 4_000_000
#: ``*-libenc``/``*-libjinja``: a fast path switched off (``_measure.LIBRARY_SWITCHES``).
LIBRARY_COLUMNS = ("splice-libenc", "splice-libjinja", "render-libjinja")
COLUMNS = ("splice", "splice-json", "render", "full", "edits", *LIBRARY_COLUMNS, "slime")
#: Every column in the order printed (the baseline's beside their counterparts).
SHOWN = (
    "splice",
    "splice@base",
    "splice-json",
    "render",
    "render@base",
    "full",
    "edits",
    *LIBRARY_COLUMNS,
    "slime",
)
#: Same-turn CPU ratios reported (a / b).
RATIOS = (
    ("full", "splice"),
    ("render", "full"),
    ("splice", "splice@base"),
    ("render", "render@base"),
    ("slime", "splice"),
    ("splice", "splice-libenc"),
    ("splice", "splice-libjinja"),
    ("render", "render-libjinja"),
)
#: A fast path stays only where it saves at least this share of the per-turn CPU.
GOAL_FAST_PATH_SAVING = 0.20
#: "No slower than the baseline": a same-turn ratio within the method's noise.
GOAL_BASE_RATIO = 1.05
MODES: dict[str, dict[str, Any]] = {
    "splice": {"prompt_mode": "splice"},
    "splice-json": {"prompt_mode": "splice"},
    "render": {"prompt_mode": "render"},
    "full": {"prompt_mode": "full"},
    "edits": {"prompt_mode": "splice"},
    "splice-libenc": {"prompt_mode": "splice"},
    "splice-libjinja": {"prompt_mode": "splice"},
    "render-libjinja": {"prompt_mode": "render"},
}


def full_render(tokenizer):
    """The reference builder: every prompt rendered and tokenized from scratch, no chains."""
    from agentrl.prompts.builders import BuiltPrompt, RenderBuilder
    from agentrl.prompts.rendering import IncrementalRenderer

    class FullRender(RenderBuilder):
        def build(self, state, messages, tools, links, *, sid="", index=0):
            kwargs = self.chat_template_kwargs
            renderer = IncrementalRenderer(self.tokenizer, tools=tools, chat_template_kwargs=kwargs)
            return BuiltPrompt(prompt=renderer.render(messages, tools=tools), messages=messages)

    return FullRender(tokenizer)


def make_middleware(engine, tokenizer, **options: Any):
    """The benchmarked middleware: Anthropic Messages, Qwen3's parsers."""
    from agentrl.adapters import Middleware

    if options.get("prompt_mode") == "full":
        options["prompt_mode"] = full_render(tokenizer)
    return Middleware(
        engine=engine,
        tokenizer=tokenizer,
        tool_parser="hermes",
        reasoning_parser="qwen3",
        adapters=["anthropic"],
        **options,
    )


async def one_round(driver: Driver, tokenizer, args, index: int) -> dict[str, Any]:
    """Every column's session grown to ``max_tokens`` in lockstep, then finished."""
    from agentrl.engines.sglang import SGLangEngine

    delay = args.engine_ms / 1e3
    url = driver.engine(delay=delay)
    columns = [c for c in args.columns if c != "slime"]
    if args.baseline_src:  # each baseline column beside the column it is compared with
        for base, local in BASE_COLUMNS.items():
            if local in columns:
                columns.insert(columns.index(local) + 1, base)
    if "slime" in args.columns:
        columns.append("slime")
    if index % 2:
        columns.reverse()
    marks, engines, served, address = CpuMarks(), [], {}, {}
    unavailable: dict[str, str] = {}
    remote: dict[str, list[str]] = {}
    if args.baseline_src:  # the compared columns of both versions in processes alike
        remote[here()] = [c for c in BASE_COLUMNS.values() if c in columns]
        remote[args.baseline_src] = [b for b in BASE_COLUMNS if b in columns]
    servers, slime = [], None
    try:
        for column in columns:
            if column == "slime" or any(column in names for names in remote.values()):
                continue
            engine = SGLangEngine(url)
            engines.append(engine)
            mw = served[column] = make_middleware(engine, tokenizer, **MODES[column])
            mw.app.middlewares.append(marks.hook(column))
            mw.app.middlewares.append(switches_hook(column))
            await mw.start()
            address[column] = (mw.url, mw.open_session(f"{column}-{index}"))
        for src, names in remote.items():
            spec = {n: {"sid": f"{n}-{index}", **MODES[BASE_COLUMNS.get(n, n)]} for n in names}
            servers.append(BaselineServer(src, url, spec))
            address |= await servers[-1].start()
        if "slime" in columns:
            slime = await slime_server(driver.engine(delay=delay, style="slime"), tokenizer, marks)
            if isinstance(slime, str):
                unavailable["slime"], slime = slime, None
                columns.remove("slime")
            else:
                address["slime"] = (slime[2], "slime")
        targets = tuple(
            _client_of(c, Target(url=address[c][0], token=address[c][1]), args) for c in columns
        )
        waited = runqueue_wait([os.getpid()])
        played = await driver.alockstep(Lockstep(targets=targets, until_tokens=args.max_tokens))
        cpu = marks.per_request(time.process_time())
        waited = (runqueue_wait([os.getpid()]) - waited) / max(1, len(marks.marks))
        finish = {}
        for column in columns[::-1] if index % 2 == 0 else columns:
            if column in served:
                finish[column] = await timed_finish(served[column], f"{column}-{index}")
        stats = {c: dict(mw.splice_stats) for c, mw in served.items()}
        for server in servers:
            figures = await server.finish()
            cpu |= figures["cpu"]
            finish |= figures["finish"]
            stats |= figures["splice_stats"]
    finally:
        for mw in served.values():
            await mw.close()
        for engine in engines:
            await engine.aclose()
        for server in servers:
            server.kill()
        if slime is not None:
            await slime[0].drop_session("slime")
            await slime[1].cleanup()
    turns = {}
    for column, points in zip(columns, played["latencies"], strict=True):
        if played["overruns"] > max(1, len(points) // 10):
            raise SystemExit(
                f"the engine's own work exceeded its {args.engine_ms:.0f} ms delay in "
                f"{played['overruns']} turns; raise --engine-ms"
            )
        turns[column] = [
            {"cpu": c, "wall": lat - delay, "tokens": tok, "edit": edit}
            for (lat, tok, edit), c in zip(points, cpu[column], strict=True)
        ]
    checked = sum(len(turns[c]) for c in columns if c.startswith("render"))
    if played["checked"] != checked:
        raise SystemExit("render: not every turn was checked against the full render")
    return {
        "turns": turns,
        "finish": finish,
        "splice_stats": stats,
        "unavailable": unavailable,
        "overruns": played["overruns"],
        "waited": waited,
    }


def _client_of(column: str, target: Target, args) -> Target:
    import attrs

    if column == "splice-json":
        return attrs.evolve(target, stream=False)
    if column.startswith("render"):
        return attrs.evolve(target, check_render=True)
    if column == "slime":
        return attrs.evolve(target, stream=False)
    if column == "edits":
        return attrs.evolve(target, edits=EDITS, edit_every=args.edit_every)
    return target


def summarise(rounds: list[dict[str, Any]], args) -> dict[str, Any]:
    """Per size and column: median and min over the rounds' 3 turns nearest the size."""
    columns = [c for c in SHOWN if all(c in r["turns"] for r in rounds)]
    rows = []
    for size in args.sizes:
        row: dict[str, Any] = {"tokens": size}
        near = {c: [nearest(r["turns"][c], size) for r in rounds] for c in columns}
        for column in columns:
            for what in ("cpu", "wall"):
                values = [t[what] * 1e3 for turns in near[column] for t in turns]
                row[f"{column}_{what}"] = median_min(values)
        for a, b in RATIOS:
            if a in columns and b in columns:
                ratios = [
                    x["cpu"] / y["cpu"]
                    for ra, rb in zip(near[a], near[b], strict=True)
                    for x, y in zip(ra, rb, strict=False)
                    if y["cpu"] > 0
                ]
                row[f"{a}/{b}"] = statistics.median(ratios) if ratios else float("nan")
        rows.append(row)
    edits: dict[str, list[float]] = {}
    for r in rounds:
        for t in r["turns"].get("edits", ()):
            if t["edit"] and t["tokens"] >= args.max_tokens * 0.5:
                edits.setdefault(t["edit"], []).append(t["cpu"] * 1e3)
    finish = {
        c: {k: median_min(r["finish"][c][k] for r in rounds) for k in ("cpu_ms", "wall_ms")}
        | {k: rounds[-1]["finish"][c][k] for k in ("samples", "tokens", "bytes")}
        for c in columns
        if c in rounds[-1]["finish"]
    }
    return {
        "rounds": len(rounds),
        "turns": len(rounds[0]["turns"]["splice"]),
        "rows": rows,
        "edit_turns": {k: median_min(v) for k, v in edits.items()},
        "edit_counts": {k: len(v) for k, v in edits.items()},
        "splice_stats": rounds[-1]["splice_stats"].get("edits", {}),
        "finish": finish,
        "unavailable": rounds[0]["unavailable"],
        "overruns": sum(r["overruns"] for r in rounds),
        "waited_ms": median_min(r["waited"] * 1e3 for r in rounds),
    }


def nearest(turns: list[dict[str, Any]], size: int) -> list[dict[str, Any]]:
    plain = [t for t in turns if not t["edit"]]
    return sorted(plain, key=lambda t: abs(t["tokens"] - size))[:3]


# -- bytes held ---------------------------------------------------------------------------


async def held_run(driver: Driver, tokenizer, args, mode: str) -> dict[str, Any]:
    """tracemalloc of what the middleware holds for one session grown to 128k tokens."""
    from agentrl.engines.sglang import SGLangEngine

    engine = SGLangEngine(driver.engine(delay=0.001))
    mw = make_middleware(engine, tokenizer, prompt_mode=mode)
    await mw.start()
    try:
        warm = mw.open_session("warm-up")
        await driver.aplay(Plan(url=mw.url, tokens=(warm,), turns=3, stream=True))
        await mw.drop_session("warm-up")
        mw.timings.clear()
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        token = mw.open_session("held")
        plan = Plan(url=mw.url, tokens=(token,), until_tokens=args.max_tokens, stream=True)
        report = await driver.aplay(plan)
        mw.timings.clear()
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        stats = mw.trajectory.session_stats("held")
        await mw.drop_session("held")
    finally:
        await mw.close()
        await engine.aclose()
    return {
        "mode": mode,
        "held_bytes": held,
        "trajectory_bytes": stats.held_bytes,
        "prompt_tokens": report.latencies[0][-1][1],
        "turns": len(report.latencies[0]),
    }


# -- report -------------------------------------------------------------------------------


def print_report(result: dict[str, Any]) -> None:
    print(f"machine: {result['load_before']} at the start, {result['load_after']} at the end")
    if result["overhead"]:
        print_overhead(result["overhead"], result["engine_ms"])
    if result["held"]:
        print("\nBytes held by the middleware for one grown session (before finish_session):")
    for held in result["held"]:
        print_held(held)


def print_overhead(o: dict[str, Any], engine_ms: float) -> None:
    columns = [c for c in SHOWN if f"{c}_cpu" in o["rows"][0]]
    print(
        f"\nPer-turn CPU of the serving process, all-in (request bytes in -> response bytes "
        f"out, engine excluded), {o['turns']} turns a session, {o['rounds']} interleaved "
        "rounds; median (min) of the rounds' 3 turns nearest each size, in ms:"
    )
    print(f"  {'tokens':>8}" + "".join(f"{c:>17}" for c in columns))
    for row in o["rows"]:
        print(f"  {row['tokens']:>8,}" + "".join(f"{_mm(row[f'{c}_cpu']):>17}" for c in columns))
    ratios = [f"{a}/{b}" for a, b in RATIOS if f"{a}/{b}" in o["rows"][0]]
    width = {r: max(19, len(r) + 2) for r in ratios}
    print("\n  same-turn CPU ratios, median:" + "".join(f"{r:>{width[r]}}" for r in ratios))
    for row in o["rows"]:
        print(f"  {row['tokens']:>28,}" + "".join(f"{_x(row[r]):>{width[r]}}" for r in ratios))
    print(
        f"\n  wall at the client less the {engine_ms:.0f} ms engine delay (a loaded machine inflates it):"
    )
    for row in o["rows"]:
        cells = "".join(f"{_mm(row[f'{c}_wall']):>17}" for c in columns)
        print(f"  {row['tokens']:>8,}{cells}")
    print(f"  (this process waited {_mm(o['waited_ms'])} ms a turn for a CPU, the machine's queue)")
    for column, why in o["unavailable"].items():
        print(f"  {column}: {why}")
    if o["overruns"]:
        print(f"  (the engine overran its delay in {o['overruns']} turns; their wall counts it)")
    if o["edit_turns"]:
        kinds = ", ".join(
            f"{kind} {_mm(v)} ({o['edit_counts'][kind]} turns)"
            for kind, v in o["edit_turns"].items()
        )
        print(f"\n  edits column, turns that edited history at >= half the size, CPU ms: {kinds}")
        print(f"  edits column's prompt building: {o['splice_stats']}")
    print("\n  finish_session (median (min) over rounds; samples of the last round):")
    for column, f in o["finish"].items():
        print(
            f"  {column:>12}: CPU {_mm(f['cpu_ms'])} ms, wall {_mm(f['wall_ms'])} ms; "
            f"{f['samples']} sample(s), {f['tokens']:,} tokens, ~{f['bytes'] / 1e6:.1f} MB"
        )
    last = o["rows"][-1]
    size = f"{last['tokens'] // 1024}k"
    for column in ("splice", "splice-json"):
        if f"{column}_cpu" in last:
            value = last[f"{column}_cpu"][0]
            print(
                goal_line(
                    f"CPU per turn at {size}, {column}",
                    f"{value:.1f}ms",
                    f"<= {GOAL_CPU_MS:.0f} ms",
                    value <= GOAL_CPU_MS,
                )
            )
    if "splice" in o["finish"]:
        value = o["finish"]["splice"]["cpu_ms"][0]
        print(
            goal_line(
                f"finish_session CPU at {size}, splice",
                f"{value:.1f}ms",
                f"<= {GOAL_FINISH_MS:.0f} ms",
                value <= GOAL_FINISH_MS,
            )
        )
    for name, what in (
        ("splice/splice-libenc", "ascii_bpe, splice"),
        ("splice/splice-libjinja", "FastSandbox, splice"),
        ("render/render-libjinja", "FastSandbox, render"),
    ):
        if last.get(name) is not None:
            saving = 1.0 - last[name]
            label = f"CPU a fast path saves at {size}: {what}"
            goal = f">= {GOAL_FAST_PATH_SAVING:.0%} (else delete it)"
            print(goal_line(label, f"{saving:.0%}", goal, saving >= GOAL_FAST_PATH_SAVING))
    goals = (("render/full", 1.0), ("splice/splice@base", GOAL_BASE_RATIO))
    for name, most in (*goals, ("render/render@base", GOAL_BASE_RATIO)):
        if last.get(name) is not None:
            ratio = last[name]
            label = f"CPU {name} at {size}, same turns"
            print(goal_line(label, f"{ratio:.2f}x", f"<= {most:.2f}x", ratio <= most))


def print_held(held: dict[str, Any]) -> None:
    print(
        f"  {held['mode']} mode: {held['prompt_tokens']:,} tokens after {held['turns']} turns; "
        f"the trajectory's own count: {held['trajectory_bytes'] / 1e6:.2f} MB"
    )
    print(
        goal_line(
            f"bytes held per {held['prompt_tokens'] // 1024}k session, {held['mode']}",
            f"{held['held_bytes'] / 1e6:.2f} MB",
            f"<= {GOAL_HELD_BYTES / 1e6:.0f} MB",
            held["held_bytes"] <= GOAL_HELD_BYTES,
        )
    )


def _mm(pair: tuple[float, float] | None) -> str:
    return "n/a" if pair is None else f"{pair[0]:.1f} ({pair[1]:.1f})"


def _x(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    parser.add_argument(
        "--rounds", type=int, default=2, help="interleaved rounds (each A..Z, Z..A)"
    )
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument(
        "--engine-ms", type=float, default=None, help="fixed engine delay (100; quick: 50)"
    )
    parser.add_argument("--edit-every", type=int, default=8, help="edits column: turns per edit")
    parser.add_argument("--columns", nargs="+", default=list(COLUMNS), choices=COLUMNS)
    parser.add_argument("--slime-src", default=None, help="a slime checkout (for the slime column)")
    parser.add_argument("--no-slime", dest="slime", action="store_false")
    parser.add_argument(
        "--baseline-src", default=None, help="another agentrl checkout: splice@base, render@base"
    )
    parser.add_argument("--parts", nargs="+", default=["overhead", "held"])
    parser.add_argument("--held-modes", nargs="+", default=["splice", "render"])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    sizes = QUICK_SIZES if args.quick else SIZES
    if args.engine_ms is None:
        args.engine_ms = 50.0 if args.quick else 100.0
    args.max_tokens = args.max_tokens or sizes[-1]
    args.sizes = [s for s in sizes if s <= args.max_tokens]
    if args.quick:
        args.edit_every = min(args.edit_every, 2)
    if args.slime_src:
        sys.path.insert(0, str(Path(args.slime_src).resolve()))
    if not args.slime or (args.quick and not args.slime_src):
        args.columns = [c for c in args.columns if c != "slime"]
    return args


def run(argv: list[str] | None = None) -> dict[str, Any]:
    """Measure; returns the figures (what ``--json`` prints)."""
    args = parse_args(argv)
    started, load_before = time.perf_counter(), load_line()
    with Driver() as driver:  # the child loads its tokenizer while this process does
        tokenizer = load_tokenizer()
        tune_gc()  # what `agentrl serve`, the rollout stack and slime's service do at start-up
        overhead = None
        if "overhead" in args.parts:
            rounds = [
                asyncio.run(one_round(driver, tokenizer, args, index))
                for index in range(args.rounds)
            ]
            overhead = summarise(rounds, args)
        held = [
            asyncio.run(held_run(driver, tokenizer, args, mode))
            for mode in (args.held_modes if "held" in args.parts else ())
        ]
    return {
        "overhead": overhead,
        "held": held,
        "engine_ms": args.engine_ms,
        "quick": args.quick,
        "load_before": load_before,
        "load_after": load_line(),
        "seconds": time.perf_counter() - started,
        "json": args.json,
    }


def main(argv: list[str] | None = None) -> int:
    result = run(argv)
    if result.pop("json"):
        print(json.dumps(result, indent=2, default=str))
        return 0
    print_report(result)
    print(f"\ntotal {result['seconds']:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
