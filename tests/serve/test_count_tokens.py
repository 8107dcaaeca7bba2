"""``/v1/messages/count_tokens``: the length of the prompt the next turn would send the engine.

Driven over HTTP through the real middleware, the real Qwen3 chat template (which drops
earlier ``<think>`` blocks once a later user message exists) and the scripted engine, so
a spliced prompt, which keeps every sampled token, is longer than a re-render.
"""

from __future__ import annotations

import json

import pytest

from agentrl.adapters.anthropic import AnthropicAdapter
from agentrl.prompts.rendering import render_full

pytest_plugins = ("middleware_fixtures",)

SYSTEM = "Be brief."


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def body(history: list[dict], **extra) -> dict:
    """A Claude Code-like request: system prompt, adaptive thinking, the conversation."""
    thinking = {"type": "adaptive"}
    return {"model": "policy", "system": SYSTEM, "thinking": thinking, "messages": history, **extra}


def template_ids(tokenizer, messages) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


async def count(http, mw, token: str, history: list[dict]) -> int:
    """What count_tokens answers for ``history``."""
    url = mw.url + "/v1/messages/count_tokens"
    async with http.post(url, json=body(history), headers=bearer(token)) as response:
        assert response.status == 200, await response.text()
        return (await response.json())["input_tokens"]


async def turn(http, mw, engine, token: str, history: list[dict], n: int) -> list[dict]:
    """Turn ``n`` (thinking, then an answer); the history with its reply and question n + 1."""
    engine.queue(f"<think>\nLet me think about question {n} carefully.\n</think>\n\nAnswer {n}.")
    url = mw.url + "/v1/messages"
    async with http.post(url, json=body(history, max_tokens=256), headers=bearer(token)) as r:
        text = await r.text()
        assert r.status == 200, text
    reply = json.loads(text)
    assert reply["content"][0]["type"] == "thinking"
    assert reply["usage"]["input_tokens"] == len(sent_prompt(engine))
    return [
        *history,
        {"role": "assistant", "content": reply["content"]},
        {"role": "user", "content": f"question {n + 1}"},
    ]


def sent_prompt(engine) -> list[int]:
    """The input ids of the latest ``/generate`` request the engine received."""
    return engine.generate_requests[-1].body["input_ids"]


async def session_of_turns(http, mw, engine, sid: str, turns: int) -> tuple[str, list[dict]]:
    """A session that ran ``turns`` turns; its token and the next request's history."""
    token = mw.open_session(sid)
    history = [{"role": "user", "content": "question 0"}]
    for n in range(turns):
        history = await turn(http, mw, engine, token, history, n)
    return token, history


def rendered_length(tokenizer, history: list[dict]) -> int:
    """The length of ``history``'s full render (what count_tokens answered before splicing)."""
    chat = AnthropicAdapter().parse_request(body(history), {})
    return len(render_full(tokenizer, chat.messages, chat.tools))


async def test_count_is_the_spliced_prompt_the_next_turn_sends(
    middleware, scripted_engine, http, qwen_tokenizer
):
    """Splice mode after two reasoning turns: the count is the spliced prompt's length.

    The spliced prompt keeps both earlier think blocks, which a re-render (what a session
    with no chain for this conversation counts) drops, so the re-render undercounts; the
    next turn then sends the engine exactly as many ids as were counted.
    """
    token, history = await session_of_turns(http, middleware, scripted_engine, "chain", 2)
    counted = await count(http, middleware, token, history)
    rerendered = await count(http, middleware, middleware.open_session("no-chain"), history)
    assert rerendered == rendered_length(qwen_tokenizer, history)
    assert counted > rerendered
    await turn(http, middleware, scripted_engine, token, history, 2)
    assert counted == len(sent_prompt(scripted_engine))
    assert middleware.splice_stats == {"new_chain": 1, "spliced": 2}


async def test_a_conversation_without_a_chain_counts_its_full_render(
    middleware, scripted_engine, http, qwen_tokenizer
):
    """Splice mode, no chain: a first turn, and a history this session never sampled.

    Both count the template's rendering of the conversation, and a first turn sends the
    engine exactly that.
    """
    token = middleware.open_session("first")
    history = [{"role": "user", "content": "question 0"}]
    first = [{"role": "system", "content": SYSTEM}, *history]
    counted = await count(http, middleware, token, history)
    assert counted == len(template_ids(qwen_tokenizer, first))
    await turn(http, middleware, scripted_engine, token, history, 0)
    assert counted == len(sent_prompt(scripted_engine))
    foreign = [*history, {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "q"}]
    expected = template_ids(qwen_tokenizer, [first[0], *foreign])
    assert await count(http, middleware, token, foreign) == len(expected)


@pytest.mark.parametrize("prompt_mode", ["render"])
async def test_render_mode_counts_the_full_render_as_before(middleware, scripted_engine, http):
    """Render mode after two reasoning turns: the count is the full render, as before.

    It is what the next turn sends (a re-render, earlier thinking dropped) and what a
    session with no chain counts.
    """
    token, history = await session_of_turns(http, middleware, scripted_engine, "render", 2)
    counted = await count(http, middleware, token, history)
    assert counted == await count(http, middleware, middleware.open_session("other"), history)
    await turn(http, middleware, scripted_engine, token, history, 2)
    assert counted == len(sent_prompt(scripted_engine))
    assert middleware.splice_stats == {}


async def test_counting_changes_nothing_a_turn_sends_or_records(middleware, scripted_engine, http):
    """Two identical sessions, one counting before and between its turns (a spliced count,
    a fallback count with other tools): they send the engine the same prompts and move the
    splice and seam stats, turn counts and indexes by the same amounts."""
    stats, seams = middleware.turns.prompts.splicer.stats, middleware.turns.prompts.splicer.seams

    async def run(sid: str, counting: bool) -> tuple[list, dict, dict]:
        before = (stats.copy(), seams.stats.copy())
        token = middleware.open_session(sid)
        history, prompts = [{"role": "user", "content": "question 0"}], []
        for n in range(3):
            if counting:
                await count(http, middleware, token, history)
                other_tools = body(history, tools=[{"name": "Bash", "input_schema": {}}])
                url = middleware.url + "/v1/messages/count_tokens"
                async with http.post(url, json=other_tools, headers=bearer(token)) as r:
                    assert r.status == 200, await r.text()
            history = await turn(http, middleware, scripted_engine, token, history, n)
            prompts.append(sent_prompt(scripted_engine))
        session = middleware.session(sid)
        facts = {
            "turns": (session.turns_started, session.turns_recorded, session.next_index),
            "recorded": middleware.trajectory.turn_count(sid),
            "chains": (
                len(session.prompts.chains),
                len(session.prompts.splice.records),
                session.prompts.splice.spliced,
            ),
            "reduces": seams.reduces,
        }
        moved = {"splice": stats - before[0], "seams": seams.stats - before[1]}
        return prompts, facts, moved

    plain = await run("plain", counting=False)
    counted = await run("counted", counting=True)
    assert counted == plain
    assert plain[2]["splice"] == {"new_chain": 1, "spliced": 2}
