"""Incremental rendering: ids always equal a full apply_chat_template tokenization."""

from __future__ import annotations

import json
import os
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrl.adapters.rendering import (
    IncrementalRenderer,
    RenderError,
    render_full,
)
from agentrl.adapters.segments import boundary_ids as _boundary_ids
from agentrl.trajectory import common_prefix_length

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write a file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            },
        },
    },
]

SPECIAL_STRINGS = [
    "<|im_end|>",
    "<|im_start|>",
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "<tool_response>",
    "<|endoftext|>",
    "\n\n",
    "  ",
    "<",
    "|>",
]


def full_ids(tokenizer, messages, tools=None, **kwargs):
    """The reference: apply_chat_template(..., tokenize=True) input ids."""
    out = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=True, **kwargs
    )
    return list(out["input_ids"] if hasattr(out, "keys") else out)


# -- strategies --------------------------------------------------------------------

plain_text = st.text(
    alphabet=st.characters(
        codec="utf-8", exclude_categories=("Cs",), include_characters="\n\t <>|/{}\"'\\"
    ),
    max_size=40,
)
text = st.lists(
    st.one_of(plain_text, st.sampled_from(SPECIAL_STRINGS)), min_size=0, max_size=4
).map("".join)
arguments = st.dictionaries(
    st.sampled_from(["command", "path", "content", "n"]),
    st.one_of(text, st.integers(-5, 10**6), st.booleans()),
    max_size=3,
)


@st.composite
def assistant_turn(draw):
    """An assistant message (content, maybe reasoning, maybe tool calls) plus tool results."""
    message = {"role": "assistant", "content": draw(text)}
    if draw(st.booleans()):
        message["reasoning_content"] = draw(text)
    calls = draw(
        st.lists(st.tuples(st.sampled_from(["bash", "write_file"]), arguments), max_size=3)
    )
    if calls:
        message["tool_calls"] = [
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": args if draw(st.booleans()) else json.dumps(args),
                },
            }
            for i, (name, args) in enumerate(calls)
        ]
    results = [
        {"role": "tool", "content": draw(text), "tool_call_id": f"call_{i}"}
        for i in range(len(calls))
    ]
    return [message, *results]


@st.composite
def conversation(draw):
    """System?, then user turns each followed by assistant/tool rounds."""
    messages = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(text)})
    for _ in range(draw(st.integers(1, 3))):
        messages.append({"role": "user", "content": draw(text)})
        for _ in range(draw(st.integers(0, 3))):
            messages.extend(draw(assistant_turn()))
    return messages


def prompt_points(messages):
    """Prefix lengths at which an agent loop asks for a new assistant turn."""
    return [
        i + 1
        for i, m in enumerate(messages)
        if m["role"] in ("user", "tool")
        and (i + 1 == len(messages) or messages[i + 1]["role"] == "assistant")
    ]


# -- properties --------------------------------------------------------------------

HYPOTHESIS = settings(
    max_examples=int(os.environ.get("AGENTRL_HYPOTHESIS_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@HYPOTHESIS
@given(messages=conversation(), use_tools=st.booleans(), thinking=st.sampled_from([None, False]))
def test_incremental_equals_full_over_a_growing_session(
    qwen_tokenizer, messages, use_tools, thinking
):
    """Every turn of a growing session renders to exactly the full tokenization."""
    tools = TOOLS if use_tools else None
    kwargs = {} if thinking is None else {"enable_thinking": thinking}
    renderer = IncrementalRenderer(qwen_tokenizer, tools=tools, chat_template_kwargs=kwargs)
    for point in prompt_points(messages):
        prefix = messages[:point]
        prompt = renderer.render(prefix)
        assert list(prompt.ids) == full_ids(qwen_tokenizer, prefix, tools, **kwargs)
        assert prompt.text == qwen_tokenizer.apply_chat_template(
            prefix, tools=tools, add_generation_prompt=True, tokenize=False, **kwargs
        )


@HYPOTHESIS
@given(first=conversation(), second=conversation(), tools_change=st.booleans())
def test_incremental_equals_full_when_history_is_rewritten(
    qwen_tokenizer, first, second, tools_change
):
    """Unrelated or edited histories (forks, compaction, new tools) still match a full render."""
    renderer = IncrementalRenderer(qwen_tokenizer, tools=TOOLS)
    assert list(renderer.render(first).ids) == full_ids(qwen_tokenizer, first, TOOLS)
    tools = TOOLS[:1] if tools_change else TOOLS
    assert list(renderer.render(second, tools=tools).ids) == full_ids(qwen_tokenizer, second, tools)
    # Going back to a prefix of the first conversation (a sub-agent's shorter history).
    head = first[:1]
    assert list(renderer.render(head).ids) == full_ids(qwen_tokenizer, head, tools)


@given(a=st.text(max_size=30), b=st.text(max_size=30), shared=st.text(max_size=30))
def test_common_prefix_length(a, b, shared):
    """The shared binary-search common prefix (the renderer compares texts with it) is the naive one."""
    x, y = shared + a, shared + b
    naive = 0
    while naive < min(len(x), len(y)) and x[naive] == y[naive]:
        naive += 1
    assert common_prefix_length(x, y) == naive


# -- examples ----------------------------------------------------------------------


def test_growing_session_reuses_almost_everything(qwen_tokenizer):
    """Appending a turn tokenizes only the new tail; earlier ids are reused."""
    renderer = IncrementalRenderer(qwen_tokenizer, tools=TOOLS)
    messages = [
        {"role": "system", "content": "You are a coding agent. " * 50},
        {"role": "user", "content": "Fix the bug in parser.py"},
    ]
    first = renderer.render(messages)
    assert first.reused_tokens == 0
    messages += [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "bash", "arguments": {"command": "ls"}}}
            ],
        },
        {"role": "tool", "content": "parser.py\nREADME.md"},
    ]
    second = renderer.render(messages)
    assert list(second.ids) == render_full(qwen_tokenizer, messages, tools=TOOLS)
    # Everything up to and including the generation prompt's <|im_start|> is reused.
    assert second.reused_tokens == len(first.ids) - 2
    tail = second.text[-second.tokenized_chars :]
    assert tail.startswith("assistant\n<tool_call>")
    assert second.tokenized_chars < len(second.text) // 5
    assert renderer.stats.turns == 2
    assert renderer.stats.reused_tokens == second.reused_tokens


def test_dropped_thinking_is_re_rendered_correctly(qwen_tokenizer):
    """After a new user query Qwen3 drops earlier thinking; the render still matches in full."""
    renderer = IncrementalRenderer(qwen_tokenizer)
    messages = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "long thoughts " * 20},
    ]
    with_thinking = renderer.render([*messages, {"role": "tool", "content": "r"}])
    assert "long thoughts" in with_thinking.text
    messages.append({"role": "user", "content": "q2"})
    dropped = renderer.render(messages)
    assert "long thoughts" not in dropped.text
    assert list(dropped.ids) == render_full(qwen_tokenizer, messages)
    assert 0 < dropped.reused_tokens < len(with_thinking.ids)


def test_reset_forgets_previous_turn(qwen_tokenizer):
    """After reset() the next render reuses nothing."""
    renderer = IncrementalRenderer(qwen_tokenizer)
    messages = [{"role": "user", "content": "hi"}]
    renderer.render(messages)
    renderer.reset()
    assert renderer.last is None
    assert renderer.render(messages).reused_tokens == 0


def test_template_failure_is_a_render_error(qwen_tokenizer):
    """An empty conversation or a template exception raises RenderError explaining it."""
    renderer = IncrementalRenderer(qwen_tokenizer)
    with pytest.raises(RenderError, match="empty conversation"):
        renderer.render([])
    broken = IncrementalRenderer(qwen_tokenizer, chat_template="{{ raise_exception('no') }}")
    with pytest.raises(RenderError, match="roles"):
        broken.render([{"role": "user", "content": "x"}])


def test_tokenizer_without_rust_backend_falls_back_to_full(qwen_tokenizer):
    """A tokenizer lacking backend_tokenizer is tokenized in full every turn, still exact."""

    class SlowTokenizer:
        added_tokens_decoder = qwen_tokenizer.added_tokens_decoder

        def apply_chat_template(self, *args, **kwargs):
            return qwen_tokenizer.apply_chat_template(*args, **kwargs)

        def __call__(self, *args, **kwargs):
            return qwen_tokenizer(*args, **kwargs)

    renderer = IncrementalRenderer(SlowTokenizer())
    messages = [{"role": "user", "content": "hello"}]
    renderer.render(messages)
    messages += [{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}]
    prompt = renderer.render(messages)
    assert prompt.reused_tokens == 0
    assert list(prompt.ids) == render_full(qwen_tokenizer, messages)


def test_boundary_tokens_exclude_overlapping_and_stripping_tokens(qwen_tokenizer):
    """Only added tokens that cannot be extended across the split are used as boundaries."""
    from tokenizers import AddedToken

    class Stub:
        added_tokens_decoder: ClassVar[dict[int, AddedToken]] = {
            1: AddedToken("<a>", normalized=False),
            2: AddedToken("x<a>y", normalized=False),
            3: AddedToken("<b>", normalized=False, rstrip=True),
            4: AddedToken("<c>", normalized=False),
            5: AddedToken("c>d", normalized=False),
            6: AddedToken("<e>", normalized=False),
        }

    assert _boundary_ids(Stub()) == {2, 5, 6}
    qwen_ids = _boundary_ids(qwen_tokenizer)
    assert {151643, 151644, 151645, 151657, 151658, 151667, 151668} <= qwen_ids


def test_fork_starts_from_the_donor_prompt(qwen_tokenizer):
    """A forked renderer reuses the donor's prefix and stays exact; the donor is untouched."""
    donor = IncrementalRenderer(qwen_tokenizer, tools=TOOLS)
    system = {"role": "system", "content": "shared system prompt " * 100}
    donor.render([system, {"role": "user", "content": "main task"}])
    before = donor.last
    fork = donor.fork(chat_template_kwargs={"enable_thinking": False})
    sub = [system, {"role": "user", "content": "sub-agent task"}]
    prompt = fork.render(sub)
    assert list(prompt.ids) == full_ids(qwen_tokenizer, sub, TOOLS, enable_thinking=False)
    assert prompt.reused_tokens > 300
    assert donor.last is before and fork.stats.turns == 1
