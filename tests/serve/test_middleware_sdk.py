"""The official Anthropic and OpenAI Python SDKs against the middleware (real client code)."""

from __future__ import annotations

import anthropic
import openai
import pytest
from middleware_support import started_middleware

from agentrl.serve.middleware import Middleware
from agentrl.tokenizers import QWEN3_CHAT_TEMPLATE

pytest_plugins = ("middleware_fixtures",)

BASH = {"name": "Bash", "description": "run", "input_schema": {"type": "object"}}
THINK_THEN_CALL = (
    '<think>\nplan\n</think>\n\nRunning.\n<tool_call>\n{"name": "Bash", "arguments": '
    '{"command": "ls"}}\n</tool_call>'
)


def anthropic_client(mw: Middleware, token: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=mw.url, api_key=token, max_retries=0)


def openai_client(mw: Middleware, token: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=mw.url + "/v1", api_key=token, max_retries=0)


def as_param(block) -> dict:
    """A reply content block as the SDK user replays it (its wire fields, nothing unset)."""
    return block.model_dump(exclude_none=True)


async def test_reply_without_thinking_requested_starts_with_its_text(middleware, scripted_engine):
    """A client that did not enable thinking gets no thinking block: content[0].text just works.

    The policy still reasons (the default qwen3 reasoning parser splits it off), and the
    recorded turn keeps that reasoning for training.
    """
    token = middleware.open_session("sdk")
    scripted_engine.queue("<think>\nweighing it\n</think>\n\nHello there.")
    async with anthropic_client(middleware, token) as client:
        reply = await client.messages.create(
            model="policy", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
        )
    assert [block.type for block in reply.content] == ["text"]
    assert reply.content[0].text == "Hello there."
    recorded = middleware.session("sdk").responses[0]
    assert recorded["reasoning_content"] == "weighing it"


@pytest.mark.parametrize(
    ("thinking", "shown"),
    [
        ({"type": "enabled", "budget_tokens": 1024}, "plan"),
        ({"type": "adaptive"}, "plan"),
        ({"type": "adaptive", "display": "omitted"}, ""),
    ],
)
async def test_reply_with_thinking_enabled_carries_the_thinking_block(
    thinking, shown, middleware, scripted_engine
):
    """Thinking enabled (as Claude Code does, adaptive): the thinking block comes first, signed."""
    token = middleware.open_session("thinks")
    scripted_engine.queue(THINK_THEN_CALL)
    async with anthropic_client(middleware, token) as client:
        reply = await client.messages.create(
            model="policy",
            max_tokens=2048,
            thinking=thinking,
            tools=[BASH],
            messages=[{"role": "user", "content": "hi"}],
        )
    assert [block.type for block in reply.content] == ["thinking", "text", "tool_use"]
    assert reply.content[0].thinking == shown and reply.content[0].signature


async def test_hidden_thinking_turn_replayed_is_still_trained_token_for_token(
    middleware, scripted_engine
):
    """Turn 1 hid its thinking; turn 2 replays the reply as the SDK returned it (no thinking).

    The replay is restored to the recorded message through its tool_use id, so turn 2's
    prompt holds turn 1's exact sampled tokens and every one of them trains.
    """
    token = middleware.open_session("hidden")
    scripted_engine.queue(THINK_THEN_CALL)
    messages = [{"role": "user", "content": "list the files"}]
    async with anthropic_client(middleware, token) as client:
        first = await client.messages.create(
            model="policy", max_tokens=256, tools=[BASH], messages=messages
        )
        assert [block.type for block in first.content] == ["text", "tool_use"]
        call = first.content[-1]
        messages += [
            {"role": "assistant", "content": [as_param(b) for b in first.content]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "a.py"}],
            },
        ]
        scripted_engine.queue("There is a.py.")
        second = await client.messages.create(
            model="policy", max_tokens=256, tools=[BASH], messages=messages
        )
    assert second.content[0].text == "There is a.py."
    samples = await middleware.finish_session("hidden", reward=1.0)
    assert len(samples) == 1
    sample = samples[0]
    turn1 = scripted_engine.served[0].output_ids
    assert sample.tokens[sample.prompt_length :][: len(turn1)] == turn1
    assert sample.loss_mask[: len(turn1)] == (1,) * len(turn1)
    assert sum(sample.loss_mask) == sum(len(g.output_ids) for g in scripted_engine.served)
    assert sample.metadata["turn_metadata"][2]["restored_replays"] == [1]


@pytest.fixture
async def keep_thinking_middleware(qwen_tokenizer_dir, sglang_client):
    """A middleware whose chat template renders every assistant turn's reasoning.

    Qwen3's own template drops thinking before the latest user message; templates that
    keep it make a replay that lacks the reasoning differ from what was sampled.
    """
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(
        str(qwen_tokenizer_dir), local_files_only=True
    )
    keep = "{%- if loop.index0 > ns.last_query_index %}"
    assert keep in QWEN3_CHAT_TEMPLATE
    tokenizer.chat_template = QWEN3_CHAT_TEMPLATE.replace(keep, "{%- if true %}")
    async with started_middleware(sglang_client, tokenizer) as mw:
        yield mw


async def test_text_only_turn_with_hidden_thinking_is_restored_by_its_content(
    keep_thinking_middleware, scripted_engine
):
    """A text reply has no wire id; replayed without its hidden thinking it still maps back.

    It reads exactly like the recorded message minus its reasoning, so it is restored and
    the next prompt holds the sampled tokens: both turns train in full, in one sample.
    """
    mw = keep_thinking_middleware
    token = mw.open_session("text")
    scripted_engine.queue("<think>\nshort answer\n</think>\n\nHello there.")
    messages = [{"role": "user", "content": "hi"}]
    async with anthropic_client(mw, token) as client:
        first = await client.messages.create(model="policy", max_tokens=64, messages=messages)
        assert [block.type for block in first.content] == ["text"]
        messages += [
            {"role": "assistant", "content": [as_param(b) for b in first.content]},
            {"role": "user", "content": "and now?"},
        ]
        scripted_engine.queue("Still here.")
        await client.messages.create(model="policy", max_tokens=64, messages=messages)
    samples = await mw.finish_session("text", reward=1.0)
    assert len(samples) == 1
    assert sum(samples[0].loss_mask) == sum(len(g.output_ids) for g in scripted_engine.served)
    assert samples[0].metadata["turn_metadata"][2]["restored_replays"] == [1]


async def test_openai_sdk_previous_response_id_is_a_clear_bad_request(middleware, scripted_engine):
    """responses.create(previous_response_id=...) fails with a 400 the SDK reads, naming the fix."""
    token = middleware.open_session("oai")
    async with openai_client(middleware, token) as client:
        with pytest.raises(openai.BadRequestError) as info:
            await client.responses.create(
                model="policy", input="and then?", previous_response_id="resp_123"
            )
    assert info.value.status_code == 400
    assert info.value.param == "previous_response_id"
    assert "stateless" in info.value.message and "full history" in info.value.message
    assert scripted_engine.generate_requests == []


async def test_openai_sdk_reads_the_json_404_of_an_unserved_route(middleware):
    """An endpoint agentrl does not serve (embeddings) is a NotFoundError with a readable message."""
    token = middleware.open_session("oai")
    async with openai_client(middleware, token) as client:
        with pytest.raises(openai.NotFoundError) as info:
            await client.embeddings.create(model="policy", input="x")
    assert "POST /v1/embeddings" in info.value.message
    assert "POST /v1/chat/completions" in info.value.message
