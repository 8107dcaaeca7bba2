"""A hostile client against the middleware: every attack is a 4xx in the protocol's shape.

The policy runs inside the sandbox with its session's token, so it can send anything. Each
test names the attack and the bound it asserts, checks the status and the protocol's error
shape, that the session still serves a normal turn afterwards, and that nothing was logged
with a traceback.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

import aiohttp
import pytest

from agentrl.adapters.base import ProtocolError
from agentrl.serve import limits
from agentrl.serve.turns import Turn
from agentrl.testing.stack import started_middleware

PROTOCOLS = ("anthropic", "openai_chat", "openai_responses")
PATHS = {
    "anthropic": "/v1/messages",
    "openai_chat": "/v1/chat/completions",
    "openai_responses": "/v1/responses",
}
MAX_TOKEN_FIELDS = {
    "anthropic": ["max_tokens"],
    "openai_chat": ["max_tokens", "max_completion_tokens"],
    "openai_responses": ["max_output_tokens"],
}


def hello(protocol: str, text: str = "hi", **extra) -> dict:
    """The smallest valid request body of ``protocol`` saying ``text``."""
    if protocol == "openai_responses":
        return {"model": "m", "input": text, **extra}
    body = {"model": "m", "messages": [{"role": "user", "content": text}], **extra}
    if protocol == "anthropic":
        body.setdefault("max_tokens", 16)
    return body


def with_tool_call(protocol: str, arguments: str) -> str:
    """A valid body replaying one tool call whose arguments are the JSON text ``arguments``."""
    if protocol == "anthropic":
        call = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": "ARGS"}
        result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}
        messages = [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [call]},
            {"role": "user", "content": [result]},
        ]
        body = {"model": "m", "max_tokens": 16, "messages": messages}
        return json.dumps(body).replace('"ARGS"', arguments)
    if protocol == "openai_chat":
        call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
        messages = [
            {"role": "user", "content": "go"},
            {"role": "assistant", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ]
        return json.dumps({"model": "m", "messages": messages})
    items = [
        {"type": "message", "role": "user", "content": "go"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": arguments},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    ]
    return json.dumps({"model": "m", "input": items})


def with_system(protocol: str, system: str) -> dict:
    """A valid body with a system prompt."""
    if protocol == "anthropic":
        return hello(protocol, system=system)
    if protocol == "openai_responses":
        return hello(protocol, instructions=system)
    body = hello(protocol)
    body["messages"].insert(0, {"role": "system", "content": system})
    return body


def nested(depth: int) -> str:
    """JSON text of objects nested ``depth`` deep."""
    return '{"a": ' * depth + "{}" + "}" * depth


def error_message(protocol: str, body: dict) -> str:
    """The error's message, after checking the body has the protocol's error shape."""
    if protocol == "anthropic":
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    else:
        assert set(body["error"]) >= {"message", "type", "param", "code"}, body
    assert "Traceback" not in body["error"]["message"]
    return body["error"]["message"]


@pytest.fixture
def no_tracebacks(caplog):
    """Fails the test when anything was logged with a traceback (or at ERROR and above)."""
    caplog.set_level(logging.INFO)
    yield caplog
    bad = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not bad, [r.getMessage() for r in bad]
    assert "Traceback" not in caplog.text


@pytest.fixture
async def http():
    async with aiohttp.ClientSession(trust_env=False) as session:
        yield session


class Client:
    """One protocol's client of the middleware, with the checks every test repeats."""

    def __init__(self, protocol, middleware, engine, http):
        self.protocol, self.mw, self.engine, self.http = protocol, middleware, engine, http
        self.url = middleware.url + PATHS[protocol]

    def headers(self, token):
        return {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    async def post(self, token, *, body=None, data=None, status, path=None):
        """POST and check the status; the error message (or the JSON body on a 200)."""
        payload = data if data is not None else json.dumps(body)
        url = self.mw.url + path if path else self.url
        async with self.http.post(url, data=payload, headers=self.headers(token)) as response:
            text = await response.text()
            assert response.status == status, text
            assert response.headers["Content-Type"].startswith("application/json"), text
            parsed = json.loads(text)
        return parsed if status == 200 else error_message(self.protocol, parsed)

    async def still_usable(self, sid, token):
        """The session serves a normal turn and records it (and nothing else leaked)."""
        session = self.mw.session(sid)
        before = session.turns_recorded
        self.engine.queue("still here", session=sid)
        await self.post(token, body=hello(self.protocol), status=200)
        assert session.turns_recorded == before + 1
        assert session.turns_started == session.turns_recorded


@pytest.fixture
def client_for(agentrl_middleware, agentrl_scripted_engine, http):
    return lambda protocol: Client(protocol, agentrl_middleware, agentrl_scripted_engine, http)


async def raw_exchange(url: str, request: bytes, *, timeout: float = 5.0) -> bytes:
    """Send raw bytes to the middleware and read its answer (the status line and more)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(4096), timeout)
    finally:
        writer.close()


# -- authentication before the body ----------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("token", ["", "agentrl-not-a-session"])
async def test_unauthenticated_deep_body_is_401_without_reading_it(
    protocol, token, client_for, no_tracebacks
):
    """Attack: a 10,000-deep body with no (or a wrong) token. Bound: 401 in the protocol's
    shape, and the body is never parsed."""
    client = client_for(protocol)
    message = await client.post(token, data="[" * 10_000 + "]" * 10_000, status=401)
    assert "API key" in message
    await client.still_usable("s", client.mw.open_session("s"))


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_unauthenticated_request_is_answered_before_its_body_is_sent(
    protocol, agentrl_middleware, client_for, no_tracebacks
):
    """Attack: announce a 50 MB body without a token and send none of it. Bound: the 401
    arrives within 5 s (the server never waits for the body), with or without
    ``Expect: 100-continue`` (which gets no ``100 Continue``)."""
    for expect in (b"", b"Expect: 100-continue\r\n"):
        head = (
            f"POST {PATHS[protocol]} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Content-Length: 50000000\r\n"
        ).encode()
        answer = await raw_exchange(agentrl_middleware.url, head + expect + b"\r\n")
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
        assert b"100 Continue" not in answer
    client = client_for(protocol)
    await client.still_usable("s", agentrl_middleware.open_session("s"))


# -- body caps -------------------------------------------------------------------------


def test_body_cap_scales_with_the_context_budget_between_floor_and_ceiling():
    """The cap formula: 32 bytes per budget token, at least 4 MiB, at most the ceiling;
    an unbudgeted session counts as 262,144 tokens (8 MiB)."""
    mib = 1024 * 1024
    assert limits.body_cap(1_000, 64 * mib) == 4 * mib
    assert limits.body_cap(1_000_000, 64 * mib) == 32 * 1_000_000
    assert limits.body_cap(10_000_000, 64 * mib) == 64 * mib
    assert limits.body_cap(0, 64 * mib) == 8 * mib
    assert limits.body_cap(1_000_000, 2 * mib) == 2 * mib


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_body_over_the_session_cap_is_413_and_not_read(
    protocol, agentrl_middleware, client_for, no_tracebacks
):
    """Attack: a body over the session's cap, announced by Content-Length (answered within
    5 s without being sent) or sent chunked. Bound: 413 in the protocol's shape."""
    client = client_for(protocol)
    token = agentrl_middleware.open_session("s", max_context_tokens=8_192)
    cap = agentrl_middleware.body_limit("s")
    assert cap == limits.MIN_BODY_BYTES
    head = (
        f"POST {PATHS[protocol]} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {cap + 1}\r\n\r\n"
    ).encode()
    answer = await raw_exchange(agentrl_middleware.url, head)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert str(cap).encode() in answer

    async def chunks():
        for _ in range(cap // 65_536 + 2):
            yield b" " * 65_536

    async with client.http.post(client.url, data=chunks(), headers=client.headers(token)) as r:
        assert r.status == 413
        assert str(cap) in error_message(protocol, await r.json())
    await client.still_usable("s", token)


async def test_count_tokens_is_capped_and_counted_per_session(
    agentrl_middleware, client_for, no_tracebacks
):
    """Attack: count_tokens in a loop (a full render each, no turn recorded) and a body over
    the cap. Bound: 32 calls before the first turn, 4 more per turn, then 429; 413 over the
    cap; another session's allowance is untouched."""
    client = client_for("anthropic")
    path = "/v1/messages/count_tokens"
    token = agentrl_middleware.open_session("s", max_context_tokens=8_192)
    for _ in range(limits.COUNT_TOKENS_FREE_CALLS):
        reply = await client.post(token, body=hello("anthropic"), status=200, path=path)
        assert reply["input_tokens"] > 0
    message = await client.post(token, body=hello("anthropic"), status=429, path=path)
    assert "count_tokens" in message
    huge = json.dumps(hello("anthropic", "x" * agentrl_middleware.body_limit("s")))
    other = agentrl_middleware.open_session("other", max_context_tokens=8_192)
    await client.post(other, data=huge, status=413, path=path)
    await client.post(other, body=hello("anthropic"), status=200, path=path)
    await client.still_usable("s", token)
    await client.post(token, body=hello("anthropic"), status=200, path=path)


# -- rendering off the loop ------------------------------------------------------------


@pytest.mark.slow
async def test_a_prompt_at_its_cap_does_not_stall_other_sessions(
    agentrl_sglang_engine, agentrl_scripted_engine, qwen_tokenizer, http, no_tracebacks
):
    """Attack: one session sends a prompt at its body cap (1 MiB here, ~300k tokens: seconds
    of rendering and tokenizing). Bound: meanwhile the event loop never lags 1 s and every
    small turn of another session answers in under 1 s (it stalled for the whole render
    when rendering ran on the loop)."""
    async with started_middleware(
        agentrl_sglang_engine, qwen_tokenizer, max_body_bytes=1024 * 1024
    ) as mw:
        big_token = mw.open_session("big", max_context_tokens=32_768)
        small_token = mw.open_session("small", max_context_tokens=32_768)
        line = "def f(x): return x + 1  # a line of code. "
        body = hello("anthropic", line * ((mw.body_limit("big") - 1_000) // len(line)))
        headers = {"Authorization": f"Bearer {big_token}", "Content-Type": "application/json"}
        big = asyncio.create_task(
            http.post(mw.url + "/v1/messages", data=json.dumps(body), headers=headers)
        )
        lags, latencies = [], []
        last = time.perf_counter()
        small = Client("anthropic", mw, agentrl_scripted_engine, http)
        while not big.done():
            agentrl_scripted_engine.queue("ok", session="small")
            started = time.perf_counter()
            lags.append(started - last)
            await small.post(small_token, body=hello("anthropic"), status=200)
            latencies.append(time.perf_counter() - started)
            await asyncio.sleep(0.05)
            last = time.perf_counter() - 0.05
        response = await big
        assert response.status == 200, await response.text()
        response.release()
        assert len(latencies) >= 3, "the big prompt finished too soon to measure anything"
        assert max(latencies) < 1.0, latencies
        assert max(lags) < 1.0, lags


# -- hostile JSON ----------------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "attack",
    ["deep_body", "deep_tool_arguments", "surrogate_content", "surrogate_tool", "surrogate_system"],
)
async def test_hostile_json_is_400_before_any_stream_starts(
    protocol, stream, attack, client_for, agentrl_scripted_engine, no_tracebacks
):
    """Attack: a 10,000-deep body, 3,000-deep tool arguments inside a valid body, a lone
    surrogate ``\\ud800`` in content, tool arguments or the system prompt; with and without
    ``stream: true``. Bound: a JSON 400 in the protocol's shape (never a 500, never a
    stream that breaks after its 200), no engine call, no turn started."""
    client = client_for(protocol)
    token = client.mw.open_session("s")
    bodies = {
        "deep_body": lambda: "[" * 10_000 + "]" * 10_000,
        "deep_tool_arguments": lambda: with_tool_call(protocol, nested(3_000)),
        "surrogate_content": lambda: json.dumps(hello(protocol, "hi \ud800")),
        "surrogate_tool": lambda: with_tool_call(protocol, '{"path": "\\ud800"}'),
        "surrogate_system": lambda: json.dumps(with_system(protocol, "be \ud800 nice")),
    }
    data = bodies[attack]()
    if stream and attack != "deep_body":
        data = data[:-1] + ', "stream": true}'
    message = await client.post(token, data=data, status=400)
    assert ("deeper than" in message) or ("surrogate" in message), message
    session = client.mw.session("s")
    assert session.turns_started == 0
    assert agentrl_scripted_engine.generate_requests == []
    await client.still_usable("s", token)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("data", ["[]", '"hello"', "null", "17", "[{}]", "{", "\xff"])
async def test_a_body_that_is_not_an_object_is_400(protocol, data, client_for, no_tracebacks):
    """Attack: a body that is an array, a string, null, a number, or not JSON at all.
    Bound: 400 in the protocol's shape."""
    client = client_for(protocol)
    token = client.mw.open_session("s")
    await client.post(token, data=data.encode("latin-1"), status=400)
    await client.still_usable("s", token)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(
    "field, value",
    [
        ("model", 5),
        ("stream", "yes"),
        ("temperature", "hot"),
        ("top_k", 1.5),
        ("tools", {"not": "a list"}),
        ("tools", [17]),
        ("stop_sequences", [1, 2]),
        ("max_tokens", 1e400),
    ],
)
async def test_a_field_of_the_wrong_type_is_400(protocol, field, value, client_for, no_tracebacks):
    """Attack: fields of the wrong type (including an infinite token limit). Bound: 400 in
    the protocol's shape, never a 500."""
    client = client_for(protocol)
    token = client.mw.open_session("s")
    key = MAX_TOKEN_FIELDS[protocol][0] if field == "max_tokens" else field
    if field == "stop_sequences" and protocol != "anthropic":
        key = "stop"
    data = json.dumps(hello(protocol, **{key: value})) if value != 1e400 else None
    if data is None:
        data = json.dumps(hello(protocol)).rstrip("}") + f', "{key}": 1e400}}'
    await client.post(token, data=data, status=400)
    await client.still_usable("s", token)


@pytest.mark.parametrize(
    "protocol, field",
    [(p, f) for p, fields in MAX_TOKEN_FIELDS.items() for f in fields],
)
@pytest.mark.parametrize("value", [0, -5])
async def test_zero_or_negative_token_limit_is_400(
    protocol, field, value, client_for, agentrl_scripted_engine, no_tracebacks
):
    """Attack: ``max_tokens`` (``max_completion_tokens``, ``max_output_tokens``) of 0 or
    less. Bound: a 400 naming the field, not a silent clamp to one token."""
    client = client_for(protocol)
    token = client.mw.open_session("s")
    message = await client.post(token, body=hello(protocol, **{field: value}), status=400)
    assert message.startswith(f"{field}:"), message
    assert agentrl_scripted_engine.generate_requests == []
    await client.still_usable("s", token)


# -- started turns ---------------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_a_turn_the_client_made_fail_is_rolled_back(
    protocol, client_for, monkeypatch, no_tracebacks
):
    """Attack: a request that fails after its turn started (a render the template rejects).
    Bound: 400, and ``turns_started - turns_recorded`` stays 0 (it counts only engine or
    middleware failures, which the rollout calls infra_error)."""
    client = client_for(protocol)
    token = client.mw.open_session("s")

    def reject(self):
        raise ProtocolError(400, "cannot render this conversation: rejected")

    monkeypatch.setattr(Turn, "prompt", reject)
    await client.post(token, body=hello(protocol), status=400)
    session = client.mw.session("s")
    assert (session.turns_started, session.turns_recorded) == (0, 0)
    monkeypatch.undo()
    await client.still_usable("s", token)


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_a_client_that_goes_away_mid_turn_is_rolled_back(
    protocol, client_for, agentrl_scripted_engine, no_tracebacks
):
    """Attack: the client disconnects while the engine generates (a policy killing its own
    agent). Bound: the turn is rolled back, not left started-but-unrecorded."""
    client = client_for(protocol)
    token = client.mw.open_session("s")
    session = client.mw.session("s")
    agentrl_scripted_engine.queue("slow", delay=5.0, session="s")
    timeout = aiohttp.ClientTimeout(total=0.5)
    with pytest.raises(asyncio.TimeoutError):
        async with client.http.post(
            client.url, json=hello(protocol), headers=client.headers(token), timeout=timeout
        ):
            pass
    for _ in range(100):
        if session.turns_started == 0 and not session.inflight:
            break
        await asyncio.sleep(0.05)
    assert (session.turns_started, session.turns_recorded) == (0, 0)
    await client.still_usable("s", token)


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_an_engine_failure_still_counts_as_unrecorded(
    protocol, client_for, agentrl_scripted_engine, no_tracebacks
):
    """Not an attack: the engine failing a turn. Bound: 502, and the turn stays started but
    unrecorded, so the rollout can still call it infra_error."""
    client = client_for(protocol)
    token = client.mw.open_session("s")
    agentrl_scripted_engine.fail_next(500, "CUDA out of memory", session="s")
    await client.post(token, body=hello(protocol), status=502)
    session = client.mw.session("s")
    assert (session.turns_started, session.turns_recorded) == (1, 0)


# -- header overflow -------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param(b"X-Big: " + b"a" * 40_000 + b"\r\n", id="40KB-header-line"),
        pytest.param(b"".join(b"X-H%d: v\r\n" % i for i in range(300)), id="300-headers"),
    ],
)
async def test_header_overflow_is_400_without_a_traceback(
    headers, agentrl_middleware, client_for, no_tracebacks
):
    """Attack: a 40 KB header line, or 300 headers: past the HTTP parser's own ceilings
    (a 16 KB one is the route's 431, tests/serve/test_middleware_abuse.py). Bound: 400,
    logged on one line with no traceback (aiohttp's low-level server logged one before)."""
    request = (
        b"POST /v1/messages HTTP/1.1\r\nHost: x\r\n" + headers + b"Content-Length: 2\r\n\r\n{}"
    )
    answer = await raw_exchange(agentrl_middleware.url, request)
    assert answer.startswith(b"HTTP/1.0 400") or answer.startswith(b"HTTP/1.1 400"), answer[:80]
    assert any("Error handling request" in r.getMessage() for r in no_tracebacks.records)
    client = client_for("anthropic")
    await client.still_usable("s", agentrl_middleware.open_session("s"))


async def test_a_policy_sampling_deep_tool_arguments_gets_its_turn_recorded(
    client_for, agentrl_scripted_engine, no_tracebacks
):
    """Attack: the policy itself samples a tool call with 3,000-deep JSON arguments.
    Bound: a 200 and a recorded (ill-formed) turn, not a 500 that leaves the turn
    unrecorded (which the rollout would call infra_error, escaping the reward)."""
    client = client_for("anthropic")
    token = client.mw.open_session("s")
    call = '<tool_call>\n{"name": "f", "arguments": ' + nested(3_000) + "}\n</tool_call>"
    agentrl_scripted_engine.queue(call, session="s")
    tools = [{"name": "f", "description": "", "input_schema": {"type": "object"}}]
    body = hello("anthropic", tools=tools, max_tokens=32_000)
    await client.post(token, body=body, status=200)
    session = client.mw.session("s")
    assert (session.turns_started, session.turns_recorded) == (1, 1)
    await client.still_usable("s", token)
