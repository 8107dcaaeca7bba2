"""The middleware: sessions, tokens, turn cap, lock, context budget, sampling policy, aborts."""

from __future__ import annotations

import asyncio
import base64
import json

import aiohttp
import pytest
from middleware_support import anthropic_message, parse_sse, responses_object

from agentrl import hookimpl
from agentrl.serve.middleware import Middleware
from agentrl.testing.scripted_engine import ScriptedReply
from agentrl.types import TurnFact, TurnRecordedEvent

pytest_plugins = ("middleware_fixtures",)

HELLO = {"model": "policy", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}


def template_ids(tokenizer, messages) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def post(http, mw, path, body, headers, **kwargs):
    async with http.post(mw.url + path, json=body, headers=headers, **kwargs) as response:
        text = await response.text()
        return response.status, text


async def test_session_tokens_are_unguessable_and_accepted_as_bearer_or_api_key(
    middleware, scripted_engine, http
):
    """Tokens are long and random; Claude Code's Bearer and x-api-key forms both authenticate."""
    tokens = {middleware.open_session(f"s{i}") for i in range(50)}
    assert len(tokens) == 50
    assert all(len(t) >= 32 for t in tokens)
    token = middleware.open_session("auth")
    scripted_engine.queue("one")
    scripted_engine.queue("two")
    status, _ = await post(http, middleware, "/v1/messages", HELLO, bearer(token))
    assert status == 200
    status, _ = await post(http, middleware, "/v1/messages", HELLO, {"x-api-key": token})
    assert status == 200
    assert middleware.trajectory.turn_count("auth") == 2
    with pytest.raises(ValueError, match="already open"):
        middleware.open_session("auth")


async def test_unknown_or_missing_token_is_401_in_each_protocol_shape(
    middleware, scripted_engine, http
):
    """A wrong key gets 401 as Anthropic's or OpenAI's error object; the engine is never called."""
    status, text = await post(http, middleware, "/v1/messages", HELLO, bearer("nope"))
    assert status == 401
    body = json.loads(text)
    assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
    status, text = await post(
        http,
        middleware,
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}]},
        {},
    )
    assert status == 401
    assert "Authorization: Bearer" in json.loads(text)["error"]["message"]
    status, text = await post(http, middleware, "/v1/responses", {"input": "x"}, bearer("nope"))
    assert status == 401 and json.loads(text)["error"]["type"] == "invalid_api_key"
    assert scripted_engine.generate_requests == []


async def test_finished_session_returns_samples_then_refuses_with_403(
    middleware, scripted_engine, http
):
    """finish_session yields the trained sample; a straggler request on it gets a clear 403."""
    token = middleware.open_session("done")
    scripted_engine.queue("All done.")
    status, _ = await post(http, middleware, "/v1/messages", HELLO, bearer(token))
    assert status == 200
    samples = await middleware.finish_session("done", reward=0.5, metadata={"task": "t1"})
    assert len(samples) == 1
    served = scripted_engine.served[0]
    assert samples[0].tokens[samples[0].prompt_length :] == served.output_ids
    assert samples[0].rollout_logprobs == served.logprobs
    assert samples[0].reward == 0.5 and samples[0].metadata["task"] == "t1"
    status, text = await post(http, middleware, "/v1/messages", HELLO, bearer(token))
    assert status == 403
    assert "closed" in json.loads(text)["error"]["message"]
    assert await middleware.finish_session("done", reward=0.0) == []
    await middleware.drop_session("done")  # idempotent


async def test_finish_session_truncates_samples_to_max_sample_tokens(
    middleware, scripted_engine, http
):
    """An explicit max_sample_tokens cuts the sample from the end, keeping the prompt."""
    token = middleware.open_session("cut")
    scripted_engine.queue("one two three four five six seven eight")
    status, _ = await post(http, middleware, "/v1/messages", HELLO, bearer(token))
    assert status == 200
    served = scripted_engine.served[0]
    prompt = len(served.input_ids)
    samples = await middleware.finish_session("cut", reward=1.0, max_sample_tokens=prompt + 3)
    assert len(samples) == 1
    assert samples[0].prompt_length == prompt and samples[0].response_length == 3
    assert samples[0].tokens[prompt:] == served.output_ids[:3]


async def test_only_the_latest_closed_tokens_are_remembered(middleware, http, monkeypatch):
    """A long-running middleware forgets the oldest closed tokens: 403 turns into 401 for them."""
    monkeypatch.setattr("agentrl.serve.sessions.CLOSED_TOKENS_KEPT", 2)
    tokens = [middleware.open_session(f"old-{i}") for i in range(3)]
    for i in range(3):
        await middleware.drop_session(f"old-{i}")
    statuses = [(await post(http, middleware, "/v1/messages", HELLO, bearer(t)))[0] for t in tokens]
    assert statuses == [401, 403, 403]


async def test_turn_cap_answers_429_without_calling_the_engine(middleware, scripted_engine, http):
    """With max_turns=2, the third request is refused with 429 rate_limit_error."""
    token = middleware.open_session("capped", max_turns=2)
    scripted_engine.queue("a")
    scripted_engine.queue("b")
    for _ in range(2):
        assert (await post(http, middleware, "/v1/messages", HELLO, bearer(token)))[0] == 200
    status, text = await post(http, middleware, "/v1/messages", HELLO, bearer(token))
    assert status == 429
    assert json.loads(text)["error"]["type"] == "rate_limit_error"
    assert len(scripted_engine.generate_requests) == 2


async def test_turns_of_one_session_never_interleave_but_sessions_run_concurrently(
    middleware, scripted_engine, http
):
    """Two requests on one session are served one after the other; another session is not held up."""
    token_a = middleware.open_session("a")
    token_b = middleware.open_session("b")
    scripted_engine.queue("first", delay=0.4, session="a")
    scripted_engine.queue("second", session="a")
    scripted_engine.queue("other", session="b")
    first = asyncio.create_task(post(http, middleware, "/v1/messages", HELLO, bearer(token_a)))
    await scripted_engine.wait_for(lambda: len(scripted_engine.generate_requests) == 1)
    second = asyncio.create_task(post(http, middleware, "/v1/messages", HELLO, bearer(token_a)))
    other = asyncio.create_task(post(http, middleware, "/v1/messages", HELLO, bearer(token_b)))
    assert (await other)[0] == 200
    assert not first.done(), "session b waited for session a's slow turn"
    assert (await first)[0] == 200 and (await second)[0] == 200
    keys = [r.headers.get("X-SMG-Routing-Key") for r in scripted_engine.generate_requests]
    assert keys == ["a", "b", "a"]
    served_a = [g for g in scripted_engine.served if g.routing_key == "a"]
    assert [len(g.output_ids) for g in served_a] == [2, 2]  # "first"/"second" + EOS, in order


async def test_context_budget_clamps_max_new_tokens_and_overflow_skips_the_engine(
    middleware, scripted_engine, qwen_tokenizer, http
):
    """max_new_tokens = budget - prompt; a prompt at the budget finishes 'length' with no engine call."""
    prompt_len = len(template_ids(qwen_tokenizer, HELLO["messages"]))
    token = middleware.open_session(
        "budget", max_context_tokens=prompt_len + 5, sampling_defaults={"max_new_tokens": 1000}
    )
    scripted_engine.queue("x " * 20)
    status, text = await post(http, middleware, "/v1/messages", HELLO, bearer(token))
    assert status == 200
    assert json.loads(text)["stop_reason"] == "max_tokens"
    assert scripted_engine.generate_requests[0].body["sampling_params"]["max_new_tokens"] == 5
    tight = middleware.open_session("tight", max_context_tokens=prompt_len)
    status, text = await post(http, middleware, "/v1/messages", HELLO, bearer(tight))
    assert status == 200
    reply = json.loads(text)
    assert reply["stop_reason"] == "max_tokens" and reply["usage"]["output_tokens"] == 0
    assert len(scripted_engine.generate_requests) == 1


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("trainer", {"temperature": 0.7, "top_p": 1.0}),
        ("client", {"temperature": 0.2, "top_p": 0.5}),
    ],
)
async def test_sampling_policy_decides_whose_temperature_wins(
    policy, expected, middleware, scripted_engine, http
):
    """Trainer values win by default (client overrides would skew log-prob ratios); 'client' flips it."""
    token = middleware.open_session(
        policy,
        sampling_defaults={"temperature": 0.7, "top_p": 1.0, "max_new_tokens": 50},
        sampling_policy=policy,
    )
    scripted_engine.queue("ok")
    body = {**HELLO, "temperature": 0.2, "top_p": 0.5, "max_tokens": 30}
    assert (await post(http, middleware, "/v1/messages", body, bearer(token)))[0] == 200
    params = scripted_engine.generate_requests[0].body["sampling_params"]
    assert {k: params[k] for k in expected} == expected
    assert params["max_new_tokens"] == 30  # the client may only lower it
    assert params["skip_special_tokens"] is False


async def test_client_disconnect_aborts_the_engine_request_and_records_nothing(
    middleware, scripted_engine, http
):
    """A client that goes away mid-generation triggers one /abort_request; the turn is not recorded."""
    token = middleware.open_session("gone")
    scripted_engine.queue("slow answer", delay=30)
    with pytest.raises(asyncio.TimeoutError):
        await post(
            http,
            middleware,
            "/v1/messages",
            HELLO,
            bearer(token),
            timeout=aiohttp.ClientTimeout(total=0.5),
        )
    await scripted_engine.wait_for(lambda: bool(scripted_engine.abort_requests), timeout=10)
    rid = scripted_engine.generate_requests[0].body["rid"]
    assert scripted_engine.abort_requests[0].body == {"rid": rid}
    assert not middleware.trajectory.has_session("gone")
    scripted_engine.queue("fine")
    assert (await post(http, middleware, "/v1/messages", HELLO, bearer(token)))[0] == 200
    assert middleware.trajectory.turn_count("gone") == 1
    # The next turn waited for the cancelled one to let go of the session: one abort in all.
    assert len(scripted_engine.abort_requests) == 1


async def test_observer_hook_receives_each_recorded_turn(
    agentrl_registry, middleware, scripted_engine, http
):
    """A plugin's on_turn_recorded gets a frozen TurnRecordedEvent per recorded turn."""
    events: list[TurnRecordedEvent] = []

    class Observer:
        @hookimpl
        def on_turn_recorded(self, event):
            events.append(event)

    agentrl_registry.pm.register(Observer(), name="observer")
    token = middleware.open_session("observed")
    scripted_engine.queue("hello there")
    assert (await post(http, middleware, "/v1/messages", HELLO, bearer(token)))[0] == 200
    assert len(events) == 1
    event = events[0]
    assert (event.session_id, event.turn_index, event.protocol) == ("observed", 0, "anthropic")
    assert event.output_tokens == len(scripted_engine.served[0].output_ids)
    assert event.prompt_tokens == len(scripted_engine.served[0].input_ids)


async def test_session_keeps_each_recorded_turns_facts_after_it_closes(
    middleware, scripted_engine, http
):
    """session(sid).turn_facts lists every recorded turn (not a failed one); finish keeps it.

    A turn the engine aborted and the middleware continued is one fact: the first attempt's
    prompt, both attempts' output.
    """
    token = middleware.open_session("facts")
    session = middleware.session("facts")
    scripted_engine.queue("first answer")
    scripted_engine.queue_reply(ScriptedReply(status=500, error="engine down"))
    scripted_engine.queue("cut short", finish_reason="abort")
    scripted_engine.queue(" and then finished")
    statuses = [
        (await post(http, middleware, "/v1/messages", HELLO, bearer(token)))[0] for _ in range(3)
    ]
    assert statuses == [200, 502, 200]
    first, aborted, rest = (g for g in scripted_engine.served if g.finish_reason != "error")
    await middleware.finish_session("facts", reward=0.0)

    assert session.turn_facts == [
        TurnFact(
            prompt_tokens=len(first.input_ids),
            output_tokens=len(first.output_ids),
            finish_reason="stop",
        ),
        TurnFact(
            prompt_tokens=len(aborted.input_ids),
            output_tokens=len(aborted.output_ids) + len(rest.output_ids),
            finish_reason="stop",
        ),
    ]
    with pytest.raises(KeyError, match="no open session 'facts'"):
        middleware.session("facts")


async def test_rewritten_replay_is_restored_so_every_sampled_token_trains(
    middleware, scripted_engine, http
):
    """A client that rewrites a replayed tool call (as Claude Code does) still trains it all.

    Claude Code replays an Edit with ``replace_all: false`` added first and a Bash command
    without its leading ``cd <cwd> &&``; the middleware renders the recorded message instead,
    so the policy's context is what it produced and no turn is lost to a rewrite merge.
    """
    token = middleware.open_session("rewrite")
    tools = [
        {"name": "Edit", "description": "edit", "input_schema": {"type": "object"}},
        {"name": "Bash", "description": "run", "input_schema": {"type": "object"}},
    ]
    scripted_engine.queue(
        'Fixing.\n<tool_call>\n{"name": "Edit", "arguments": {"file_path": "/w/a.py", '
        '"old_string": "x = 1", "new_string": "x = 2"}}\n</tool_call>'
    )
    body = {**HELLO, "tools": tools}
    status, text = await post(http, middleware, "/v1/messages", body, bearer(token))
    assert status == 200
    first = json.loads(text)
    call = first["content"][-1]
    rewritten = {**call, "input": {"replace_all": False, **call["input"]}}
    history = [
        *HELLO["messages"],
        {"role": "assistant", "content": [*first["content"][:-1], rewritten]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "ok"}],
        },
    ]
    scripted_engine.queue(
        'Testing.\n<tool_call>\n{"name": "Bash", "arguments": '
        '{"command": "cd /w && pytest -q"}}\n</tool_call>'
    )
    status, text = await post(
        http, middleware, "/v1/messages", {**body, "messages": history}, bearer(token)
    )
    assert status == 200
    second = json.loads(text)
    bash = second["content"][-1]
    trimmed = {**bash, "input": {"command": "pytest -q"}}
    history += [
        {"role": "assistant", "content": [*second["content"][:-1], trimmed]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": bash["id"], "content": "1 passed"}],
        },
    ]
    scripted_engine.queue("Done.")
    status, _ = await post(
        http, middleware, "/v1/messages", {**body, "messages": history}, bearer(token)
    )
    assert status == 200
    samples = await middleware.finish_session("rewrite", reward=1.0)
    assert len(samples) == 1
    sampled = sum(len(g.output_ids) for g in scripted_engine.served)
    assert sum(samples[0].loss_mask) == sampled
    restored = {
        meta["middleware_turn"]: meta["restored_replays"]
        for meta in samples[0].metadata["turn_metadata"].values()
    }
    assert restored == {0: [], 1: [1], 2: [1, 3]}


async def test_malformed_tool_call_stays_visible_and_marks_the_turn_ill_formed(
    middleware, scripted_engine, http
):
    """A tool call the parser cannot read is answered as text, trained, and flagged ill_formed."""
    token = middleware.open_session("broken")
    tools = [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}]
    broken = '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"\n</tool_call>'
    scripted_engine.queue(f"Listing.\n{broken}")
    body = {**HELLO, "tools": tools}
    status, text = await post(http, middleware, "/v1/messages", body, bearer(token))
    assert status == 200
    reply = json.loads(text)
    assert reply["stop_reason"] == "end_turn"
    assert [b["type"] for b in reply["content"]] == ["text"]
    assert broken in reply["content"][0]["text"]
    samples = await middleware.finish_session("broken", reward=0.0)
    assert len(samples) == 1 and samples[0].metadata["ill_formed"] is True
    assert sum(samples[0].loss_mask) == len(scripted_engine.served[0].output_ids)


async def test_minted_ids_name_their_turn_and_replays_are_linked(middleware, scripted_engine, http):
    """tool_use ids and thinking signatures encode turn 0; replaying them links turn 1 to turn 0."""
    token = middleware.open_session("ids")
    tools = [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}]
    scripted_engine.queue(
        '<think>\nplan\n</think>\n\nRunning.\n<tool_call>\n{"name": "Bash", "arguments": '
        '{"command": "ls"}}\n</tool_call>'
    )
    body = {**HELLO, "tools": tools, "stream": True, "thinking": {"type": "adaptive"}}
    status, text = await post(http, middleware, "/v1/messages", body, bearer(token))
    assert status == 200
    reply = anthropic_message(parse_sse(text))
    thinking, said, call = reply["content"]
    assert thinking["thinking"] == "plan" and said["text"] == "Running."
    assert call["id"].startswith("toolu_t0n0_") and call["input"] == {"command": "ls"}
    assert reply["stop_reason"] == "tool_use"
    history = [
        *HELLO["messages"],
        {"role": "assistant", "content": reply["content"]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "a.py"}],
        },
    ]
    scripted_engine.queue("There is a.py.")
    body = {**HELLO, "tools": tools, "messages": history}
    assert (await post(http, middleware, "/v1/messages", body, bearer(token)))[0] == 200
    samples = await middleware.finish_session("ids", reward=1.0)
    assert len(samples) == 1
    meta = samples[0].metadata["turn_metadata"]
    assert meta[2]["replayed_turns"] == {"1": 0}  # message 1 is the replayed assistant turn
    assert sum(samples[0].loss_mask) == sum(len(g.output_ids) for g in scripted_engine.served)


async def test_responses_reasoning_survives_a_replay_without_its_summary(
    middleware, scripted_engine, http
):
    """encrypted_content carries the reasoning, so a replay that drops the summary still matches."""
    token = middleware.open_session("codex")
    scripted_engine.queue("<think>\nthink hard\n</think>\n\nAnswer.")
    body = {"model": "m", "input": "question?", "stream": True, "store": False}
    status, text = await post(http, middleware, "/v1/responses", body, bearer(token))
    assert status == 200
    output = responses_object(parse_sse(text))["output"]
    reasoning, message = output
    assert reasoning["type"] == "reasoning" and reasoning["summary"][0]["text"] == "think hard"
    sealed = reasoning["encrypted_content"]
    assert ".t0." in sealed
    assert base64.urlsafe_b64decode(sealed.split(".")[3] + "==").decode() == "think hard"
    replay = [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "question?"}],
        },
        {**reasoning, "summary": []},
        message,
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "more"}]},
    ]
    scripted_engine.queue("Sure.")
    body = {"model": "m", "input": replay, "stream": False}
    status, text = await post(http, middleware, "/v1/responses", body, bearer(token))
    assert status == 200 and json.loads(text)["output"][0]["content"][0]["text"] == "Sure."
    samples = await middleware.finish_session("codex", reward=1.0)
    assert len(samples) == 1
    assert samples[0].metadata["turn_metadata"][2]["replayed_turns"] == {"1": 0}


async def test_probes_health_models_and_real_token_count(middleware, qwen_tokenizer, http):
    """HEAD / and /api/hello (Claude Code's probes), /healthz, /v1/models and count_tokens answer."""
    for path in ("/", "/api/hello"):
        async with http.head(middleware.url + path) as response:
            assert response.status == 200
    async with http.get(middleware.url + "/healthz") as response:
        assert (await response.json())["ok"] is True
    async with http.get(middleware.url + "/v1/models") as response:
        assert (await response.json())["data"][0]["id"] == middleware.model_name
    token = middleware.open_session("count")
    body = {"model": "m", "system": "be brief", "messages": [{"role": "user", "content": "hi"}]}
    status, text = await post(http, middleware, "/v1/messages/count_tokens", body, bearer(token))
    expected = template_ids(
        qwen_tokenizer,
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
    )
    assert status == 200 and json.loads(text) == {"input_tokens": len(expected)}


async def test_unix_socket_serves_the_same_app(
    tmp_path, qwen_tokenizer, sglang_client, scripted_engine
):
    """start(host=None, unix_path=...) serves every route on a unix socket (sandbox bridge)."""
    path = str(tmp_path / "mw.sock")
    mw = Middleware(engine=sglang_client, tokenizer=qwen_tokenizer, adapters=["openai_chat"])
    await mw.start(host=None, unix_path=path)
    try:
        token = mw.open_session("unix")
        scripted_engine.queue("over the socket")
        connector = aiohttp.UnixConnector(path=path)
        async with aiohttp.ClientSession(connector=connector) as client:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            async with client.post(
                "http://localhost/v1/chat/completions", json=body, headers=bearer(token)
            ) as response:
                reply = await response.json()
        assert reply["choices"][0]["message"]["content"] == "over the socket"
        assert reply["choices"][0]["finish_reason"] == "stop"
    finally:
        await mw.close()


async def test_new_session_reuses_another_sessions_prompt_prefix(
    middleware, scripted_engine, qwen_tokenizer, http
):
    """A second session with the same system prompt tokenizes only what differs, ids unchanged."""
    system = "You are a careful coding agent. " * 200
    bodies = [
        {**HELLO, "system": system, "messages": [{"role": "user", "content": f"task {i}"}]}
        for i in range(2)
    ]
    for i, body in enumerate(bodies):
        token = middleware.open_session(f"prefix-{i}")
        scripted_engine.queue("ok")
        assert (await post(http, middleware, "/v1/messages", body, bearer(token)))[0] == 200
    first, second = middleware.timings
    assert first.reused_prompt_tokens == 0
    assert second.reused_prompt_tokens > 0.9 * second.prompt_tokens
    for generation, body in zip(scripted_engine.served, bodies, strict=True):
        messages = [{"role": "system", "content": system}, *body["messages"]]
        assert list(generation.input_ids) == template_ids(qwen_tokenizer, messages)


async def test_finish_waits_for_the_inflight_turn_and_drop_cancels_it(
    middleware, scripted_engine, http
):
    """finish_session lets a running turn finish and includes it; drop_session aborts one."""
    finishing = middleware.open_session("finishing")
    scripted_engine.queue("slow but kept", delay=0.3, session="finishing")
    turn = asyncio.create_task(post(http, middleware, "/v1/messages", HELLO, bearer(finishing)))
    await scripted_engine.wait_for(lambda: len(scripted_engine.generate_requests) == 1)
    samples = await middleware.finish_session("finishing", reward=1.0)
    assert (await turn)[0] == 200
    assert len(samples) == 1
    assert sum(samples[0].loss_mask) == len(scripted_engine.served[0].output_ids)

    dropping = middleware.open_session("dropping")
    scripted_engine.queue("never delivered", delay=30, session="dropping")
    turn = asyncio.create_task(post(http, middleware, "/v1/messages", HELLO, bearer(dropping)))
    await scripted_engine.wait_for(lambda: len(scripted_engine.generate_requests) == 2)
    await middleware.drop_session("dropping")
    await scripted_engine.wait_for(lambda: bool(scripted_engine.abort_requests), timeout=10)
    assert scripted_engine.abort_requests[0].body["rid"].startswith("dropping-t0-")
    with pytest.raises((aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError)):
        await turn
    assert not middleware.trajectory.has_session("dropping")
