"""Incremental rendering: ids always equal a full apply_chat_template tokenization."""

from __future__ import annotations

import json
import os
import sys
from array import array
from pathlib import Path
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrl.prompts.rendering import (
    IncrementalRenderer,
    RenderedPrompt,
    RenderError,
    render_full,
    render_text,
)
from agentrl.prompts.segments import SegmentEncoder, boundary_ids
from agentrl.prompts.segments import boundary_ids as _boundary_ids
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


# -- the compiled chat template ------------------------------------------------------

QWEN3_TEST_TEMPLATE = (Path(__file__).parents[1] / "data" / "qwen3_chat_template.jinja").read_text()

#: A template using what transformers' environment adds: loopcontrols, namespace(), dict(),
#: tojson's options, {% generation %}, raise_exception, the special tokens.
FEATURES_TEMPLATE = """\
{%- set ns = namespace(n=0) -%}
{%- for m in messages -%}
  {%- if m.role == 'bad' %}{{ raise_exception('bad role') }}{% endif -%}
  {%- if m.role == 'skip' %}{% continue %}{% endif -%}
  {%- set ns.n = ns.n + 1 -%}
  [{{ ns.n }}|{{ m.role }}|{{ eos_token }}]
  {%- if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}
  {%- else %}{{ m.content | tojson(indent=1, sort_keys=True) }}{% endif -%}
  {%- if m.reasoning_content %}<r>{{ m.reasoning_content }}</r>{% endif -%}
  {%- if m.thinking %}<t>{{ m.thinking }}</t>{% endif -%}
  {{ dict(a=1, role=m.role) | tojson }}{{ (m.tool_calls or []) | length }}
  {%- if loop.index > 40 %}{% break %}{% endif -%}
{%- endfor -%}
{%- if tools %}{{ tools | map(attribute='function') | map(attribute='name') | join(',') }}{% endif -%}
{%- if add_generation_prompt %}<gen>{% endif -%}
"""

TEMPLATES = {"qwen3-test": QWEN3_TEST_TEMPLATE, "features": FEATURES_TEMPLATE, "default": None}


@st.composite
def rich_conversation(draw):
    """A conversation with reasoning under every field name, None-valued keys and unicode."""
    messages = draw(conversation())
    for message in messages:
        if message["role"] == "assistant" and draw(st.booleans()):
            reasoning = message.pop("reasoning_content", None) or draw(text)
            message[draw(st.sampled_from(["thinking", "reasoning", "reasoning_content"]))] = (
                reasoning
            )
        if draw(st.booleans()):
            message[draw(st.sampled_from(["name", "tool_calls", "reasoning_content"]))] = None
    return messages


@HYPOTHESIS
@given(
    messages=rich_conversation(),
    use_tools=st.booleans(),
    template=st.sampled_from(sorted(TEMPLATES)),
    kwargs=st.sampled_from([{}, {"enable_thinking": False}, {"enable_thinking": True}]),
)
def test_compiled_template_text_equals_apply_chat_template(
    qwen_tokenizer, messages, use_tools, template, kwargs
):
    """The compiled template's text is apply_chat_template's, over varied conversations
    (tools, tool calls, reasoning under each name, None-valued keys, unicode) and templates."""
    tools = TOOLS if use_tools else None
    source = TEMPLATES[template]
    got = render_text(
        qwen_tokenizer, messages, tools, chat_template=source, chat_template_kwargs=kwargs
    )
    want = qwen_tokenizer.apply_chat_template(
        messages,
        tools=tools,
        chat_template=source,
        add_generation_prompt=True,
        tokenize=False,
        **kwargs,
    )
    assert got == want


def test_compiled_template_is_used_and_built_once(qwen_tokenizer, monkeypatch):
    """The tokenizer's template renders through the compiled path: apply_chat_template is
    not called per render once the template is compiled and checked."""
    messages = [{"role": "user", "content": "hi"}]
    render_text(qwen_tokenizer, messages, TOOLS)
    calls = []
    original = type(qwen_tokenizer).apply_chat_template
    monkeypatch.setattr(
        type(qwen_tokenizer),
        "apply_chat_template",
        lambda self, *a, **k: calls.append(1) or original(self, *a, **k),
    )
    for _ in range(3):
        render_text(qwen_tokenizer, messages, TOOLS)
    assert calls == []


def test_message_content_is_data_never_template_source(qwen_tokenizer):
    """Security: template syntax, format fields and dunder names in a message stay text;
    a template that formats content or mutates the messages is refused as transformers
    refuses it (the sandbox is kept), and the caller's messages are never changed."""
    hostile = "{{ 7 * 7 }}{% for x in range(3) %}x{% endfor %}{0.__class__.__mro__}"
    messages = [{"role": "user", "content": hostile}]
    text = render_text(qwen_tokenizer, messages)
    assert hostile in text and "49" not in text
    formatting = "{{ messages[0].content.format(messages[0]) }}"
    leaky = [{"role": "user", "content": "{0.__class__.__mro__}"}]
    with pytest.raises(RenderError, match=r"SecurityError|access to attribute"):
        render_text(qwen_tokenizer, leaky, chat_template=formatting)
    mutating = "{{ messages.append({'role': 'x'}) }}{{ messages[0].update(role='y') }}"
    with pytest.raises(RenderError, match=r"SecurityError|unsafe"):
        render_text(qwen_tokenizer, messages, chat_template=mutating)
    dunder = "{{ messages[0].__class__.__init__.__globals__ }}{{ messages[0]['__class__'] }}"
    with pytest.raises(RenderError):
        render_text(qwen_tokenizer, messages, chat_template=dunder)
    assert messages == [{"role": "user", "content": hostile}]


def test_template_errors_and_fallbacks_match_transformers(qwen_tokenizer, caplog, monkeypatch):
    """A template that fails raises RenderError; a call the compiled path does not take (a
    tool that is not a dict, a keyword apply_chat_template owns) gives transformers' own
    result, and says so once in the log."""
    from agentrl.prompts import templates

    monkeypatch.setattr(templates, "_logged", set())
    with pytest.raises(RenderError, match="bad role"):
        render_text(
            qwen_tokenizer, [{"role": "bad", "content": "x"}], chat_template=FEATURES_TEMPLATE
        )
    with pytest.raises(RenderError):
        render_text(qwen_tokenizer, [{"role": "user", "content": "x"}], chat_template="{% if %}")

    class Tool(dict):
        pass

    tools = [Tool(TOOLS[0])]
    messages = [{"role": "user", "content": "x"}]
    documents = {"documents": [{"title": "t", "text": "d"}]}
    with caplog.at_level("INFO", logger="agentrl.prompts.templates"):
        for _ in range(2):
            assert render_text(qwen_tokenizer, messages, tools) == (
                qwen_tokenizer.apply_chat_template(
                    messages, tools=tools, add_generation_prompt=True, tokenize=False
                )
            )
            got = render_text(qwen_tokenizer, messages, chat_template_kwargs=documents)
            assert got == qwen_tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False, **documents
            )
    assert caplog.text.count("not a JSON-schema dict") == 1
    assert caplog.text.count("are apply_chat_template's own") == 1


def test_probe_mismatch_falls_back_to_apply_chat_template(qwen_tokenizer, monkeypatch):
    """When the compiled template renders the probe conversation differently from
    transformers (a transformers change this module does not mirror), it is not used."""
    from agentrl.prompts import templates

    source = "{{ messages[0].content }}|{{ strftime_now('%Y') }}-probe-check"
    monkeypatch.setattr(templates, "_PROBE_MESSAGES", [{"role": "user", "content": "p"}])
    real = templates._Compiled.render
    monkeypatch.setattr(templates._Compiled, "render", lambda *a: real(*a) + "drift")
    messages = [{"role": "user", "content": "x"}]
    got = render_text(qwen_tokenizer, messages, chat_template=source)
    assert got.endswith("-probe-check") and "drift" not in got
    assert templates._cache[qwen_tokenizer][source] is None


# -- offset-free tokenization and compact storage --------------------------------------


@HYPOTHESIS
@given(value=text, prefix=text)
def test_segment_encoding_equals_whole_encoding(qwen_tokenizer, value, prefix):
    """Pieces cut at boundary-token literals, encoded apart, give the whole text's ids;
    the pieces and the rest join back to the text and each count ends a piece."""
    encoder = SegmentEncoder.for_tokenizer(qwen_tokenizer)
    whole = prefix + value
    got = encoder.encode(whole)
    assert list(got.ids) == qwen_tokenizer(whole, add_special_tokens=False)["input_ids"]
    assert "".join(got.segments) + got.rest == whole
    assert len(got.counts) == len(got.segments)
    start = 0
    for segment, count in zip(got.segments, got.counts, strict=True):
        assert (
            list(got.ids[start:count])
            == encoder.backend.encode(segment, add_special_tokens=False).ids
        )
        start = count


def test_swallowed_boundary_falls_back_to_offsets(qwen_tokenizer_dir):
    """Attack: an added token whose end overlaps a boundary token's start ("zz<" before
    "<x>") swallows the literal; the piece check sees it and the text is encoded whole."""
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir))
    tokenizer.add_tokens([AddedToken(t, normalized=False) for t in ("zz<", "<x>")])
    x_id = tokenizer.convert_tokens_to_ids("<x>")
    assert x_id in boundary_ids(tokenizer)
    encoder = SegmentEncoder.for_tokenizer(tokenizer)
    whole = encoder._encode_with_offsets
    fell_back = []
    encoder._encode_with_offsets = lambda value: fell_back.append(value) or whole(value)
    assert (
        list(encoder.encode("a<x>b").ids)
        == tokenizer("a<x>b", add_special_tokens=False)["input_ids"]
    )
    assert fell_back == []
    for value in ("a zz<x> b<x>c", "<x>zz<x><|im_end|>", "zz<x>"):
        got = encoder.encode(value)
        assert list(got.ids) == tokenizer(value, add_special_tokens=False)["input_ids"]
        assert "".join(got.segments) + got.rest == value
    assert len(fell_back) == 3
    renderer = IncrementalRenderer(tokenizer)
    messages = [{"role": "user", "content": "zz<x> q"}]
    assert list(renderer.render(messages).ids) == render_full(tokenizer, messages)
    messages += [{"role": "assistant", "content": "<x>zz<x>"}, {"role": "user", "content": "z"}]
    assert list(renderer.render(messages).ids) == render_full(tokenizer, messages)


def test_start_sensitive_tokenizer_is_tokenized_in_full():
    """A tokenizer that adds a prefix space to the first word only (Metaspace "first")
    fails the split probe, so every turn is tokenized in full, and stays exact."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "▁a": 1, "a": 2, "▁b": 3, "b": 4, "▁": 5, "<s>": 6}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_end|>"]})
    tokenizer.chat_template = "{% for m in messages %}{{ m.content }}<|im_end|>{% endfor %}"
    assert SegmentEncoder.for_tokenizer(tokenizer) is None
    renderer = IncrementalRenderer(tokenizer)
    messages = [{"role": "user", "content": "a b"}]
    renderer.render(messages)
    messages.append({"role": "user", "content": "b a"})
    prompt = renderer.render(messages)
    assert prompt.reused_tokens == 0
    assert list(prompt.ids) == render_full(tokenizer, messages)


def test_prompt_ids_are_one_compact_array_shared_with_the_renderer(qwen_tokenizer):
    """ids are array('I') (no tuple copy), the renderer's own; the text is kept as pieces
    that take about a byte a character although one piece holds an emoji."""
    renderer = IncrementalRenderer(qwen_tokenizer, tools=TOOLS)
    messages = [
        {"role": "system", "content": "Be brief 🙂. " + "You are a coding agent. " * 200},
        {"role": "user", "content": "Fix the bug in parser.py " * 100},
    ]
    prompt = renderer.render(messages)
    assert isinstance(prompt.ids, array) and prompt.ids.typecode == "I"
    assert prompt.ids is renderer._state.ids
    assert renderer.last is prompt
    messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more " * 500}]
    second = renderer.render(messages)
    assert list(second.ids) == render_full(qwen_tokenizer, messages, tools=TOOLS)
    held = sum(sys.getsizeof(s) for s in renderer._state.segments)
    system_piece = max(renderer._state.segments, key=lambda s: max(map(ord, s)))
    assert held < 1.2 * len(second.text) + 4 * len(system_piece)
    assert second.text.endswith("<|im_start|>assistant\n")
    assert second.tail_text(12) == second.text[-12:]
    assert second.tail_text(10**6) == second.text and second.tail_text(0) == ""
    fork = renderer.fork()
    assert fork._state is renderer._state


def test_rendered_prompt_accepts_plain_sequences():
    """A RenderedPrompt built from a list or tuple (splice, tests) holds a compact array."""
    prompt = RenderedPrompt(text="x", ids=(1, 2, 3))
    assert isinstance(prompt.ids, array) and list(prompt.ids) == [1, 2, 3]
    big = RenderedPrompt(text="x", ids=[2**40])
    assert big.ids.typecode == "Q" and list(big.ids) == [2**40]


def test_the_module_switch_renders_through_apply_chat_template(qwen_tokenizer, monkeypatch):
    """``templates.COMPILED = False`` (the benchmark's library column): every render is
    apply_chat_template's own call, with the same text."""
    from agentrl.prompts import templates

    messages = [{"role": "user", "content": "hi"}]
    compiled = render_text(qwen_tokenizer, messages, TOOLS)
    calls = []
    original = type(qwen_tokenizer).apply_chat_template
    monkeypatch.setattr(
        type(qwen_tokenizer),
        "apply_chat_template",
        lambda self, *a, **k: calls.append(1) or original(self, *a, **k),
    )
    monkeypatch.setattr(templates, "COMPILED", False)
    assert render_text(qwen_tokenizer, messages, TOOLS) == compiled
    assert calls == [1]
