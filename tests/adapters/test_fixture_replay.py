"""Replay every captured Claude Code / Codex / Qwen Code / opencode request through the middleware.

The scripted SGLang engine answers each request with what a Qwen3 thinking model samples
for the capture stub's answer: the template's text for it as the last assistant message
(``<think>\n`` + reasoning + ``\n</think>\n\n`` + content / tool calls + end of turn),
with reasoning added or with the empty think block such a model writes. The replies are
compared with the stub's; ids the stub minted are swapped for the ids the middleware
minted before later requests are sent, exactly as the real client would echo them.

Splice mode trains every sampled token once, one sample per conversation chain; render
mode re-renders the history, and Qwen3's template drops the think blocks before the
latest user text, so those turns are masked or forked.
"""

from __future__ import annotations

import json
from collections import Counter

import attrs
import pytest
from middleware_support import (
    PATH_REWRITES,
    PROTOCOL_OF_PATH,
    all_adapters,
    headers_for,
    load_requests,
    parse_reply,
    render_assistant,
    scenario_dirs,
    scenario_id,
    stub_reply,
)

from agentrl.adapters import anthropic, openai_chat, openai_responses
from agentrl.prompts.rendering import IncrementalRenderer

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
    "qwen_code": 1,
    "qwen_code/compress_command": 3,  # the resumed history and the compacted one
    "qwen_code/reasoning_echoed": 1,
    "qwen_code/resume_continue": 2,  # the resumed session's system prompt differs
    "qwen_code/subagent_agent_tool": 2,  # the sub-agent is its own chain
    "qwen_code/tool_session": 1,
    "opencode": 1,
    "opencode/continue_session": 1,  # the second run continues the first one's chain
    "opencode/subagent_task_tool": 2,  # the task tool's sub-agent is its own chain
    "opencode/title_side_request": 2,  # the session-title side request
    "mini_swe_agent": 1,
    # mini-swe-agent drops an answer without a tool call from its history (it sends only
    # its format-error user message), so the next turn starts a second chain.
    "mini_swe_agent/format_error": 2,
}

#: Splice fallbacks other than a new chain, where the client itself rewrites its history:
#: a resumed Qwen Code session rebuilds the system prompt (its git status snapshot now
#: lists the agent's new files) and drops the date reminder from the first user message;
#: a compacted one replaces the history with the summary and a canned assistant reply.
CLIENT_REWRITES = {
    "qwen_code/compress_command": {"history_changed", "unmapped_message"},
    "qwen_code/resume_continue": {"system_changed"},
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


#: ``none``: each answer as captured (a Qwen3 thinking model still writes an empty think
#: block); ``thinking``: each answer with reasoning, whitespace around it included, which
#: the captured later requests do not carry (a client that drops it); ``echoed``: the same,
#: with the reasoning the client was shown sent back (Claude Code's thinking blocks,
#: Codex's reasoning items) in later requests.
REASONING = ("none", "thinking", "echoed")


def _reasoning(turn: int) -> str:
    """The reasoning sampled for turn ``turn`` (spaces at both ends, a blank line inside)."""
    return f"  Turn {turn}: read the request.\n\n  Then act.  "


@attrs.define
class Replay:
    """One scenario replayed through the middleware: what the engine served and the samples."""

    served: list
    samples: list
    #: Per served turn: the full render of the client's conversation, its replays restored.
    rendered: list[list[int]]
    #: Some request has user text after an assistant message (Qwen3 then drops earlier
    #: think blocks when it renders the history).
    user_text_after_assistant: bool
    #: Replayed assistant messages that carried reasoning.
    echoed: int = 0

    def sampled(self) -> int:
        return sum(len(g.output_ids) for g in self.served)

    def trained(self) -> int:
        return sum(sum(s.loss_mask) for s in self.samples)

    def turn_metadata(self) -> dict[int, dict]:
        found = {}
        for sample in self.samples:
            for meta in sample.metadata["turn_metadata"].values():
                found[meta["middleware_turn"]] = meta
        return found


def _template_ids(tokenizer, messages, tools) -> list[int]:
    ids = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=True
    )
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def _restored(chat, answers: list[dict], turn_of_id: dict[str, int]) -> list[dict]:
    """The client's messages with each replayed answer put back as the engine sampled it.

    An assistant message is the turn whose wire ids it replays, else the turn with its text;
    one that is neither was written by the client itself and stays as sent (Qwen Code's
    "Got it. Thanks for the additional context!" after a compacted history).
    """
    messages = list(chat.messages)
    for index, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        turns = {turn_of_id[w] for i, w in chat.replayed_ids if i == index and w in turn_of_id}
        if not turns:
            text = (message.get("content") or "").strip()
            turns = {t for t, a in enumerate(answers) if (a.get("content") or "").strip() == text}
        assert len(turns) == 1 or not (turns or message.get("tool_calls")), (index, message)
        if turns:
            messages[index] = answers[turns.pop()]
    return messages


def _reasoning_parts(protocol: str, reply) -> tuple[list, set[str]]:
    """The reply's reasoning parts (thinking blocks / reasoning items) and its other ids."""
    if protocol == "anthropic":
        blocks = reply["content"]
        parts = [b for b in blocks if b["type"] == "thinking" and b["thinking"]]
        keys = {b["id"] for b in blocks if b["type"] == "tool_use"}
        keys |= {b["text"] for b in blocks if b["type"] == "text"}
        return parts, keys
    if protocol == "openai_responses":
        parts = [i for i in reply["output"] if i["type"] == "reasoning"]
        keys = {i["call_id"] for i in reply["output"] if "call_id" in i}
        keys |= {i["id"] for i in reply["output"] if i["type"] == "message"}
        return parts, keys
    parts = [reply["reasoning_content"]] if reply.get("reasoning_content") else []
    keys = {c["id"] for c in reply.get("tool_calls", ())}
    keys |= {reply["content"]} if reply.get("content") else set()
    return parts, keys


#: Chat Completions clients that send the reasoning they were shown back as the assistant
#: message's ``reasoning_content`` (Qwen Code does, trimmed; Codex 0.94 does not).
CHAT_CLIENTS_ECHOING_REASONING = ("qwen_code",)


def _echoes_reasoning(protocol: str, name: str) -> bool:
    if protocol != "openai_chat":
        return True
    return name.split("/")[0] in CHAT_CLIENTS_ECHOING_REASONING


def _without_reasoning(protocol: str, body: dict) -> dict:
    """A Chat Completions body with the captured echoes of the stub's reasoning taken out.

    The replay decides what the client was shown (``REASONING``); ``echoed`` puts it back.
    """
    if protocol != "openai_chat":
        return body
    messages = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in body["messages"]]
    return {**body, "messages": messages}


def _echo(protocol: str, body: dict, echoes: list[tuple[list, set[str]]]) -> dict:
    """``body`` with each replayed answer's reasoning put back before it, as the client would."""
    if protocol == "anthropic":
        for message in body["messages"]:
            content = message["content"]
            if message["role"] != "assistant" or not isinstance(content, list):
                continue
            keys = {b.get("id") for b in content} | {b.get("text") for b in content}
            for parts, ours in echoes:
                if ours & keys and not any(b["type"] == "thinking" for b in content):
                    message["content"] = [*parts, *content]
    elif protocol == "openai_responses":
        items = []
        for item in body["input"]:
            for parts, ours in echoes:
                if ours and (item.get("call_id") in ours or item.get("id") in ours):
                    items += parts
                    ours.clear()  # before the answer's first item only
            items.append(item)
        body = {**body, "input": items}
    else:
        for message in body["messages"]:
            if message.get("role") != "assistant":
                continue
            keys = {c.get("id") for c in message.get("tool_calls") or ()}
            keys |= {message["content"]} if message.get("content") else set()
            for parts, ours in echoes:
                if parts and ours & keys:
                    message["reasoning_content"] = parts[0]
    return body


def _user_text_after_assistant(messages) -> bool:
    roles = [m.get("role") for m in messages]
    return "assistant" in roles and "user" in roles[roles.index("assistant") :]


async def _replay(directory, reasoning, middleware, engine, tokenizer, http) -> Replay:
    """Send every captured request of ``directory``; the engine samples each stub answer.

    The engine's completion is the template's text for the answer as the last assistant
    message (with ``reasoning``'s reasoning, or an empty think block): what a Qwen3
    thinking model samples there. The captured later requests carry the stub's answers
    without reasoning (as a client that drops it; ``echoed`` puts back the reasoning the
    client was shown), their wire ids swapped for ours.
    """
    name = scenario_id(directory)
    token = middleware.open_session(name)
    adapters = {a.name: a for a in all_adapters()}
    replacements = dict(PATH_REWRITES)
    answers: list[dict] = []
    turn_of_id: dict[str, int] = {}
    echoes: list[tuple[list, set[str]]] = []
    echoed = 0
    rendered: list[list[int]] = []
    user_text = False
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
        body = _without_reasoning(protocol, _rewrite(request["body"], replacements))
        if reasoning == "echoed" and _echoes_reasoning(protocol, name):
            body = _echo(protocol, body, [(p, set(k)) for p, k in echoes])
        chat = adapters[protocol].parse_request(body, headers)
        user_text = user_text or _user_text_after_assistant(chat.messages)
        echoed += sum(bool(m.get("reasoning_content")) for m in chat.messages)
        rendered.append(_template_ids(tokenizer, _restored(chat, answers, turn_of_id), chat.tools))
        expected_reply = _rewrite(stub_reply(request), PATH_REWRITES)
        captured = _assistant_message(protocol, expected_reply, chat)
        expected = {k: v for k, v in captured.items() if k != "reasoning_content"}
        if reasoning != "none":
            answer = {**expected, "reasoning_content": _reasoning(len(answers))}
        else:
            answer = captured
        engine.queue(render_assistant(tokenizer, chat.messages, chat.tools, answer))

        async with http.post(url, json=body, headers=headers) as response:
            text = await response.text()
            assert response.status == 200, text
            streamed = body.get("stream", protocol != "openai_chat")
            kind = "text/event-stream" if streamed else "application/json"
            assert response.headers["Content-Type"].startswith(kind)
        reply = parse_reply(protocol, text)
        seen = _assistant_message(protocol, reply, chat)
        # The client sees the reasoning trimmed, unless it did not ask to see thinking.
        shown = chat.context.get("thinking", "full") == "full"
        visible = (answer.get("reasoning_content") or "").strip() if shown else ""
        assert (seen.get("reasoning_content") or "") == visible
        assert {k: v for k, v in seen.items() if k != "reasoning_content"} == expected
        stub_ids, our_ids = _ids_of(protocol, expected_reply), _ids_of(protocol, reply)
        assert len(stub_ids) == len(our_ids)
        replacements.update(zip(stub_ids, our_ids, strict=True))
        turn_of_id.update(dict.fromkeys(our_ids, len(answers)))
        echoes.append(_reasoning_parts(protocol, reply))
        # The middleware records (and restores replays to) the answer as sampled.
        answers.append({**answer, "reasoning_content": answer.get("reasoning_content") or "\n\n"})
    served = list(engine.served)
    assert len(served) == len(answers)
    for generation in served:
        assert generation.routing_key == name
    samples = await middleware.finish_session(name, reward=1.0)
    return Replay(served, samples, rendered, user_text, echoed)


def _check_samples(replay: Replay, tokenizer) -> None:
    """Rewards, no tool response trained, every multi-turn chain replayed its turns."""
    tool_response = tokenizer.convert_tokens_to_ids("<tool_response>")
    for sample in replay.samples:
        assert sample.reward == 1.0
        response = sample.tokens[sample.prompt_length :]
        for token, mask in zip(response, sample.loss_mask, strict=True):
            assert not (mask and token == tool_response)
    multi_turn = [s for s in replay.samples if len(s.metadata["turns"]) > 1]
    assert multi_turn, "every scenario has at least one chain with a tool round trip"
    for sample in multi_turn:
        assert tool_response in sample.tokens[sample.prompt_length :]
        later = [sample.metadata["turn_metadata"][t] for t in sample.metadata["turns"][1:]]
        assert all(meta["replayed_turns"] for meta in later), later


@pytest.mark.parametrize("reasoning", REASONING)
@pytest.mark.parametrize("directory", SCENARIOS, ids=scenario_id)
async def test_captured_scenario_splices_every_sampled_token_into_one_sample_per_chain(
    directory, reasoning, middleware, scripted_engine, qwen_tokenizer, http
):
    """Splice mode: every sampled token trains exactly once, one sample per conversation chain.

    Every turn that continues a chain is spliced onto it (its prompt is the chain's exact
    ids so far); a chain's first turn is the full template render of the conversation.
    """
    replay = await _replay(directory, reasoning, middleware, scripted_engine, qwen_tokenizer, http)
    # Chat Completions clients send no reasoning back, except Qwen Code.
    paths = {r["path"] for r in load_requests(directory) if r["method"] == "POST"}
    protocol = "openai_chat" if paths == {"/v1/chat/completions"} else "other"
    echoes = reasoning == "echoed" and _echoes_reasoning(protocol, scenario_id(directory))
    assert (replay.echoed > 0) == echoes
    expected_fallbacks = {"new_chain", *CLIENT_REWRITES.get(scenario_id(directory), ())}
    assert set(middleware.splice_stats) == {"spliced", *expected_fallbacks}, middleware.splice_stats
    assert len(replay.samples) == EXPECTED_SAMPLES[scenario_id(directory)]
    trained = Counter(run for sample in replay.samples for run in _trained_runs(sample))
    assert trained == Counter((g.output_ids, g.logprobs) for g in replay.served)
    assert replay.trained() == replay.sampled()
    metadata = replay.turn_metadata()
    assert sorted(metadata) == list(range(len(replay.served)))
    for turn, generation in enumerate(replay.served):
        meta = metadata[turn]
        if meta["prompt_mode"] == "render":
            assert meta["splice_fallback"] in expected_fallbacks
            assert list(generation.input_ids) == replay.rendered[turn]
        else:
            base = replay.served[meta["spliced_on_turn"]]
            chain = [*base.input_ids, *base.output_ids]
            assert list(generation.input_ids[: len(chain)]) == chain
    _check_samples(replay, qwen_tokenizer)


@pytest.mark.parametrize("prompt_mode", ["render"])
@pytest.mark.parametrize("reasoning", REASONING)
@pytest.mark.parametrize("directory", SCENARIOS, ids=scenario_id)
async def test_captured_scenario_in_render_mode_loses_thinking_dropped_by_later_user_text(
    directory, reasoning, prompt_mode, middleware, scripted_engine, qwen_tokenizer, http
):
    """Render mode: prompts are the full template render; yield drops where Qwen3 drops thinking.

    Each prompt equals ``apply_chat_template`` of the conversation with its replays put back
    as sampled. Where a request has user text after an assistant turn, Qwen3's template
    drops that turn's think block (even an empty one), so the re-rendered history differs
    from what was sampled and fewer tokens train; otherwise every sampled token trains.
    Where that user text comes only in a history the client rewrote (``CLIENT_REWRITES``),
    it starts a chain of its own anyway and nothing more is lost.
    """
    replay = await _replay(directory, reasoning, middleware, scripted_engine, qwen_tokenizer, http)
    assert not middleware.splice_stats
    assert [list(g.input_ids) for g in replay.served] == replay.rendered
    chains = EXPECTED_SAMPLES[scenario_id(directory)]
    if replay.user_text_after_assistant and scenario_id(directory) not in CLIENT_REWRITES:
        # The drifted history is masked (REALIGN) or starts another sample (FORK).
        assert replay.trained() < replay.sampled() or len(replay.samples) > chains
    else:
        assert replay.trained() == replay.sampled()
        assert len(replay.samples) == chains
        _check_samples(replay, qwen_tokenizer)


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
