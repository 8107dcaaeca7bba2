"""Replay every captured Claude Code / Codex request through the middleware.

The scripted SGLang engine answers each request with the chat-template text of what the
capture stub answered, so the replies can be compared with the stub's; ids the stub
minted are swapped for the ids the middleware minted before later requests are sent,
exactly as the real client would echo them.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from middleware_support import (
    PATH_REWRITES,
    PROTOCOL_OF_PATH,
    all_adapters,
    headers_for,
    load_requests,
    parse_reply,
    scenario_dirs,
    scenario_id,
    stub_reply,
)

from agentrl.adapters import anthropic, openai_chat, openai_responses
from agentrl.adapters.rendering import IncrementalRenderer

pytest_plugins = ("middleware_fixtures",)

#: Independent conversation chains per scenario: each is one training sample.
EXPECTED_SAMPLES = {
    "claude_code": 1,
    "claude_code/custom_model_name": 1,
    "claude_code/interactive_session_title": 2,  # the session-title side request
    "claude_code/permission_denied_tool_result": 1,
    "claude_code/subagent_agent_tool": 2,  # the sub-agent is its own chain
    "claude_code/v2.1.197": 1,
    "claude_code/without_disable_nonessential_traffic": 1,
    "claude_code/x_api_key_auth": 1,
    "codex": 1,
    "codex/default_model_code_mode": 1,
    "codex/subagent_spawn_agent": 2,  # the spawned agent is its own chain
    "codex/v0.94.0_wire_api_chat": 1,
}

SCENARIOS = scenario_dirs()


def test_every_captured_scenario_has_an_expectation():
    """Each captured scenario directory is covered by the replay test below."""
    assert sorted(scenario_id(d) for d in SCENARIOS) == sorted(EXPECTED_SAMPLES)


def _rewrite(value, replacements: dict[str, str]):
    text = json.dumps(value, ensure_ascii=False)
    for old, new in replacements.items():
        text = text.replace(old, new)
    return json.loads(text)


def _assistant_message(protocol: str, reply, chat) -> dict:
    """A reply (the stub's or ours) as the chat-template assistant message."""
    if protocol == "anthropic":
        return anthropic.translate_assistant(reply["content"], "reply")[0]
    if protocol == "openai_responses":
        return openai_responses.translate_input(reply["output"], None, chat.context["tools"])[0][0]
    return openai_chat.translate_assistant(reply, "reply")[0]


def _engine_text(tokenizer, chat, assistant: dict) -> str:
    """The template's text for ``assistant`` as it renders once more turns follow."""
    before = tokenizer.apply_chat_template(
        chat.messages, tools=chat.tools, add_generation_prompt=True, tokenize=False
    )
    after = tokenizer.apply_chat_template(
        [*chat.messages, assistant, {"role": "user", "content": "next"}],
        tools=chat.tools,
        tokenize=False,
    )
    assert after.startswith(before)
    tail = after[len(before) :]
    return tail[: tail.index("<|im_end|>") + len("<|im_end|>")]


def _ids_of(protocol: str, reply) -> list[str]:
    """Wire ids in reply order (tool_use ids / item ids and call ids / tool call ids)."""
    if protocol == "anthropic":
        return [b["id"] for b in reply["content"] if b["type"] == "tool_use"]
    if protocol == "openai_responses":
        ids = []
        for item in reply["output"]:
            if item["type"] in ("function_call", "custom_tool_call"):
                ids += [item["id"], item["call_id"]]
            elif item["type"] == "message":
                ids.append(item["id"])
        return ids
    return [c["id"] for c in reply.get("tool_calls", ())]


def _trained_runs(sample) -> list[tuple[tuple[int, ...], tuple[float, ...]]]:
    runs, ids, lps = [], [], []
    response = sample.tokens[sample.prompt_length :]
    for token, mask, logprob in zip(
        response, sample.loss_mask, sample.rollout_logprobs, strict=True
    ):
        if mask:
            ids.append(token)
            lps.append(logprob)
        elif ids:
            runs.append((tuple(ids), tuple(lps)))
            ids, lps = [], []
    if ids:
        runs.append((tuple(ids), tuple(lps)))
    return runs


@pytest.mark.parametrize("prompt_mode", ["render", "splice"])
@pytest.mark.parametrize("directory", SCENARIOS, ids=scenario_id)
async def test_captured_scenario_replays_with_exact_trajectory(
    directory, prompt_mode, middleware, scripted_engine, qwen_tokenizer, http
):
    """A captured client session through the middleware: replies match, samples are token-exact.

    These captures hold no reasoning, so a spliced prompt equals the full render too.
    """
    name = scenario_id(directory)
    token = middleware.open_session(name)
    adapters = {a.name: a for a in all_adapters()}
    replacements = dict(PATH_REWRITES)
    replies = 0
    expected_prompts: list[list[int]] = []
    for request in load_requests(directory):
        headers = headers_for(request, token)
        url = (
            middleware.url + request["path"] + (f"?{request['query']}" if request["query"] else "")
        )
        if request["method"] == "HEAD":
            async with http.head(url, headers=headers) as response:
                assert response.status == 200
            continue
        protocol = PROTOCOL_OF_PATH[request["path"]]
        body = _rewrite(request["body"], replacements)
        chat = adapters[protocol].parse_request(body, headers)
        expected_reply = _rewrite(stub_reply(request), PATH_REWRITES)
        expected = _assistant_message(protocol, expected_reply, chat)
        scripted_engine.queue(_engine_text(qwen_tokenizer, chat, expected))
        full_ids = qwen_tokenizer.apply_chat_template(
            chat.messages, tools=chat.tools, add_generation_prompt=True, tokenize=True
        )
        expected_prompts.append(
            list(full_ids["input_ids"] if hasattr(full_ids, "keys") else full_ids)
        )

        async with http.post(url, json=body, headers=headers) as response:
            text = await response.text()
            assert response.status == 200, text
            assert response.headers["Content-Type"].startswith("text/event-stream")
        reply = parse_reply(protocol, text)
        assert _assistant_message(protocol, reply, chat) == expected
        stub_ids, our_ids = _ids_of(protocol, expected_reply), _ids_of(protocol, reply)
        assert len(stub_ids) == len(our_ids)
        replacements.update(zip(stub_ids, our_ids, strict=True))
        replies += 1

    served = scripted_engine.served
    assert len(served) == replies
    # The incrementally rendered prompts the engine got equal a full tokenization.
    assert [list(g.input_ids) for g in served] == expected_prompts
    for generation in served:
        assert generation.routing_key == name
    samples = await middleware.finish_session(name, reward=1.0)
    stats = middleware.splice_stats
    if prompt_mode == "splice":
        # Every turn that continues a chain splices; only first turns of chains render.
        assert set(stats) == {"spliced", "new_chain"}, stats
    else:
        assert not stats
    assert len(samples) == EXPECTED_SAMPLES[name]
    trained = Counter(run for sample in samples for run in _trained_runs(sample))
    assert trained == Counter((g.output_ids, g.logprobs) for g in served)
    tool_response = qwen_tokenizer.convert_tokens_to_ids("<tool_response>")
    for sample in samples:
        assert sample.reward == 1.0
        for token, mask in zip(
            sample.tokens[sample.prompt_length :], sample.loss_mask, strict=True
        ):
            assert not (mask and token == tool_response)
    multi_turn = [s for s in samples if len(s.metadata["turns"]) > 1]
    assert multi_turn, "every scenario has at least one chain with a tool round trip"
    for sample in multi_turn:
        assert tool_response in sample.tokens[sample.prompt_length :]
        later = [sample.metadata["turn_metadata"][t] for t in sample.metadata["turns"][1:]]
        assert all(meta["replayed_turns"] for meta in later), later


@pytest.mark.parametrize("directory", SCENARIOS, ids=scenario_id)
def test_incremental_render_matches_full_template_on_fixture(directory, qwen_tokenizer):
    """Each captured request's prompt ids, rendered incrementally, equal a full tokenization."""
    adapters = {a.name: a for a in all_adapters()}
    renderer = IncrementalRenderer(qwen_tokenizer)
    posts = [r for r in load_requests(directory) if r["method"] == "POST"]
    assert posts
    for request in posts:
        adapter = adapters[PROTOCOL_OF_PATH[request["path"]]]
        chat = adapter.parse_request(request["body"], request["headers"])
        incremental = renderer.render(chat.messages, tools=chat.tools).ids
        full = qwen_tokenizer.apply_chat_template(
            chat.messages, tools=chat.tools, add_generation_prompt=True, tokenize=True
        )
        if isinstance(full, dict) or hasattr(full, "keys"):
            full = full["input_ids"]
        assert list(incremental) == list(full)
