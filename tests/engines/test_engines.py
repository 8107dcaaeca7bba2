"""Engines: the sglang client against the scripted SGLang server, and the in-process HF engine."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from agentrl import plugins
from agentrl.engines.base import EngineError, Generation, MissingEngineOptionError
from agentrl.engines.sglang import DEFAULT_SAMPLING, SGLangEngine
from agentrl.plugin_options import OptionsError
from agentrl.testing.scripted_engine import ScriptedEngine, scripted_engine, scripted_logprob

IM_END = 151645


@pytest.fixture
async def client(scripted_engine):
    """An SGLangEngine pointed at the scripted server."""
    engine = SGLangEngine(scripted_engine.url)
    try:
        yield engine
    finally:
        await engine.aclose()


# -- sglang client -----------------------------------------------------------------


async def test_generate_returns_the_sampled_tokens_and_logprobs(
    client, scripted_engine, qwen_tokenizer
):
    """A text reply comes back as its token ids plus EOS, with the server's log-probs."""
    scripted_engine.queue("Hello there.")
    gen = await client.generate([1, 2, 3], {"max_new_tokens": 50, "temperature": 0.7})
    expected = qwen_tokenizer("Hello there.", add_special_tokens=False)["input_ids"] + [IM_END]
    assert gen.output_ids == tuple(expected)
    assert gen.logprobs == tuple(scripted_logprob(0, i, t) for i, t in enumerate(expected))
    assert gen.finish_reason == "stop"
    assert gen.meta["prompt_tokens"] == 3
    assert gen.meta["matched_stop"] == IM_END


async def test_request_body_matches_sglang_generate(client, scripted_engine):
    """The POST body carries rid, input_ids, merged sampling params and return_logprob."""
    scripted_engine.queue(ids=[5, 6], eos=False)
    await client.generate([9, 8, 7], {"max_new_tokens": 4, "temperature": 1.0}, rid="r-1")
    (request,) = scripted_engine.generate_requests
    assert request.body == {
        "rid": "r-1",
        "input_ids": [9, 8, 7],
        "sampling_params": {**DEFAULT_SAMPLING, "max_new_tokens": 4, "temperature": 1.0},
        "return_logprob": True,
    }
    assert "X-SMG-Routing-Key" not in request.headers


async def test_array_ids_are_sent_as_the_same_json_array(client, scripted_engine):
    """An array('I') prompt (the renderer's compact ids) reaches SGLang as a plain JSON array,
    with a JSON content type, and big ids survive the encoding."""
    from array import array

    ids = array("I", [151_643, 0, 2**32 - 1, *range(1000)])
    scripted_engine.queue(ids=[5], eos=False)
    await client.generate(ids, {"max_new_tokens": 4}, rid="r-2")
    (request,) = scripted_engine.generate_requests
    assert request.body["input_ids"] == list(ids)
    assert request.body["rid"] == "r-2" and request.body["return_logprob"] is True
    assert request.headers["Content-Type"] == "application/json"


async def test_a_session_prompt_that_grows_is_sent_whole_each_time(client, scripted_engine):
    """With a routing key, each prompt extending the previous one still reaches SGLang
    as its own whole JSON array (only the text of its new ids is written)."""
    from array import array

    prompts = [array("I", range(500)), array("I", [*range(500), 9, 9]), array("I", [1, 2])]
    for ids in prompts:
        scripted_engine.queue(ids=[5], eos=False)
        await client.generate(ids, {"max_new_tokens": 4}, routing_key="s")
    assert [r.body["input_ids"] for r in scripted_engine.generate_requests] == [
        list(ids) for ids in prompts
    ]
    assert client.ids_text.reused == 500


def test_generate_payload_is_one_json_object():
    """generate_payload writes the four fields SGLang reads, whatever sequence holds the ids."""
    from agentrl.engines.sglang import generate_payload

    for ids in ([1, 2], (1, 2), range(1, 3)):
        body = json.loads(generate_payload("r", ids, {"stop": ["é"], "n": 1}))
        assert body == {
            "rid": "r",
            "input_ids": [1, 2],
            "sampling_params": {"stop": ["é"], "n": 1},
            "return_logprob": True,
        }


async def test_routing_key_header_and_per_session_replies(client, scripted_engine):
    """routing_key becomes X-SMG-Routing-Key, and session-queued replies go to that session."""
    scripted_engine.queue(ids=[11], eos=False, session="sess-a")
    scripted_engine.queue(ids=[22], eos=False)
    other = await client.generate([1], {}, routing_key="sess-b")
    mine = await client.generate([1], {}, routing_key="sess-a")
    assert (other.output_ids, mine.output_ids) == ((22,), (11,))
    keys = [r.headers.get("X-SMG-Routing-Key") for r in scripted_engine.generate_requests]
    assert keys == ["sess-b", "sess-a"]


async def test_length_finish_when_reply_exceeds_max_new_tokens(client, scripted_engine):
    """Like SGLang, output is cut at max_new_tokens and finishes with 'length'."""
    scripted_engine.queue(ids=list(range(100, 110)))
    gen = await client.generate([1], {"max_new_tokens": 4})
    assert gen.output_ids == (100, 101, 102, 103)
    assert gen.finish_reason == "length"
    assert len(gen.logprobs) == 4


async def test_explicit_logprobs_and_finish_reason(client, scripted_engine):
    """Per-call log-probs and finish reasons are replayed exactly."""
    scripted_engine.queue(ids=[7, 8, 9], logprobs=[-0.5, -1.5, -2.5], finish_reason="length")
    gen = await client.generate([1], {})
    assert gen == Generation(
        output_ids=(7, 8, 9), logprobs=(-0.5, -1.5, -2.5), finish_reason="length", meta=gen.meta
    )


async def test_http_500_becomes_engine_error_with_status_and_body(client, scripted_engine):
    """An injected HTTP 500 raises EngineError carrying the status and a body excerpt."""
    scripted_engine.fail_next(500, "CUDA out of memory")
    with pytest.raises(EngineError) as info:
        await client.generate([1], {})
    assert info.value.status == 500
    assert "CUDA out of memory" in info.value.body
    assert "HTTP 500" in str(info.value)


async def test_empty_queue_is_a_clear_error(client, scripted_engine):
    """With nothing queued the scripted server answers 500 saying so."""
    with pytest.raises(EngineError, match="no reply queued"):
        await client.generate([1], {})


async def test_cancelled_generate_sends_abort_request(client, scripted_engine):
    """Cancelling a generate call (client went away) POSTs /abort_request for its rid."""
    scripted_engine.queue("slow answer", delay=30)
    task = asyncio.create_task(client.generate([1, 2], {}, rid="slow-1"))
    await scripted_engine.wait_for(lambda: len(scripted_engine.generate_requests) == 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await scripted_engine.wait_for(lambda: bool(scripted_engine.abort_requests))
    assert scripted_engine.abort_requests[0].body == {"rid": "slow-1"}
    await scripted_engine.wait_for(lambda: bool(scripted_engine.served))
    assert scripted_engine.served[0].finish_reason == "abort"


async def test_timeout_aborts_and_raises_engine_error(scripted_engine):
    """A read timeout aborts the request on the server and raises EngineError."""
    scripted_engine.queue("late", delay=30)
    engine = SGLangEngine(scripted_engine.url, sock_read_timeout=0.3)
    try:
        with pytest.raises(EngineError, match="timed out"):
            await engine.generate([1], {}, rid="late-1")
    finally:
        await engine.aclose()
    await scripted_engine.wait_for(lambda: bool(scripted_engine.abort_requests))
    assert scripted_engine.abort_requests[0].body == {"rid": "late-1"}


async def test_explicit_abort_finishes_a_delayed_request_with_abort(client, scripted_engine):
    """engine.abort(rid) makes SGLang answer the in-flight request with finish 'abort'."""
    scripted_engine.queue("never sent", delay=30)
    task = asyncio.create_task(client.generate([1], {}, rid="to-abort"))
    await scripted_engine.wait_for(lambda: len(scripted_engine.generate_requests) == 1)
    await client.abort("to-abort")
    gen = await asyncio.wait_for(task, 5)
    assert gen.finish_reason == "abort"
    assert gen.output_ids == ()


async def test_connection_refused_is_engine_error():
    """A server that is not running yields EngineError naming the URL."""
    async with scripted_engine() as engine:
        url = engine.url
    client = SGLangEngine(url)
    try:
        with pytest.raises(EngineError, match=url):
            await client.generate([1], {})
    finally:
        await client.aclose()


async def test_malformed_reply_is_engine_error():
    """A reply without output_token_logprobs raises EngineError mentioning return_logprob."""
    from aiohttp import web

    async def handler(request):
        return web.json_response({"text": "x", "meta_info": {"finish_reason": {"type": "stop"}}})

    app = web.Application()
    app.router.add_post("/generate", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    client = SGLangEngine(f"http://127.0.0.1:{port}")
    try:
        with pytest.raises(EngineError, match="return_logprob"):
            await client.generate([1], {})
    finally:
        await client.aclose()
        await runner.cleanup()


async def test_one_pooled_session_for_many_calls(client, scripted_engine):
    """Concurrent calls share one ClientSession (connection pool), not one per call."""
    for i in range(8):
        scripted_engine.queue(ids=[i], eos=False)
    await client.generate([1], {})
    session = client._session
    results = await asyncio.gather(*(client.generate([1], {}) for _ in range(7)))
    assert client._session is session
    assert sorted(r.output_ids[0] for r in results) == list(range(1, 8))


def test_sglang_url_is_validated():
    """A URL without a scheme is rejected with an explanation."""
    with pytest.raises(ValueError, match="http"):
        SGLangEngine("localhost:30000")


async def test_sglang_is_built_from_the_generic_url_option():
    """``from_options`` needs ``url`` (the message names the caller's flag), passes it first
    and the options as keywords; ``url`` itself is not an option."""
    with pytest.raises(MissingEngineOptionError) as info:
        SGLangEngine.from_options(model_path="/models/q")
    assert info.value.option == "url"
    flags = {"url": "--engine-url", "model_path": "--model-path"}
    assert info.value.for_flags(flags) == (
        "--engine sglang needs --engine-url (the SGLang router's URL, http://host:port)"
    )
    engine = SGLangEngine.from_options({"health_timeout": 1.5}, url="http://127.0.0.1:9/")
    assert (engine.url, engine.health_timeout) == ("http://127.0.0.1:9", 1.5)
    await engine.aclose()
    with pytest.raises(OptionsError, match="no option 'url'"):
        SGLangEngine.check_options({"url": "http://other"}, url="http://127.0.0.1:9")


async def test_health_is_quiet_when_ready_and_names_the_problem_otherwise(client, scripted_engine):
    """GET /health answers 200: ready; a 503 (SGLang still loading) is an EngineError saying so."""
    await client.health()
    assert [r.path for r in scripted_engine.requests] == ["/health"]
    scripted_engine.health_status = 503
    with pytest.raises(EngineError, match="HTTP 503") as info:
        await client.health()
    assert info.value.status == 503 and scripted_engine.url in str(info.value)
    assert scripted_engine.generate_requests == []


async def test_health_can_ask_health_generate(scripted_engine):
    """health_path="/health_generate" asks SGLang's deeper check (a one-token generation)."""
    engine = SGLangEngine(scripted_engine.url, health_path="/health_generate")
    try:
        await engine.health()
    finally:
        await engine.aclose()
    assert [r.path for r in scripted_engine.requests] == ["/health_generate"]


async def test_health_of_an_unreachable_server_is_engine_error():
    """Nothing listening at the URL: health() raises EngineError naming the URL, promptly."""
    async with scripted_engine() as engine:
        url = engine.url
    client = SGLangEngine(url, health_timeout=5.0)
    try:
        with pytest.raises(EngineError, match="unreachable") as info:
            await asyncio.wait_for(client.health(), 10)
        assert url in str(info.value)
    finally:
        await client.aclose()


# -- scripted engine --------------------------------------------------------------


async def test_scripted_engine_records_headers_and_validates_input(scripted_engine):
    """Bad input_ids get HTTP 400; every request is recorded with body and headers."""
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{scripted_engine.url}/generate",
            json={"input_ids": ["a"]},
            headers={"X-Test": "1"},
        ) as response:
            assert response.status == 400
            assert "input_ids" in (await response.json())["error"]["message"]
        async with http.post(f"{scripted_engine.url}/generate", data=b"{not json") as response:
            assert response.status == 400
    assert [r.body for r in scripted_engine.requests] == [{"input_ids": ["a"]}, None]
    assert scripted_engine.requests[0].headers["X-Test"] == "1"


async def test_scripted_engine_response_shape(scripted_engine, qwen_tokenizer):
    """The raw /generate reply has SGLang's text, output_ids and meta_info fields."""
    scripted_engine.queue("<think>\nhm\n</think>\n\nok")
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{scripted_engine.url}/generate",
            json={
                "input_ids": [1, 2],
                "return_logprob": True,
                "rid": "x",
                "sampling_params": {"skip_special_tokens": False},
            },
        ) as response:
            data = json.loads(await response.text())
    meta = data["meta_info"]
    assert data["text"] == "<think>\nhm\n</think>\n\nok<|im_end|>"
    assert meta["id"] == "x" and meta["finish_reason"]["type"] == "stop"
    assert [e[1] for e in meta["output_token_logprobs"]] == data["output_ids"]
    assert all(e[2] is None for e in meta["output_token_logprobs"])
    assert meta["completion_tokens"] == len(data["output_ids"])


async def test_scripted_engine_responder_and_pending(qwen_tokenizer):
    """A responder answers when queues are empty; pending() counts queued replies."""
    from agentrl.testing.scripted_engine import ScriptedReply

    def responder(body, headers):
        return ScriptedReply(ids=[len(body["input_ids"])], eos=False)

    async with ScriptedEngine(qwen_tokenizer, responder=responder) as engine:
        engine.queue("queued")
        assert engine.pending() == 1
        client = SGLangEngine(engine.url)
        try:
            first = await client.generate([1], {})
            second = await client.generate([1, 2, 3], {})
        finally:
            await client.aclose()
        assert engine.pending() == 0
        assert first.output_ids[-1] == IM_END
        assert second.output_ids == (3,)


def test_scripted_reply_validation():
    """A reply needs exactly one of text/ids and a known finish reason."""
    from agentrl.testing.scripted_engine import ScriptedReply

    with pytest.raises(ValueError, match="exactly one"):
        ScriptedReply()
    with pytest.raises(ValueError, match="finish_reason"):
        ScriptedReply(ids=[1], finish_reason="eos")


# -- registry ------------------------------------------------------------------------


def test_the_built_in_engines_are_registered():
    """The built-in plugin registers the sglang, transformers and vllm engines."""
    registry = plugins.PluginRegistry(builtins=("agentrl.engines",), load_entrypoints=False)
    assert registry.available("engine") == ["sglang", "transformers", "vllm"]
    assert registry.get("engine", "sglang") is SGLangEngine
    assert registry.get("engine", "transformers").name == "transformers"


# -- transformers engine -------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, qwen_tokenizer):
    """A tiny randomly initialised Qwen3 causal LM with the Qwen vocabulary, saved locally."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=len(qwen_tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=512,
        eos_token_id=IM_END,
        tie_word_embeddings=True,
    )
    model = Qwen3ForCausalLM(config)
    path = tmp_path_factory.mktemp("tiny-qwen3")
    model.save_pretrained(path)
    return path


@pytest.fixture
async def hf_engine(tiny_model_dir):
    """The transformers engine over the tiny model."""
    from agentrl.engines.transformers import TransformersEngine

    engine = TransformersEngine(tiny_model_dir, seed=1234)
    try:
        yield engine
    finally:
        await engine.aclose()


def _reference_logprobs(model_dir, prompt, output, temperature, top_k=-1, top_p=1.0):
    """Log-probs of ``output`` under the filtered sampling distribution, by a full forward."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True).eval()
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + output])).logits[0].float()
    result = []
    for i, token in enumerate(output):
        scores = logits[len(prompt) - 1 + i] / temperature
        if top_k > 0:
            kth = torch.topk(scores, top_k).values[-1]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if top_p < 1.0:
            sorted_scores, order = torch.sort(scores, descending=True)
            probs = torch.softmax(sorted_scores, dim=-1)
            drop = torch.cumsum(probs, dim=-1) - probs >= top_p
            scores = scores.scatter(0, order, sorted_scores.masked_fill(drop, float("-inf")))
        result.append(float(torch.log_softmax(scores, dim=-1)[token]))
    return result


async def test_transformers_engine_logprobs_match_a_full_forward(hf_engine, tiny_model_dir):
    """Each sampled token's log-prob equals its log-prob under the filtered distribution."""
    prompt = [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198]
    params = {"max_new_tokens": 6, "temperature": 0.8, "top_k": 50, "top_p": 0.9}
    gen = await hf_engine.generate(prompt, params)
    assert len(gen.output_ids) == len(gen.logprobs) >= 1
    expected = _reference_logprobs(
        tiny_model_dir, prompt, list(gen.output_ids), 0.8, top_k=50, top_p=0.9
    )
    assert gen.logprobs == pytest.approx(expected, abs=1e-4)
    assert all(lp <= 0.0 for lp in gen.logprobs)
    assert gen.finish_reason in ("stop", "length")


async def test_transformers_engine_is_deterministic_with_a_seed(hf_engine):
    """The same sampling_seed gives the same tokens; greedy reports log-prob 0."""
    params = {"max_new_tokens": 5, "temperature": 1.0, "sampling_seed": 7}
    first = await hf_engine.generate([1, 2, 3], params)
    second = await hf_engine.generate([1, 2, 3], params)
    assert first.output_ids == second.output_ids
    greedy = await hf_engine.generate([1, 2, 3], {"max_new_tokens": 3, "temperature": 0})
    assert greedy.logprobs == (0.0,) * len(greedy.output_ids)


async def test_transformers_engine_stops_on_stop_token_ids(hf_engine):
    """A token in stop_token_ids ends generation with 'stop' and is included."""
    greedy = await hf_engine.generate([1, 2, 3], {"max_new_tokens": 4, "temperature": 0})
    assert greedy.finish_reason == "length" and len(greedy.output_ids) == 4
    first = greedy.output_ids[0]
    stopped = await hf_engine.generate(
        [1, 2, 3], {"max_new_tokens": 4, "temperature": 0, "stop_token_ids": [first]}
    )
    assert stopped.output_ids == (first,)
    assert stopped.finish_reason == "stop"


async def test_transformers_engine_runs_off_the_event_loop(hf_engine):
    """While a long generation runs, the event loop keeps serving other coroutines."""
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    tick_task = asyncio.create_task(ticker())
    try:
        await hf_engine.generate([1, 2], {"max_new_tokens": 40, "temperature": 1.0})
    finally:
        tick_task.cancel()
    assert ticks > 10


async def test_transformers_engine_abort(hf_engine):
    """abort(rid) before or during decoding ends the request with finish 'abort'."""
    await hf_engine.abort("hf-0")
    gen = await hf_engine.generate([1], {"max_new_tokens": 50}, rid="hf-0")
    assert gen.finish_reason == "abort"
    assert gen.output_ids == ()


async def test_transformers_engine_cancellation_frees_the_worker(hf_engine):
    """Cancelling a huge generation stops it, so the next request is served promptly."""
    task = asyncio.create_task(
        hf_engine.generate([1], {"max_new_tokens": 100_000, "ignore_eos": True}, rid="hf-1")
    )
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    gen = await asyncio.wait_for(hf_engine.generate([1], {"max_new_tokens": 2}), 30)
    assert len(gen.output_ids) <= 2


async def test_transformers_engine_is_healthy_until_closed(tiny_model_dir):
    """The in-process engine is ready once built (the model loads on first use) until aclose()."""
    from agentrl.engines.transformers import TransformersEngine

    engine = TransformersEngine(tiny_model_dir)
    await engine.health()
    await engine.aclose()
    with pytest.raises(EngineError, match="closed"):
        await engine.health()


async def test_transformers_engine_that_failed_to_load_is_unhealthy(tmp_path):
    """A directory whose model cannot load makes health() report the load error."""
    from agentrl.engines.transformers import TransformersEngine

    (tmp_path / "config.json").write_text("{}")
    engine = TransformersEngine(tmp_path)
    try:
        with pytest.raises(EngineError, match="could not load"):
            await engine.generate([1], {"max_new_tokens": 1})
        with pytest.raises(EngineError, match="could not load"):
            await engine.health()
    finally:
        await engine.aclose()


def test_transformers_engine_requires_a_local_directory(tmp_path):
    """A hub id or missing directory is refused with a message saying what to do."""
    from agentrl.engines.transformers import TransformersEngine

    with pytest.raises(EngineError, match="local model directory"):
        TransformersEngine("Qwen/Qwen3-0.6B")
    with pytest.raises(EngineError, match="local model directory"):
        TransformersEngine(tmp_path)


def test_transformers_engine_is_built_from_the_generic_model_path_option(tmp_path):
    """It needs ``model_path`` (not a URL), and its options are its keyword parameters."""
    from agentrl.engines.transformers import TransformersEngine

    with pytest.raises(MissingEngineOptionError, match="needs model_path") as info:
        TransformersEngine.from_options(url="http://127.0.0.1:9")
    assert info.value.for_flags({"url": "--engine-url", "model_path": "--model"}) == (
        "--engine transformers needs --model (a local model directory)"
    )
    TransformersEngine.check_options({"seed": 1, "device": "cpu"}, model_path=str(tmp_path))
    with pytest.raises(OptionsError, match="'sed' \\(did you mean 'seed'"):
        TransformersEngine.check_options({"sed": 1}, model_path=str(tmp_path))
    with pytest.raises(EngineError, match="local model directory"):
        TransformersEngine.from_options(model_path=str(tmp_path))
