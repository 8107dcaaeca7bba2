"""The middleware benchmarks run end to end in their quick mode, and the scripted engine's
fixed delay they rely on holds."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from agentrl.testing.scripted_engine import ScriptedEngine, ScriptedReply

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
FIXTURE = (
    BENCHMARKS.parents[1]
    / "shared"
    / "fixtures"
    / "clients"
    / "claude_code"
    / "001_post_v1_messages.json"
)

#: The quick modes take ~10 s each on a calm 2-core machine; this only catches a runaway.
QUICK_BOUND_S = 120


def _load(name: str):
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def _post_generate(url: str) -> float:
    async with aiohttp.ClientSession(trust_env=False) as http:
        started = time.perf_counter()
        async with http.post(
            f"{url}/generate", json={"input_ids": [1, 2, 3], "sampling_params": {}}
        ) as r:
            assert r.status == 200
            await r.read()
        return time.perf_counter() - started


def _working_responder(work_s: float, delay: float):
    """A responder whose own work (inside the engine's handler) takes ``work_s``."""

    def respond(body, headers):
        time.sleep(work_s)
        return ScriptedReply(ids=(7,), delay=delay, eos=False)

    return respond


async def test_delay_from_arrival_answers_after_the_delay_with_the_work_inside_it():
    """With delay_from_arrival, an engine whose own work takes 0.5 s answers a delay=1 s
    reply about 1 s after arrival (the work inside the delay), not 1.5 s; a delay shorter
    than the work is counted as an overrun."""
    responder = _working_responder(0.5, 1.0)
    async with ScriptedEngine(responder=responder, delay_from_arrival=True) as engine:
        latency = await _post_generate(engine.url)
        assert 1.0 <= latency < 1.4
        assert engine.overruns == 0
        engine.responder = _working_responder(0.5, 0.1)
        assert await _post_generate(engine.url) >= 0.5
        assert engine.overruns == 1


async def test_delay_from_arrival_holds_the_making_of_the_answer_too(monkeypatch):
    """The answer (output ids, text, JSON) is made before the wait, so a slow answer is
    inside the delay too; the last stretch is waited out by yielding, never answered early."""
    async with ScriptedEngine(
        responder=lambda body, headers: ScriptedReply(ids=(7,), delay=0.6, eos=False),
        delay_from_arrival=True,
    ) as engine:
        answer = engine._answer

        def slow_answer(*args, **kwargs):
            time.sleep(0.3)
            return answer(*args, **kwargs)

        monkeypatch.setattr(engine, "_answer", slow_answer)
        latencies = [await _post_generate(engine.url) for _ in range(3)]
        assert all(0.6 <= latency < 0.85 for latency in latencies), latencies
        assert engine.overruns == 0
        assert [g.output_ids for g in engine.served] == [(7,)] * 3


async def test_count_ids_counts_plain_ids_and_parses_anything_else_whole():
    """count_ids: plain digit ids are counted on the raw bytes (prompt_tokens right, nothing
    kept of them); a float, a string or a second input_ids key is parsed whole and meets
    the usual 400."""
    async with (
        ScriptedEngine(
            responder=lambda body, headers: ScriptedReply(ids=(7,), eos=False), count_ids=True
        ) as engine,
        aiohttp.ClientSession(trust_env=False) as http,
    ):

        async def post(raw: bytes) -> tuple[int, dict]:
            async with http.post(f"{engine.url}/generate", data=raw) as r:
                return r.status, await r.json()

        status, reply = await post(b'{"rid":"a","input_ids":[1,22,333],"sampling_params":{}}')
        assert status == 200 and reply["meta_info"]["prompt_tokens"] == 3
        assert engine.requests[-1].body["input_ids"] == [] and engine.served[-1].input_ids == ()
        status, reply = await post(b'{"input_ids":[],"sampling_params":{}}')
        assert status == 200 and reply["meta_info"]["prompt_tokens"] == 0
        for bad in (b'{"input_ids":[1,2.5]}', b'{"input_ids":[1,"2"]}', b'{"input_ids":[1,,2]}'):
            assert (await post(bad))[0] == 400, bad
        nested = b'{"input_ids":[1,2],"sampling_params":{"input_ids":[3]}}'
        status, reply = await post(nested)
        assert status == 200 and reply["meta_info"]["prompt_tokens"] == 2
        assert engine.served[-1].input_ids == (1, 2)


@pytest.mark.slow
@pytest.mark.skipif(not FIXTURE.is_file(), reason="needs the captured client fixtures (shared/)")
def test_middleware_benchmark_quick_mode_reports_every_figure():
    """`benchmarks/middleware.py --quick` plays two interleaved rounds (render mode checked
    against the full render every turn) and reports the serving process's CPU and the wall
    time per turn, median and min, for each column; the edits column's history edits reach
    the splicer's fallbacks; finish_session is timed with its samples' size; and the bytes
    a session holds in each prompt mode (more than its trajectory alone)."""
    started = time.perf_counter()
    result = _load("middleware").run(["--quick", "--no-slime"])
    overhead = result["overhead"]
    assert overhead["rounds"] == 2
    assert [r["tokens"] for r in overhead["rows"]] == [16_384, 20_480]
    for row in overhead["rows"]:
        for column in ("splice", "splice-json", "render", "full", "edits"):
            for what in ("cpu", "wall"):
                median, least = row[f"{column}_{what}"]
                assert 0 < least <= median < 10_000
    assert {"history_changed", "tools_changed"} <= set(overhead["splice_stats"])
    for column, finish in overhead["finish"].items():
        assert finish["cpu_ms"][0] > 0 and finish["tokens"] >= 20_480, column
        assert finish["bytes"] > finish["tokens"] * 8
    assert overhead["finish"]["edits"]["samples"] > 1
    assert "load average" in result["load_before"]
    assert [h["mode"] for h in result["held"]] == ["splice", "render"]
    for held in result["held"]:
        assert held["held_bytes"] > held["trajectory_bytes"] > 0
        assert held["prompt_tokens"] >= 20_480
    assert time.perf_counter() - started < QUICK_BOUND_S


@pytest.mark.slow
@pytest.mark.skipif(not FIXTURE.is_file(), reason="needs the captured client fixtures (shared/)")
def test_load_benchmark_quick_mode_measures_capacity_then_a_fraction_of_it():
    """`benchmarks/middleware_load.py --quick` measures saturation (streaming and not, 1
    and 2 workers) in interleaved rounds, then paces realistic sessions from the capacity
    it measured; the load generator's and engine's CPU are reported apart from the
    serving processes', and the scaling goal says when the machine cannot judge it."""
    load = _load("middleware_load")
    started = time.perf_counter()
    result = load.run(["--quick", "--workers", "1", "2", "--rounds", "1", "--clients", "2"])
    for config in ((1, "stream"), (1, "json"), (2, "stream")):
        one = result["saturation"][config]
        if config[0] == 2 and load.shards_class() is None:
            assert one == "not available on this build"
            continue
        assert one["turns"][0] == one["sessions"] * 3
        assert one["p99_ms"][0] >= one["p50_ms"][0] > 0
        assert one["cpu_ms_per_turn"][0] > 0 and one["driver_busiest"][0] > 0
    assert result["capacity"][(1, "stream")] > 0
    realistic = result["realistic"][(1, "stream")]
    assert realistic["turns"][0] == realistic["sessions"] * 3
    assert time.perf_counter() - started < QUICK_BOUND_S
