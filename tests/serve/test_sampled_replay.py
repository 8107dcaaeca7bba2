"""Render mode trains every sampled token when the sample is not what the client replays.

A Qwen3 policy samples whitespace the client is not shown (around its thinking and its
text), an empty ``<think>\\n\\n</think>`` on a turn without reasoning, and tool inputs in
its own key order, which Claude Code replays in schema order. The recorded message keeps
what was sampled and the replay is restored to it, so re-rendering the conversation with
the Qwen3 template gives back the sampled ids and no turn is masked. Each session runs
through the real middleware, the scripted SGLang engine and the real Qwen3 tokenizer.
"""

from __future__ import annotations

import json

import pytest

pytest_plugins = ("middleware_fixtures",)

WRITE_SCHEMA = {
    "type": "object",
    "properties": {"file_path": {"type": "string"}, "content": {"type": "string"}},
}
#: The model's key order; Claude Code replays ``file_path`` first (schema order).
SAMPLED_ARGS = '{"content": "hi", "file_path": "/w/hello.txt"}'
CALL = f'<tool_call>\n{{"name": "Write", "arguments": {SAMPLED_ARGS}}}\n</tool_call>'

#: case -> the first turn's sampled text (a tool call, then a final answer follows).
CASES = {
    "whitespace_around_thinking": f"<think>\n  I should write it.  \n</think>\n\n{CALL}",
    "whitespace_around_text": f"<think>\nPlan.\n</think>\n\n  I will write it.  \n{CALL}",
    "empty_think_block": f"<think>\n\n</think>\n\n{CALL}",
    # No reasoning: the replay differs from the record in nothing but the key order.
    "reordered_tool_input": CALL,
}
FINAL = "<think>\n  Done now.  \n</think>\n\n  The file is written.  "


def _schema_order(arguments: dict) -> dict:
    """Tool input keys in the schema's order, as Claude Code replays them."""
    order = list(WRITE_SCHEMA["properties"])
    return {key: arguments[key] for key in sorted(arguments, key=order.index)}


async def _anthropic_session(middleware, http, token, first: str) -> None:
    url = f"{middleware.url}/v1/messages"
    headers = {"x-api-key": token}
    tools = [{"name": "Write", "description": "Write a file", "input_schema": WRITE_SCHEMA}]
    messages: list[dict] = [{"role": "user", "content": "Create hello.txt containing hi"}]
    body = {"model": "policy", "max_tokens": 256, "tools": tools, "messages": messages}
    async with http.post(url, json=body, headers=headers) as response:
        assert response.status == 200, await response.text()
        reply = await response.json()
    blocks = [dict(b) for b in reply["content"]]
    for block in blocks:
        if block["type"] == "tool_use":
            block["input"] = _schema_order(block["input"])
    (call,) = [b for b in blocks if b["type"] == "tool_use"]
    messages += [
        {"role": "assistant", "content": blocks},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"]}]},
    ]
    async with http.post(url, json=body, headers=headers) as response:
        assert response.status == 200, await response.text()


async def _responses_session(middleware, http, token, first: str) -> None:
    url = f"{middleware.url}/v1/responses"
    headers = {"Authorization": f"Bearer {token}"}
    tools = [{"type": "function", "name": "Write", "parameters": WRITE_SCHEMA}]
    items: list[dict] = [{"type": "message", "role": "user", "content": "Create hello.txt"}]
    body = {"model": "policy", "tools": tools, "input": items, "store": False}
    async with http.post(url, json=body, headers=headers) as response:
        assert response.status == 200, await response.text()
        reply = await response.json()
    output = [dict(item) for item in reply["output"]]
    for item in output:
        if item["type"] == "function_call":
            item["arguments"] = json.dumps(_schema_order(json.loads(item["arguments"])))
    (call,) = [i for i in output if i["type"] == "function_call"]
    items += [*output, {"type": "function_call_output", "call_id": call["call_id"], "output": ""}]
    async with http.post(url, json=body, headers=headers) as response:
        assert response.status == 200, await response.text()


SESSIONS = {"anthropic": _anthropic_session, "openai_responses": _responses_session}


@pytest.mark.parametrize("protocol", sorted(SESSIONS))
@pytest.mark.parametrize("case", sorted(CASES))
async def test_every_sampled_token_trains(case, protocol, middleware, scripted_engine, http):
    """The turn whose sample the client replays otherwise is trained in full, in one sample.

    Two turns: a tool call (the case's sample), replayed by the client as it does (trimmed
    text, thinking not shown, tool input in schema order) with the tool's result, then a
    final answer with whitespace around its thinking and text.
    """
    token = middleware.open_session(case)
    for text in (CASES[case], FINAL):
        scripted_engine.queue(text)
    await SESSIONS[protocol](middleware, http, token, CASES[case])
    served = scripted_engine.served
    assert len(served) == 2
    samples = middleware.trajectory.get_trajectory(case, reward=1.0)
    sampled = sum(len(g.output_ids) for g in served)
    trained = sum(sum(sample.loss_mask) for sample in samples)
    assert (trained, len(samples)) == (sampled, 1)
    # The first turn's sampled ids sit in the sample exactly as the engine returned them.
    (sample,) = samples
    first = list(served[0].output_ids)
    tokens = list(sample.tokens)
    at = next(i for i in range(len(tokens)) if tokens[i : i + len(first)] == first)
    assert all(sample.loss_mask[at - sample.prompt_length + k] for k in range(len(first)))


async def test_trimmed_text_replay_without_wire_ids_restores(middleware, scripted_engine, http):
    """A text-only reply carries no wire id; its trimmed replay still restores, and trains.

    The policy answers with whitespace around its text, the client replays the trimmed
    text and asks again: the replay reads like the recorded message up to whitespace, so
    it is restored and the second turn extends the first in one fully trained sample.
    """
    token = middleware.open_session("text")
    scripted_engine.queue("  Hello!  \n")
    scripted_engine.queue("Bye.")
    url, headers = f"{middleware.url}/v1/messages", {"x-api-key": token}
    messages: list[dict] = [{"role": "user", "content": "hi"}]
    body = {"model": "policy", "max_tokens": 64, "messages": messages}
    async with http.post(url, json=body, headers=headers) as response:
        reply = await response.json()
    assert reply["content"] == [{"type": "text", "text": "Hello!"}]
    messages += [
        {"role": "assistant", "content": reply["content"]},
        {"role": "user", "content": "bye"},
    ]
    async with http.post(url, json=body, headers=headers) as response:
        assert response.status == 200, await response.text()
    samples = middleware.trajectory.get_trajectory("text", reward=1.0)
    sampled = sum(len(g.output_ids) for g in scripted_engine.served)
    assert (sum(sum(s.loss_mask) for s in samples), len(samples)) == (sampled, 1)


async def test_recorded_message_keeps_the_sampled_text(middleware, scripted_engine, http):
    """The client gets trimmed text and reasoning; the recorded message keeps them as sampled."""
    token = middleware.open_session("kept")
    scripted_engine.queue("<think>\n  weighing it  \n</think>\n\n  Hello there.  ")
    body = {
        "model": "policy",
        "max_tokens": 64,
        "thinking": {"type": "enabled", "budget_tokens": 32},
        "messages": [{"role": "user", "content": "hi"}],
    }
    async with http.post(
        f"{middleware.url}/v1/messages", json=body, headers={"x-api-key": token}
    ) as response:
        reply = await response.json()
    assert [b.get("thinking", b.get("text")) for b in reply["content"]] == [
        "weighing it",
        "Hello there.",
    ]
    recorded = middleware.session("kept").responses[0]
    assert recorded["content"] == "  Hello there.  "
    assert recorded["reasoning_content"] == "  weighing it  "


async def test_empty_think_block_is_recorded_as_its_newlines(middleware, scripted_engine, http):
    """An empty think block is recorded as ``"\\n\\n"`` (an empty string would drop it)."""
    token = middleware.open_session("empty")
    scripted_engine.queue("<think>\n\n</think>\n\nHi.")
    body = {"model": "policy", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
    async with http.post(
        f"{middleware.url}/v1/messages", json=body, headers={"x-api-key": token}
    ) as response:
        reply = await response.json()
    assert reply["content"] == [{"type": "text", "text": "Hi."}]
    recorded = middleware.session("empty").responses[0]
    assert recorded == {"role": "assistant", "content": "Hi.", "reasoning_content": "\n\n"}
