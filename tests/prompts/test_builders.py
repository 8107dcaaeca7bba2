"""The PromptBuilder contract, called directly: no server, no session table, no engine."""

from __future__ import annotations

import pytest

from agentrl.prompts.builders import (
    PromptState,
    RenderBuilder,
    SpliceBuilder,
    prompt_builder,
)
from agentrl.prompts.rendering import render_full

SYSTEM = {"role": "system", "content": "You are terse."}
USER = {"role": "user", "content": "Say hi."}
ANSWER = {"role": "assistant", "content": "hi"}
NEXT = {"role": "user", "content": "Again."}


def _sampled(tokenizer, text: str) -> list[int]:
    """What the engine would have sampled for ``text`` (then end of turn)."""
    return [
        *tokenizer.encode(text, add_special_tokens=False),
        tokenizer.convert_tokens_to_ids("<|im_end|>"),
    ]


def test_the_mode_is_chosen_once_by_name(qwen_tokenizer):
    """``splice`` and ``render`` name the two builders; anything else names the choices."""
    assert isinstance(prompt_builder("splice", qwen_tokenizer), SpliceBuilder)
    assert isinstance(prompt_builder("render", qwen_tokenizer), RenderBuilder)
    assert prompt_builder("render", qwen_tokenizer).mode == "render"
    with pytest.raises(ValueError, match="expected one of"):
        prompt_builder("incremental", qwen_tokenizer)


def test_render_builder_gives_the_chat_template_ids(qwen_tokenizer):
    """Every prompt of the render builder is ``apply_chat_template``'s, turn after turn."""
    builder, state = prompt_builder("render", qwen_tokenizer), PromptState()
    for messages in ([SYSTEM, USER], [SYSTEM, USER, ANSWER, NEXT]):
        built = builder.build(state, messages, None, {})
        assert list(built.prompt.ids) == list(render_full(qwen_tokenizer, messages, None))
        assert built.metadata() == {"prompt_mode": "render"} and built.plan is None
    assert len(state.chains) == 1 and builder.stats == {}


def test_splice_builder_extends_the_recorded_ids_and_says_why_it_renders(qwen_tokenizer):
    """Turn 1 renders (a new chain); once recorded, turn 2's prompt starts with turn 1's
    prompt and sampled ids exactly; a history edit renders again, the reason recorded."""
    builder, state = prompt_builder("splice", qwen_tokenizer), PromptState()
    first = builder.build(state, [SYSTEM, USER], None, {}, index=0)
    assert first.metadata() == {"prompt_mode": "render", "splice_fallback": "new_chain"}
    sampled = _sampled(qwen_tokenizer, "hi")
    builder.recorded(state, first, 0, sampled, ANSWER)
    second = builder.build(state, [SYSTEM, USER, ANSWER, NEXT], None, {}, index=1)
    assert second.metadata() == {"prompt_mode": "splice", "spliced_on_turn": 0}
    head = [*first.prompt.ids, *sampled]
    assert list(second.prompt.ids)[: len(head)] == head
    assert builder.length(state, [SYSTEM, USER, ANSWER, NEXT], None, {}) == len(second.prompt.ids)
    builder.recorded(state, second, 1, _sampled(qwen_tokenizer, "hi"), ANSWER)
    edited = [{**SYSTEM, "content": "You are verbose."}, USER, ANSWER, NEXT, ANSWER, NEXT]
    third = builder.build(state, edited, None, {}, index=2)
    assert third.plan.reason == "system_changed" and third.metadata()["prompt_mode"] == "render"
    builder.recorded(state, third, 2, (), None)
    assert builder.stats == {"new_chain": 1, "spliced": 1, "system_changed": 1}


def test_a_builder_instance_is_the_middlewares_prompt_mode(qwen_tokenizer):
    """A PromptBuilder given as ``prompt_mode`` is the one every turn uses."""
    from agentrl.serve.middleware import Middleware

    builder = RenderBuilder(qwen_tokenizer)
    mw = Middleware(engine=None, tokenizer=qwen_tokenizer, prompt_mode=builder)
    assert mw.turns.prompts is builder and mw.prompt_mode == "render"
