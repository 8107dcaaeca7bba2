"""Middleware under load: capacity, then realistic pacing at a fraction of it, 1 and N workers.

The middleware serves in this process (1 worker) or in N sticky worker processes
(``ShardedMiddleware``); the scripted engine runs in a child process of its own and the
load generator in ``--clients`` more (``_driver.py``). Each side's CPU is measured apart:
the serving processes' (this one and its workers, the driver's children excluded), the
engine's, and every client process's own, so a saturated load generator shows as such
instead of passing for the middleware's latency. The engine answers every ``/generate``
exactly its mode's delay after the request reached it (its own parsing inside that time);
added latency is measured at the client, from the request's first byte to the reply's
last byte, less that delay. Clients stream (``stream=True``, SSE, as Claude Code and Codex
send it) unless the variant is ``json``.

Sessions are Claude-Code-shaped (Claude Code's real system prompt and tools, ~13k tokens
to start); every tool result adds ``--lines`` lines of code (480 lines ~ 7k tokens), so a
session grows past 128k tokens in 18 turns. The ``edits`` variant (streaming) edits each
session's history every 8 turns (``--edit-every K``: K, and in every variant): a reminder
inserted, a tool result rewritten, a tool added, the turns where splicing falls back.

1. saturation (the capacity): ``--sessions`` (64) sessions in a closed loop (every client sends
   its next request as soon as its reply is in), 50 ms engine delay, each until 128k.
2. realistic: 2 s generation and 1 s tool time a turn, sessions staggered over one turn
   period, each until 128k; the number of sessions is set so the offered load is
   ``--fraction`` (0.5) of the capacity that configuration measured in step 1 of this run.

Every configuration (workers x variant) runs in ``--rounds`` interleaved rounds (A B, B A,
…); figures are the median (min) over rounds. Goals are judged on this run's figures only:
realistic p99 added latency <= 20 ms (streaming, and streaming with edits); N workers >= 0.8 N x one worker's
turns/s at saturation, judged only when the machine has the cores for it (else it says
so), and never while a load-generator process was saturated.

    python benchmarks/middleware_load.py [--quick] [--workers 1 2] [--clients 2]
        [--variants stream json] [--realistic-variants stream edits] [--rounds 2]
        [--fraction 0.5] [--edit-every K] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _client import EDITS
from _driver import Driver, Plan, build_middleware, load_tokenizer
from _measure import (
    TailWatch,
    cores,
    cpu_seconds,
    free_cores,
    goal_line,
    load_line,
    median_min,
    percentile,
    process_cpu,
    runqueue_wait,
    serving_pids,
)

from agentrl.serve.shard_wire import tune_gc

#: Goals (issues 15 and 34).
GOAL_REALISTIC_P99_MS = 20.0
GOAL_SCALING = 0.8  # of N x one worker's turns/s
#: A client process busier than this share of a core is saturated: latencies are its own.
DRIVER_SATURATED = 0.9


@functools.cache
def shards_class():
    """``ShardedMiddleware`` where this build has it, else None."""
    try:
        from agentrl.serve.shards import ShardedMiddleware
    except ImportError:
        return None
    return ShardedMiddleware


def mode_shape(mode: str, args, capacity: float | None = None) -> dict[str, Any]:
    """Sessions, pacing and growth of one mode (realistic: sized from ``capacity``)."""
    if mode == "saturation":
        if args.quick:
            return {"sessions": 4, "gen": 0.02, "think": 0.0, "turns": 3, "lines": 120}
        return {"sessions": args.sessions, "gen": 0.05, "think": 0.0, "until": 131_072}
    gen, think = (0.2, 0.1) if args.quick else (2.0, 1.0)
    sessions = max(1, round(args.fraction * (capacity or 0.0) * (gen + think)))
    shape = {"sessions": sessions, "gen": gen, "think": think}
    if args.quick:
        return {**shape, "sessions": min(sessions, 8), "turns": 3, "lines": 120}
    return {**shape, "until": 131_072}


async def run_config(driver: Driver, mode: str, workers: int, variant: str, shape, args):
    """One mode for one configuration, or why it cannot run."""
    engine_url = driver.engine(delay=shape["gen"], count_ids=True)
    build = functools.partial(build_middleware, engine_url)
    if workers == 1:
        mw = build()
        close_engine = mw.engine.aclose
        tune_gc()  # what `agentrl serve` and the rollout stack do once start-up is over
    elif shards_class() is None:
        return "not available on this build"
    else:
        mw = shards_class()(workers=workers, build=build)
        close_engine = None
    await mw.start(host="127.0.0.1", port=0)
    try:
        await warm_up(driver, mw, workers)
        sids = [f"{mode}-{workers}-{variant}-{i}" for i in range(shape["sessions"])]
        tokens = tuple(mw.open_session(sid) for sid in sids)
        if workers > 1:
            await asyncio.gather(*(mw.session(sid).opened for sid in sids))
        period = shape["gen"] + shape["think"]
        plan = Plan(
            url=mw.url,
            tokens=tokens,
            turns=shape.get("turns"),
            until_tokens=shape.get("until"),
            lines=shape.get("lines", args.lines),
            think=shape["think"],
            stagger=period / len(tokens) if shape["think"] else 0.0,
            stream=variant != "json",
            edits=EDITS if args.edit_every or variant == "edits" else (),
            edit_every=args.edit_every or 8,
        )
        serving = serving_pids(driver.pids)
        cpu_before = cpu_seconds(exclude=driver.pids)
        waited = runqueue_wait(serving), runqueue_wait(driver.pids)
        recorded_before = len(mw.timings) if workers == 1 else 0
        async with TailWatch() as watch:  # the loop and the collector of this process
            report = await driver.aplay(plan)
        # the middleware's own view of each turn (1 worker: it serves in this process):
        # from the request reaching its handler to the turn recorded, the engine excluded
        inside = (
            [t.overhead_seconds for t in list(mw.timings)[recorded_before:]] if workers == 1 else []
        )
        cpu = cpu_seconds(exclude=driver.pids) - cpu_before
        waited = (
            runqueue_wait(serving) - waited[0],
            runqueue_wait(driver.pids) - waited[1],
        )
        # what a rollout does next: take each session's samples (timed, all sessions' work)
        finish_cpu, finish_wall = cpu_seconds(exclude=driver.pids), time.perf_counter()
        sample_tokens = 0
        for sid in sids:
            samples = await mw.finish_session(sid, reward=1.0)
            sample_tokens += sum(len(sample.tokens) for sample in samples)
        finish_cpu = cpu_seconds(exclude=driver.pids) - finish_cpu
        finish_wall = time.perf_counter() - finish_wall
    finally:
        await mw.close()
        if close_engine is not None:
            await close_engine()
    added = [lat - shape["gen"] for session in report.latencies for lat, _, _ in session]
    turns = len(added)
    return {
        "turns": turns,
        "sessions": shape["sessions"],
        "wall_s": report.wall,
        "turns_per_s": turns / report.wall,
        "cpu_ms_per_turn": cpu / turns * 1e3,
        "serving_cores": cpu / report.wall,
        "engine_cores": report.engine_cpu / report.wall,
        "driver_busiest": report.driver_busiest(),
        "driver_cores": sum(c for c, _ in report.driver_cpu) / report.wall,
        "serve_wait_ms": waited[0] / turns * 1e3,
        "driver_wait_ms": waited[1] / turns * 1e3,
        "finish_ms": finish_cpu / len(sids) * 1e3,
        "finish_wall_ms": finish_wall / len(sids) * 1e3,
        "sample_tokens": sample_tokens / len(sids),
        "p50_ms": percentile(added, 0.50) * 1e3,
        "p99_ms": percentile(added, 0.99) * 1e3,
        "max_ms": max(added) * 1e3,
        "max_prompt_tokens": max(t for session in report.latencies for _, t, _ in session),
        "engine_overruns": report.overruns,
        **(
            {
                "inside_p99_ms": percentile(inside, 0.99) * 1e3,
                "inside_max_ms": max(inside, default=0.0) * 1e3,
                **watch.figures(),
            }
            if workers == 1
            else {}
        ),
    }


async def warm_up(driver: Driver, mw, workers: int) -> None:
    """Two turns of a few sessions first, so one-time costs (template compile, imports,
    connection pools) are not counted as load."""
    sids = [f"warm-up-{i}" for i in range(2 * workers)]
    tokens = tuple(mw.open_session(sid) for sid in sids)
    if workers > 1:
        await asyncio.gather(*(mw.session(sid).opened for sid in sids))
    await driver.aplay(Plan(url=mw.url, tokens=tokens, turns=2))
    for sid in sids:
        await mw.drop_session(sid)


def interleaved(configs: list, rounds: int) -> list:
    """Each round runs every configuration, every other round in reverse (A B, B A, …)."""
    return [c for r in range(rounds) for c in (configs if r % 2 == 0 else configs[::-1])]


def capacity_of(capacity: dict[tuple, float], workers: int, variant: str) -> float | None:
    """The capacity a configuration measured (an ``edits`` run: its streaming sibling's)."""
    return capacity.get((workers, variant)) or capacity.get((workers, "stream"))


def run_mode(driver, mode: str, configs, args, capacity=None) -> dict[tuple, list]:
    results: dict[tuple, list] = {c: [] for c in configs}
    for workers, variant in interleaved(configs, args.rounds):
        shape = mode_shape(mode, args, capacity and capacity_of(capacity, workers, variant))
        result = asyncio.run(run_config(driver, mode, workers, variant, shape, args))
        results[(workers, variant)].append(result)
        done = (
            result
            if isinstance(result, str)
            else (
                f"{result['turns']} turns, {result['turns_per_s']:.1f} turns/s, "
                f"p99 {result['p99_ms']:.1f} ms, client max {result['driver_busiest']:.2f}"
            )
        )
        print(f"  ({mode}, {workers}w {variant}: {done})", file=sys.stderr, flush=True)
        if isinstance(result, str):
            break
    return results


# -- report -------------------------------------------------------------------------------

#: Where the tail is (1 worker; worst round): the middleware's own turn time, the loop, the GC.
TAIL = ("inside_p99_ms", "inside_max_ms", "lag_p99_ms", "lag_max_ms", "gc_pauses", "gc_gen2")
TAIL += ("gc_max_ms", "gc_total_ms")

FIGURES = (
    ("turns", "turns", "{:.0f}", 12),
    ("p50_ms", "p50 ms", "{:.1f}", 14),
    ("p99_ms", "p99 ms", "{:.1f}", 14),
    ("max_ms", "max ms", "{:.0f}", 12),
    ("turns_per_s", "turns/s", "{:.1f}", 14),
    ("cpu_ms_per_turn", "serve CPU ms/t", "{:.1f}", 15),
    ("serving_cores", "serve cores", "{:.2f}", 13),
    ("engine_cores", "engine cores", "{:.2f}", 13),
    ("serve_wait_ms", "serve runq ms/t", "{:.1f}", 16),
    ("driver_busiest", "client max", "{:.2f}", 13),
    ("driver_wait_ms", "drv runq ms/t", "{:.1f}", 15),
    ("finish_ms", "finish CPU ms", "{:.1f}", 15),
)


def summary(runs: list) -> dict[str, Any] | str:
    if any(isinstance(r, str) for r in runs):
        return next(r for r in runs if isinstance(r, str))
    out = {k: median_min(r[k] for r in runs) for k, _, _, _ in FIGURES}
    # the worst round for what should be low, the busiest client of any round
    out["p99_worst"] = max(r["p99_ms"] for r in runs)
    out["driver_busiest_max"] = max(r["driver_busiest"] for r in runs)
    out["sessions"] = runs[0]["sessions"]
    out["overruns"] = sum(r["engine_overruns"] for r in runs)
    out["max_prompt_tokens"] = max(r["max_prompt_tokens"] for r in runs)
    out["tail"] = {k: max(r[k] for r in runs) for k in TAIL if k in runs[0]}
    return out


def print_mode(mode: str, summaries: dict[tuple, Any], args, capacity=None) -> None:
    print(f"\n{mode} mode ({args.rounds} interleaved rounds; median (min) over rounds):")
    print("  " + f"{'config':>12}{'sessions':>9}" + "".join(f"{h:>{w}}" for _, h, _, w in FIGURES))
    for (workers, variant), s in summaries.items():
        label = f"{workers}w {variant}"
        if isinstance(s, str):
            print(f"  {label:>12}  {s}")
            continue
        cells = "".join(
            f"{fmt.format(s[k][0]) + ' (' + fmt.format(s[k][1]) + ')':>{w}}"
            for k, _, fmt, w in FIGURES
        )
        print(f"  {label:>12}{s['sessions']:>9}{cells}")
        if s["overruns"]:
            print(f"  {'':>12}  (the engine overran its delay in {s['overruns']} turns)")
        if s["tail"]:
            t = s["tail"]
            print(
                f"  {'':>12}  tail, worst round: inside the middleware p99 "
                f"{t['inside_p99_ms']:.1f} ms, max {t['inside_max_ms']:.0f} ms; event-loop lag "
                f"p99 {t['lag_p99_ms']:.1f} ms, max {t['lag_max_ms']:.0f} ms; GC "
                f"{t['gc_pauses']:.0f} pauses ({t['gc_gen2']:.0f} full), longest "
                f"{t['gc_max_ms']:.0f} ms, {t['gc_total_ms']:.0f} ms in all"
            )
        if capacity and capacity_of(capacity, workers, variant):
            offered = s["turns_per_s"][0] / capacity_of(capacity, workers, variant)
            print(f"  {'':>12}  served {offered:.0%} of the capacity this configuration measured")
    print(
        "  (p50/p99/max: added latency at the client; serve CPU ms/t: the serving processes'\n"
        "   CPU per turn; serve/engine cores: cores busy over the run; serve runq: time the\n"
        "   serving threads waited for a CPU (the machine's queue), per turn; client max: the\n"
        "   busiest load-generator process's share of a core, >= 0.90 is saturated; drv runq:\n"
        "   the engine's and clients' wait for a CPU, per turn; finish CPU ms: finish_session\n"
        "   per session, after the run, its samples included; tail: the serving process's own\n"
        "   view with 1 worker: a turn from its handler to its record, the engine excluded,\n"
        "   how late its event loop woke, and its garbage collector's pauses)"
    )


def print_goals(result: dict[str, Any], args) -> None:
    realistic, saturation = result["realistic"], result["saturation"]
    for (workers, variant), s in realistic.items():
        if variant == "json" or isinstance(s, str):
            continue
        served = s["turns_per_s"][0] / capacity_of(result["capacity"], workers, variant)
        label = f"realistic, {workers} worker(s), {variant}, at {served:.0%} of capacity: p99"
        if s["driver_busiest_max"] >= DRIVER_SATURATED:
            busy = f"a client process at {s['driver_busiest_max']:.0%} of a core"
            print(goal_line(label, "not measurable", f"driver saturated ({busy})", None))
            continue
        value, waited = s["p99_ms"][0], s["serve_wait_ms"][0]
        goal = f"<= {GOAL_REALISTIC_P99_MS:.0f} ms (serving waited {waited:.1f} ms/turn for a CPU)"
        print(goal_line(label, f"{value:.1f}ms", goal, value <= GOAL_REALISTIC_P99_MS))
    one = saturation.get((1, "stream"))
    for (workers, variant), s in saturation.items():
        if workers == 1 or variant != "stream" or isinstance(s, str) or isinstance(one, str):
            continue
        ratio = s["turns_per_s"][0] / one["turns_per_s"][0]
        goal = f">= {GOAL_SCALING * workers:.1f}x"
        label = f"saturation, {workers} workers vs 1: turns/s"
        # the workers need their cores, and the engine and clients need what they used
        needed = workers + math.ceil(one["engine_cores"][0] + one["driver_busiest"][0])
        free = result["free_cores"]
        if free < needed:
            why = f"{ratio:.2f}x; not measurable here ({needed} cores needed, {free:.1f} free)"
            print(goal_line(label, "n/a", f"{goal} ({why})", None))
        elif s["driver_busiest_max"] >= DRIVER_SATURATED:
            print(goal_line(label, "n/a", f"{goal} (driver saturated: {ratio:.2f}x)", None))
        else:
            print(goal_line(label, f"{ratio:.2f}x", goal, ratio >= GOAL_SCALING * workers))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few small sessions (smoke)")
    parser.add_argument("--modes", nargs="+", default=["saturation", "realistic"])
    parser.add_argument("--workers", nargs="+", type=int, default=None)
    parser.add_argument("--variants", nargs="+", default=["stream", "json"])
    parser.add_argument(
        "--realistic-variants",
        nargs="+",
        default=["stream", "edits"],
        help="variants paced realistically (edits: streaming, history edited every 8 turns)",
    )
    parser.add_argument("--clients", type=int, default=2, help="load-generator processes")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sessions", type=int, default=64, help="saturation sessions")
    parser.add_argument("--fraction", type=float, default=0.5, help="realistic load / capacity")
    parser.add_argument("--edit-every", type=int, default=0, help="history edit every K turns")
    parser.add_argument("--lines", type=int, default=480, help="lines of code per tool result")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.workers is None:
        args.workers = [1, cores()] if cores() > 1 else [1]
    return args


def run(argv: list[str] | None = None) -> dict[str, Any]:
    """Measure; returns the figures (what ``--json`` prints)."""
    args = parse_args(argv)
    started, load_before, free = time.perf_counter(), load_line(), free_cores()
    result: dict[str, Any] = {"saturation": {}, "realistic": {}, "capacity": {}}
    with Driver(clients=args.clients) as driver:
        load_tokenizer()  # while the children load theirs
        configs = [(w, v) for v in args.variants for w in args.workers]
        saturation = run_mode(driver, "saturation", configs, args)
        result["saturation"] = {c: summary(r) for c, r in saturation.items()}
        capacity = {
            c: s["turns_per_s"][0]
            for c, s in result["saturation"].items()
            if not isinstance(s, str)
        }
        result["capacity"] = capacity
        if "realistic" in args.modes:
            configs = [(w, v) for v in args.realistic_variants for w in args.workers]
            configs = [c for c in configs if capacity_of(capacity, *c)]
            realistic = run_mode(driver, "realistic", configs, args, capacity)
            result["realistic"] = {c: summary(r) for c, r in realistic.items()}
        result["driver_pids"] = sorted(driver.pids)
        result["driver_cpu_total"] = sum(process_cpu(p) for p in driver.pids)
    result |= {
        "load_before": load_before,
        "load_after": load_line(),
        "free_cores": free,
        "quick": args.quick,
        "seconds": time.perf_counter() - started,
    }
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(argv)
    if args.json:
        print(
            json.dumps(
                {
                    **result,
                    **{
                        k: {str(c): v for c, v in result[k].items()}
                        for k in ("saturation", "realistic", "capacity")
                    },
                },
                indent=2,
            )
        )
        return 0
    print(
        f"machine: {result['load_before']} at the start ({result['free_cores']:.1f} cores free), "
        f"{result['load_after']} at the end; {args.clients} load-generator process(es)"
    )
    print_mode("saturation", result["saturation"], args)
    if result["realistic"]:
        print_mode("realistic", result["realistic"], args, result["capacity"])
    print()
    print_goals(result, args)
    print(f"\ntotal {result['seconds']:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
