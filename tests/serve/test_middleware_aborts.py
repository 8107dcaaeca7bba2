"""Engine aborts: a generation the engine aborts is continued into one whole answer.

Driven over HTTP through the real middleware, the real ``sglang`` client and the scripted
SGLang server: a queued reply that finishes with ``abort`` is SGLang's answer to an
aborted request (the tokens sampled before it), and ``/abort_request`` with ``abort_all``
aborts a request in flight, as a trainer does around a weight update.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from middleware_support import parse_reply

from agentrl.engines.base import EngineAbortedError, Generation
from agentrl.retry import RetryPolicy
from agentrl.serve.aborts import Continued, generate, join
from agentrl.testing.stack import started_middleware

pytest_plugins = ("middleware_fixtures",)

TOOL_CALL = (
    'Listing.\n<tool_call>\n{"name": "Bash", "arguments": {"command": "ls -la /workspace"}}'
    "\n</tool_call>"
)
PATHS = {
    "anthropic": "/v1/messages",
    "openai_responses": "/v1/responses",
    "openai_chat": "/v1/chat/completions",
}
SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}}
TOOLS = {
    "anthropic": [{"name": "Bash", "description": "run", "input_schema": SCHEMA}],
    "openai_responses": [
        {"type": "function", "name": "Bash", "description": "run", "parameters": SCHEMA}
    ],
    "openai_chat": [
        {
            "type": "function",
            "function": {"name": "Bash", "description": "run", "parameters": SCHEMA},
        }
    ],
}
#: No wait between attempts, for the tests of :func:`generate` alone.
NO_WAIT = RetryPolicy(base=0.0, cap=0.0)
#: Bounds every request: a turn that hangs fails the test instead of stalling it.
BOUNDED = aiohttp.ClientTimeout(total=60)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def request_body(protocol: str, text: str = "list the files", **extra) -> dict:
    """A streamed request in ``protocol``'s shape with the Bash tool."""
    body: dict = {"model": "policy", "stream": True, "tools": TOOLS[protocol], **extra}
    if protocol == "openai_responses":
        body["input"] = text
    else:
        body["messages"] = [{"role": "user", "content": text}]
    if protocol == "anthropic":
        body.setdefault("max_tokens", 256)
    return body


async def ask(http, mw, protocol: str, token: str, body: dict) -> tuple[int, str]:
    async with http.post(
        mw.url + PATHS[protocol], json=body, headers=bearer(token), timeout=BOUNDED
    ) as response:
        return response.status, await response.text()


def tool_calls(protocol: str, reply) -> tuple[list[tuple[str, dict]], str]:
    """The tool calls a reply makes, as ``(name, arguments)``, and all the text it shows."""
    if protocol == "anthropic":
        calls = [(b["name"], b["input"]) for b in reply["content"] if b["type"] == "tool_use"]
        text = "".join(b.get("text", "") for b in reply["content"])
        assert reply["stop_reason"] == ("tool_use" if calls else reply["stop_reason"])
        return calls, text
    if protocol == "openai_responses":
        calls = [
            (item["name"], json.loads(item["arguments"]))
            for item in reply["output"]
            if item["type"] == "function_call"
        ]
        text = "".join(
            part.get("text", "")
            for item in reply["output"]
            if item["type"] == "message"
            for part in item["content"]
        )
        return calls, text
    calls = [
        (call["function"]["name"], json.loads(call["function"]["arguments"]))
        for call in reply.get("tool_calls", ())
    ]
    return calls, reply.get("content") or ""


def turn_metadata(sample) -> dict[int, dict]:
    """Each trained turn's metadata, by the middleware's turn index."""
    return {m["middleware_turn"]: m for m in sample.metadata["turn_metadata"].values()}


def split_ids(tokenizer, text: str, at: str) -> tuple[list[int], list[int]]:
    """``text``'s ids cut before the first token of the substring ``at``."""
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    for cut in range(len(ids)):
        if at in tokenizer.decode(ids[: cut + 1]):
            return ids[:cut], ids[cut:]
    raise AssertionError(f"{at!r} is not in {text!r}")


@pytest.mark.parametrize("protocol", sorted(PATHS))
async def test_an_abort_mid_tool_call_is_continued_into_one_whole_tool_call(
    protocol, middleware, scripted_engine, http, qwen_tokenizer
):
    """The engine aborts inside a tool call's arguments; the client gets the whole tool call.

    The continuation sends the prompt plus the partial output under a fresh rid, with
    ``max_new_tokens`` lowered by what was sampled; the recorded turn trains the partial
    and the rest, exactly as sampled, and its metadata marks where it resumed.
    """
    token = middleware.open_session("resumed")
    partial, rest = split_ids(qwen_tokenizer, TOOL_CALL, "ls -la")
    scripted_engine.queue(ids=partial, finish_reason="abort", session="resumed")
    scripted_engine.queue(ids=rest, session="resumed")

    status, text = await ask(http, middleware, protocol, token, request_body(protocol))

    assert status == 200, text
    calls, shown = tool_calls(protocol, parse_reply(protocol, text))
    assert calls == [("Bash", {"command": "ls -la /workspace"})]
    assert "<tool_call>" not in shown and "Listing." in shown
    first, second = scripted_engine.generate_requests
    aborted, finished = scripted_engine.served
    assert (aborted.finish_reason, finished.finish_reason) == ("abort", "stop")
    assert second.body["input_ids"] == first.body["input_ids"] + partial
    budget = first.body["sampling_params"]["max_new_tokens"]
    assert second.body["sampling_params"]["max_new_tokens"] == budget - len(partial)
    assert second.body["rid"] != first.body["rid"]

    (sample,) = await middleware.finish_session("resumed", reward=1.0)
    assert sample.tokens[: sample.prompt_length] == tuple(first.body["input_ids"])
    assert sample.tokens[sample.prompt_length :] == aborted.output_ids + finished.output_ids
    assert tuple(sample.rollout_logprobs) == aborted.logprobs + finished.logprobs
    assert list(sample.loss_mask) == [1] * (len(partial) + len(finished.output_ids))
    metadata = turn_metadata(sample)[0]
    assert metadata["engine_resumes"] == [{"at": len(partial), "weight_version": "scripted"}]


async def test_an_abort_of_a_request_in_flight_is_continued(middleware, scripted_engine, http):
    """``abort_all`` while a turn waits on the engine (a weight update): the turn goes on.

    SGLang answers the aborted request with ``abort`` and what it sampled (here nothing);
    the continuation is a new request for the same prompt and the client sees the answer.
    """
    token = middleware.open_session("in-flight")
    scripted_engine.queue("never sent", delay=30, session="in-flight")
    scripted_engine.queue("Sampled under the new weights.", session="in-flight")
    turn = asyncio.create_task(
        ask(http, middleware, "anthropic", token, request_body("anthropic", stream=False))
    )
    await scripted_engine.wait_for(lambda: len(scripted_engine.generate_requests) == 1)
    async with http.post(scripted_engine.url + "/abort_request", json={"abort_all": True}):
        pass
    status, text = await turn
    assert status == 200, text
    assert json.loads(text)["content"] == [
        {"type": "text", "text": "Sampled under the new weights."}
    ]
    first, second = scripted_engine.generate_requests
    assert second.body["input_ids"] == first.body["input_ids"]
    assert [g.finish_reason for g in scripted_engine.served] == ["abort", "stop"]
    assert middleware.session("in-flight").turn_facts[0].finish_reason == "stop"
    (sample,) = await middleware.finish_session("in-flight", reward=0.0)
    assert turn_metadata(sample)[0]["engine_resumes"] == [{"at": 0, "weight_version": "scripted"}]


async def test_a_closed_session_is_not_continued(middleware, scripted_engine, http):
    """An abort that reaches a session being finished is passed on as it is, as before.

    ``finish_session`` closes the session and waits for its turn; the engine is then
    aborted (slime's end-of-step abort): nothing is resubmitted, the turn ends ``abort``.
    """
    token = middleware.open_session("closing")
    session = middleware.session("closing")
    scripted_engine.queue("never sent", delay=30, session="closing")
    scripted_engine.queue("must not be asked for", session="closing")
    turn = asyncio.create_task(
        ask(http, middleware, "anthropic", token, request_body("anthropic", stream=False))
    )
    await scripted_engine.wait_for(lambda: len(scripted_engine.generate_requests) == 1)
    finishing = asyncio.create_task(middleware.finish_session("closing", reward=0.0))
    await asyncio.sleep(0)  # one step of the task: finish_session closes the session first
    assert session.closed
    async with http.post(scripted_engine.url + "/abort_request", json={"abort_all": True}):
        pass
    status, text = await turn
    await finishing
    assert status == 200, text
    assert json.loads(text)["stop_reason"] == "end_turn"
    assert len(scripted_engine.generate_requests) == 1
    assert scripted_engine.pending("closing") == 1
    assert [fact.finish_reason for fact in session.turn_facts] == ["abort"]
    assert session.aborted_turns == 0


@pytest.mark.parametrize("protocol", sorted(PATHS))
async def test_an_engine_that_keeps_aborting_fails_the_turn_with_a_503(
    protocol, sglang_client, scripted_engine, http, qwen_tokenizer
):
    """``max_engine_aborts`` aborts in a row: a 503 in the protocol's error shape, at once.

    The turn is not recorded, the session counts it in ``aborted_turns`` and goes on
    serving.
    """
    async with started_middleware(sglang_client, qwen_tokenizer, max_engine_aborts=3) as mw:
        token = mw.open_session("drained")
        for _ in range(3):
            scripted_engine.queue("Listing the fi", finish_reason="abort", session="drained")
        status, text = await ask(http, mw, protocol, token, request_body(protocol, stream=False))

        assert status == 503, text
        body = json.loads(text)
        if protocol == "anthropic":
            assert body["type"] == "error" and body["error"]["type"] == "overloaded_error"
        else:
            assert set(body["error"]) >= {"message", "type", "param", "code"}
        assert "aborted" in body["error"]["message"] and "3 times" in body["error"]["message"]
        assert "Traceback" not in body["error"]["message"]
        assert len(scripted_engine.generate_requests) == 3
        session = mw.session("drained")
        assert (session.turns_started, session.turns_recorded, session.aborted_turns) == (1, 0, 1)
        assert not mw.trajectory.has_session("drained")

        scripted_engine.queue("Fine again.", session="drained")
        status, text = await ask(http, mw, protocol, token, request_body(protocol, stream=False))
        assert status == 200, text
        assert mw.trajectory.turn_count("drained") == 1


async def test_zero_max_engine_aborts_passes_an_abort_on_as_it_is(
    sglang_client, scripted_engine, http, qwen_tokenizer
):
    """``max_engine_aborts=0``: the aborted output reaches the client, half a tool call as text."""
    async with started_middleware(sglang_client, qwen_tokenizer, max_engine_aborts=0) as mw:
        assert mw.turns.max_engine_aborts == 0
        token = mw.open_session("as-is")
        partial, rest = split_ids(qwen_tokenizer, TOOL_CALL, "ls -la")
        scripted_engine.queue(ids=partial, finish_reason="abort", session="as-is")
        scripted_engine.queue(ids=rest, session="as-is")
        status, text = await ask(http, mw, "anthropic", token, request_body("anthropic"))
        assert status == 200, text
        reply = parse_reply("anthropic", text)
        calls, shown = tool_calls("anthropic", reply)
        assert calls == [] and reply["stop_reason"] == "end_turn"
        assert "<tool_call>" in shown
        assert len(scripted_engine.generate_requests) == 1
        assert mw.session("as-is").turn_facts[0].finish_reason == "abort"
        (sample,) = await mw.finish_session("as-is", reward=0.0)
        assert "engine_resumes" not in turn_metadata(sample)[0]


def test_max_engine_aborts_must_be_a_count(qwen_tokenizer, sglang_client):
    """A negative or fractional ``max_engine_aborts`` is refused when the middleware is built."""
    from agentrl.serve.middleware import Middleware

    for wrong in (-1, 1.5):
        with pytest.raises(ValueError, match="max_engine_aborts: expected an integer >= 0"):
            Middleware(engine=sglang_client, tokenizer=qwen_tokenizer, max_engine_aborts=wrong)


async def test_the_turn_after_a_continued_one_is_spliced(
    middleware, scripted_engine, http, qwen_tokenizer
):
    """The next turn extends the continued turn's exact ids: prompt, partial, rest, then the
    tool result; no fallback to a full render, one sample training every sampled token."""
    token = middleware.open_session("spliced")
    partial, rest = split_ids(qwen_tokenizer, TOOL_CALL, "ls -la")
    scripted_engine.queue(ids=partial, finish_reason="abort", session="spliced")
    scripted_engine.queue(ids=rest, session="spliced")
    scripted_engine.queue("Two files.", session="spliced")
    messages = [{"role": "user", "content": "list the files"}]
    body = {"model": "policy", "messages": messages, "tools": TOOLS["openai_chat"]}
    status, text = await ask(http, middleware, "openai_chat", token, body)
    assert status == 200, text
    reply = json.loads(text)["choices"][0]["message"]
    call = reply["tool_calls"][0]
    messages += [reply, {"role": "tool", "tool_call_id": call["id"], "content": "a.py b.py"}]
    status, text = await ask(http, middleware, "openai_chat", token, {**body, "messages": messages})
    assert status == 200, text

    aborted, finished, after = scripted_engine.served
    seam = (
        "\n<|im_start|>user\n<tool_response>\na.py b.py\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    seam_ids = tuple(qwen_tokenizer(seam, add_special_tokens=False)["input_ids"])
    assert after.input_ids == (
        aborted.input_ids + aborted.output_ids + finished.output_ids + seam_ids
    )
    assert middleware.splice_stats == {"new_chain": 1, "spliced": 1}
    (sample,) = await middleware.finish_session("spliced", reward=1.0)
    assert turn_metadata(sample)[1]["prompt_mode"] == "splice"
    assert sum(sample.loss_mask) == sum(len(g.output_ids) for g in scripted_engine.served)


async def test_a_continuation_gets_what_is_left_of_the_budget(
    middleware, scripted_engine, http, qwen_tokenizer
):
    """The context budget is clamped again for the longer prompt; an abort that spent the
    whole budget finishes the turn with ``length`` and no further engine call."""
    ids = qwen_tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=True
    )
    prompt = len(ids["input_ids"] if hasattr(ids, "keys") else ids)
    hello = {"model": "policy", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
    clamped = middleware.open_session("clamped", max_context_tokens=prompt + 12)
    scripted_engine.queue(ids=[9707, 11, 1879, 13, 576], finish_reason="abort", session="clamped")
    scripted_engine.queue(ids=[1879, 13], session="clamped")
    status, text = await ask(http, middleware, "anthropic", clamped, hello)
    assert status == 200, text
    first, second = (r.body for r in scripted_engine.generate_requests)
    assert len(first["input_ids"]) == prompt and first["sampling_params"]["max_new_tokens"] == 12
    assert len(second["input_ids"]) == prompt + 5
    assert second["sampling_params"]["max_new_tokens"] == 7

    spent = middleware.open_session("spent")
    scripted_engine.queue(ids=[9707, 11, 1879, 13, 576], finish_reason="abort", session="spent")
    status, text = await ask(http, middleware, "anthropic", spent, {**hello, "max_tokens": 5})
    assert status == 200, text
    assert json.loads(text)["stop_reason"] == "max_tokens"
    assert len(scripted_engine.generate_requests) == 3
    assert middleware.session("spent").turn_facts[0].finish_reason == "length"


def test_join_keeps_every_id_and_the_first_prompt_and_sums_latency():
    """Joined attempts: ids and log-probs in order, the last finish reason and rid, the first
    attempt's prompt counts, the latencies summed, completion tokens counted over all."""
    first = Generation(
        output_ids=[1, 2],
        logprobs=[-0.1, -0.2],
        finish_reason="abort",
        meta={
            "rid": "a",
            "prompt_tokens": 10,
            "cached_tokens": 0,
            "latency_s": 0.5,
            "completion_tokens": 2,
            "weight_version": "1",
        },
    )
    last = Generation(
        output_ids=[3],
        logprobs=[-0.3],
        finish_reason="stop",
        meta={
            "rid": "b",
            "prompt_tokens": 12,
            "cached_tokens": 12,
            "latency_s": 0.25,
            "completion_tokens": 1,
            "weight_version": "2",
        },
    )
    joined = join([first, last])
    assert joined.output_ids == (1, 2, 3) and joined.logprobs == (-0.1, -0.2, -0.3)
    assert joined.finish_reason == "stop"
    assert joined.meta == {
        "rid": "b",
        "prompt_tokens": 10,
        "cached_tokens": 0,
        "latency_s": 0.75,
        "completion_tokens": 3,
        "weight_version": "2",
    }
    assert join([first]) is first
    assert join([first], "length").finish_reason == "length"


async def test_generate_stops_at_the_limit_and_when_the_turn_is_no_longer_wanted():
    """``generate`` raises the typed error at the ``max_aborts``-th abort, and returns the abort
    as it is once ``wanted()`` turns false during the backoff."""
    sent: list[tuple[list[int], dict]] = []

    async def always_aborted(ids, params):
        sent.append((list(ids), dict(params)))
        return Generation(output_ids=[len(sent)], logprobs=[-1.0], finish_reason="abort")

    with pytest.raises(EngineAbortedError) as raised:
        await generate(
            always_aborted,
            [7, 7],
            {"max_new_tokens": 10},
            wanted=lambda: True,
            max_aborts=4,
            backoff=NO_WAIT,
        )
    assert (raised.value.aborts, raised.value.sampled) == (4, 4)
    assert [ids for ids, _ in sent] == [[7, 7], [7, 7, 1], [7, 7, 1, 2], [7, 7, 1, 2, 3]]
    assert [params["max_new_tokens"] for _, params in sent] == [10, 9, 8, 7]

    sent.clear()
    answers = iter([True, False])
    result = await generate(
        always_aborted,
        [7],
        {"max_new_tokens": 10},
        wanted=lambda: next(answers),
        max_aborts=4,
        backoff=NO_WAIT,
    )
    assert result == Continued(
        generation=Generation(output_ids=[1], logprobs=[-1.0], finish_reason="abort")
    )
    assert len(sent) == 1
