"""Bad input and failures: each answered in its protocol's error shape, never with a traceback."""

from __future__ import annotations

import json

import pytest

from agentrl.adapters.anthropic import AnthropicAdapter
from agentrl.engines.sglang import SGLangEngine
from agentrl.serve.middleware import Middleware

pytest_plugins = ("middleware_fixtures",)

ROUTES = {
    "anthropic": (
        "/v1/messages",
        {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]},
    ),
    "openai_responses": ("/v1/responses", {"model": "m", "input": "hi"}),
    "openai_chat": (
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    ),
}


def error_message(protocol: str, body: dict) -> str:
    """The message of an error body, checking the protocol's shape."""
    if protocol == "anthropic":
        assert body["type"] == "error"
        assert set(body["error"]) == {"type", "message"}
    else:
        assert set(body["error"]) >= {"message", "type", "param", "code"}
    assert "Traceback" not in body["error"]["message"]
    return body["error"]["message"]


async def send(http, mw, protocol, *, data=None, body=None, token="", status):
    path, default = ROUTES[protocol]
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    payload = data if data is not None else json.dumps(default if body is None else body)
    async with http.post(mw.url + path, data=payload, headers=headers) as response:
        text = await response.text()
        assert response.status == status, text
        assert response.headers["Content-Type"].startswith("application/json")
        return error_message(protocol, json.loads(text))


@pytest.mark.parametrize("protocol", sorted(ROUTES))
async def test_malformed_json_is_400_in_the_protocol_shape(protocol, middleware, http):
    """A body that is not JSON is a 400 invalid_request_error saying so."""
    token = middleware.open_session("s")
    message = await send(http, middleware, protocol, data=b'{"model": ', token=token, status=400)
    assert "not valid JSON" in message


@pytest.mark.parametrize(
    ("protocol", "body", "field"),
    [
        (
            "anthropic",
            {"messages": [{"role": "user", "content": "x"}], "max_tokens": "many"},
            "max_tokens",
        ),
        ("anthropic", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ("anthropic", {"messages": "hello"}, "messages"),
        (
            "anthropic",
            {"messages": [{"role": "user", "content": "x"}], "tools": [{"name": 3}]},
            "tools[0].name",
        ),
        ("openai_responses", {"input": 5}, "input"),
        (
            "openai_responses",
            {"input": [{"type": "function_call", "name": "f", "arguments": {}}]},
            "input[0].arguments",
        ),
        ("openai_responses", {"input": "x", "temperature": "hot"}, "temperature"),
        (
            "openai_chat",
            {"messages": [{"role": "user", "content": "x"}], "stream": "yes"},
            "stream",
        ),
        ("openai_chat", {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        (
            "openai_chat",
            {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": 1}}]}]},
            "messages[0].tool_calls[0].function.name",
        ),
    ],
)
async def test_wrong_field_type_is_400_naming_the_field(
    protocol, body, field, middleware, scripted_engine, http
):
    """A field of the wrong type is rejected before the engine is called, and named."""
    token = middleware.open_session("s")
    message = await send(http, middleware, protocol, body=body, token=token, status=400)
    assert message.startswith(f"{field}:"), message
    assert scripted_engine.generate_requests == []


@pytest.mark.parametrize("protocol", sorted(ROUTES))
async def test_oversized_body_is_413(protocol, middleware, http):
    """A body over the session's cap (here max_body_bytes, the ceiling) is a 413 naming it."""
    token = middleware.open_session("s")
    assert middleware.body_limit("s") == middleware.max_body_bytes
    body = ROUTES[protocol][1]
    huge = json.dumps({**body, "padding": "x" * (middleware.max_body_bytes + 10)})
    message = await send(http, middleware, protocol, data=huge, token=token, status=413)
    assert str(middleware.max_body_bytes) in message


@pytest.mark.parametrize("protocol", sorted(ROUTES))
async def test_engine_error_is_502_and_other_sessions_keep_working(
    protocol, middleware, scripted_engine, http
):
    """An engine failure is a 5xx the client reports; the turn is not recorded; others go on."""
    broken = middleware.open_session("broken")
    healthy = middleware.open_session("healthy")
    scripted_engine.fail_next(500, "CUDA out of memory", session="broken")
    scripted_engine.queue("fine", session="healthy")
    message = await send(http, middleware, protocol, token=broken, status=502)
    assert "inference engine failed" in message and "HTTP 500" in message
    assert not middleware.trajectory.has_session("broken")
    path, body = ROUTES[protocol]
    async with http.post(
        middleware.url + path, json=body, headers={"Authorization": f"Bearer {healthy}"}
    ) as response:
        assert response.status == 200
    assert middleware.trajectory.turn_count("healthy") == 1


async def test_unreachable_engine_is_502(qwen_tokenizer, http):
    """With nothing listening at the engine URL, the client gets 502 naming the problem."""
    engine = SGLangEngine("http://127.0.0.1:9")
    mw = Middleware(engine=engine, tokenizer=qwen_tokenizer, adapters=[AnthropicAdapter()])
    await mw.start()
    try:
        token = mw.open_session("s")
        message = await send(http, mw, "anthropic", token=token, status=502)
        assert "engine" in message
    finally:
        await mw.close()
        await engine.aclose()


class ExplodingAdapter(AnthropicAdapter):
    """An adapter with a bug: the middleware must answer 500 without leaking the traceback."""

    def parse_request(self, body, headers):
        raise RuntimeError("secret internal detail")


async def test_internal_error_is_500_without_traceback(qwen_tokenizer, sglang_client, http, caplog):
    """An unexpected exception is logged with its traceback; the client sees a plain 500."""
    mw = Middleware(engine=sglang_client, tokenizer=qwen_tokenizer, adapters=[ExplodingAdapter()])
    await mw.start()
    try:
        token = mw.open_session("s")
        message = await send(http, mw, "anthropic", token=token, status=500)
        assert "secret internal detail" not in message
        assert "internal error" in message
        assert "secret internal detail" in caplog.text
    finally:
        await mw.close()


async def test_conversation_the_template_rejects_is_400(qwen_tokenizer_dir, sglang_client, http):
    """A chat template that raises on the history is a 400 quoting it (turn and count_tokens)."""
    from transformers import PreTrainedTokenizerFast

    strict = PreTrainedTokenizerFast.from_pretrained(str(qwen_tokenizer_dir), local_files_only=True)
    strict.chat_template = (
        "{% if messages|length > 1 %}{{ raise_exception('one message only, please') }}{% endif %}"
        "{{ messages[0].content }}"
    )
    mw = Middleware(engine=sglang_client, tokenizer=strict, adapters=[AnthropicAdapter()])
    await mw.start()
    try:
        token = mw.open_session("s")
        body = {
            "model": "m",
            "messages": [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"},
            ],
        }
        message = await send(http, mw, "anthropic", body=body, token=token, status=400)
        assert "one message only, please" in message
        headers = {"Authorization": f"Bearer {token}"}
        url = mw.url + "/v1/messages/count_tokens"
        async with http.post(url, json=body, headers=headers) as response:
            assert response.status == 400, await response.text()
            assert "one message only, please" in error_message("anthropic", await response.json())
    finally:
        await mw.close()


async def test_client_gone_while_replying_is_not_an_internal_error(
    qwen_tokenizer, sglang_client, scripted_engine, http, caplog, monkeypatch
):
    """A reply that cannot be written is logged as a warning, not an error; nothing is recorded.

    Writing fails as aiohttp's does when the client is gone (the transport is closing).
    """

    async def vanishing(request, reply):
        raise ConnectionResetError("Cannot write to closing transport")

    monkeypatch.setattr("agentrl.serve.replies.write_reply", vanishing)
    mw = Middleware(engine=sglang_client, tokenizer=qwen_tokenizer)
    await mw.start()
    try:
        token = mw.open_session("s")
        scripted_engine.queue("never delivered")
        path, body = ROUTES["anthropic"]
        headers = {"Authorization": f"Bearer {token}"}
        async with http.post(mw.url + path, json=body, headers=headers) as response:
            assert response.status == 499
        assert not mw.trajectory.has_session("s")
        assert "client went away" in caplog.text
        assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text
    finally:
        await mw.close()


def test_an_adapter_route_of_unknown_kind_is_refused_at_construction(qwen_tokenizer):
    """A plugin adapter whose route kind is neither 'turn' nor 'count' fails before serving."""

    class Misrouted(AnthropicAdapter):
        name = "misrouted"
        routes = (("POST", "/v1/messages", "stream"),)

    with pytest.raises(ValueError, match="'misrouted': route kind must be one of"):
        Middleware(engine=None, tokenizer=qwen_tokenizer, adapters=[Misrouted()])


async def test_healthz_reflects_the_engine(middleware, scripted_engine, http):
    """/healthz is 200 while the engine answers its health check and 503 with the reason after."""
    async with http.get(middleware.url + "/healthz") as response:
        assert response.status == 200 and (await response.json())["ok"] is True
    assert [r.path for r in scripted_engine.requests] == ["/health"]
    scripted_engine.health_status = 503
    async with http.get(middleware.url + "/healthz") as response:
        assert response.status == 503
        body = await response.json()
    assert body["ok"] is False and body["error"]["type"] == "engine_unavailable"
    assert "HTTP 503" in body["error"]["message"]
    for path in ("/", "/api/hello"):  # connectivity probes: the middleware itself is up
        async with http.head(middleware.url + path) as response:
            assert response.status == 200


async def test_healthz_of_an_unreachable_engine_is_503(qwen_tokenizer, http):
    """With nothing listening at the engine URL, /healthz says 503 and names the URL."""
    engine = SGLangEngine("http://127.0.0.1:9")
    mw = Middleware(engine=engine, tokenizer=qwen_tokenizer, adapters=[AnthropicAdapter()])
    await mw.start()
    try:
        async with http.get(mw.url + "/healthz") as response:
            assert response.status == 503
            body = await response.json()
        assert "unreachable" in body["error"]["message"]
        assert "http://127.0.0.1:9" in body["error"]["message"]
    finally:
        await mw.close()
        await engine.aclose()


@pytest.mark.parametrize(
    ("method", "path", "status", "protocol"),
    [
        ("POST", "/v1/messages/batches", 404, "anthropic"),
        ("GET", "/v1/messages", 405, "anthropic"),
        ("POST", "/v1/responses/resp_1/cancel", 404, "openai_responses"),
        ("GET", "/v1/responses", 405, "openai_responses"),
        ("POST", "/v1/chat/other", 404, "openai_chat"),
        ("GET", "/v1/chat/completions", 405, "openai_chat"),
        ("POST", "/v1/embeddings", 404, "openai_chat"),  # no owner: the OpenAI shape
        ("GET", "/nowhere", 404, "openai_chat"),
    ],
)
async def test_unknown_routes_and_methods_answer_json(
    middleware, http, method, path, status, protocol
):
    """A path nobody serves is a JSON 404 (a wrong method a 405) in its protocol's error shape."""
    async with http.request(method, middleware.url + path, json={}) as response:
        assert response.status == status
        assert response.headers["Content-Type"].startswith("application/json")
        message = error_message(protocol, await response.json())
    assert f"{method} {path}" in message
    if status == 405:
        assert response.headers["Allow"] == "POST" and "use POST" in message
    else:
        assert "POST /v1/messages" in message  # says what is served


@pytest.mark.parametrize(
    ("protocol", "extra", "field", "says"),
    [
        (
            "openai_responses",
            {"previous_response_id": "resp_1"},
            "previous_response_id",
            "full history",
        ),
        ("openai_responses", {"conversation": "conv_1"}, "conversation", "stateless"),
        (
            "openai_responses",
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}},
            "text.format",
            "structured output",
        ),
        ("openai_responses", {"top_logprobs": 5}, "top_logprobs", "log-probs"),
        ("openai_responses", {"include": ["message.output_text.logprobs"]}, "include", "log-probs"),
        (
            "openai_chat",
            {"response_format": {"type": "json_object"}},
            "response_format",
            "structured",
        ),
        ("openai_chat", {"logprobs": True, "top_logprobs": 2}, "logprobs", "log-probs"),
    ],
)
async def test_unsupported_options_are_400_not_ignored(
    protocol, extra, field, says, middleware, scripted_engine, http
):
    """Server-side state, structured output and log-probs are refused clearly, before the engine."""
    token = middleware.open_session("s")
    body = {**ROUTES[protocol][1], **extra}
    message = await send(http, middleware, protocol, body=body, token=token, status=400)
    assert message.startswith(f"{field}:") and says in message, message
    assert scripted_engine.generate_requests == []
