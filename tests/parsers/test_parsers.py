"""Tool-call and reasoning parsers: formats, malformed output, registration."""

from __future__ import annotations

import json
import sys
import types
from typing import ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl import plugins
from agentrl.parsers import sglang as sglang_family
from agentrl.parsers.base import ReasoningParser, ToolCall
from agentrl.parsers.hermes import HermesToolCallParser
from agentrl.parsers.qwen3_coder import Qwen3CoderToolCallParser, convert_parameter
from agentrl.parsers.reasoning import DeepSeekR1ReasoningParser, Qwen3ReasoningParser

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "content": {"type": "string"},
                    "mode": {"type": "integer"},
                    "ratio": {"type": "number"},
                    "force": {"type": "boolean"},
                    "tags": {"type": "array"},
                    "meta": {"type": "object"},
                    "maybe": {"type": ["string", "null"]},
                },
            },
        },
    },
    {"name": "bash", "input_schema": {"type": "object", "properties": {"command": {}}}},
]


# -- hermes ----------------------------------------------------------------------------


def test_hermes_parses_text_and_several_calls():
    """Text before two JSON calls is kept; both calls parse with their raw source."""
    first = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
    second = (
        '<tool_call>\n{"name": "write_file", "arguments": "{\\"path\\": \\"a\\"}"}\n</tool_call>'
    )
    text = f"Let me look.\n{first}\n{second}"
    result = HermesToolCallParser(TOOLS).parse(text)
    assert result.normal_text == "Let me look."
    assert result.calls == (
        ToolCall(name="bash", arguments={"command": "ls"}, raw=first),
        ToolCall(name="write_file", arguments={"path": "a"}, raw=second),
    )
    assert not result.ill_formed


def test_hermes_text_without_calls_is_unchanged():
    """Output with no tool call comes back byte for byte, whitespace included."""
    text = "  Just an answer.\n\n"
    result = HermesToolCallParser().parse(text)
    assert result.normal_text == text
    assert result.calls == () and not result.ill_formed


@pytest.mark.parametrize(
    ("block", "reason"),
    [
        ("<tool_call>\n{bad json}\n</tool_call>", "invalid JSON"),
        ('<tool_call>\n["bash"]\n</tool_call>', "JSON object"),
        ('<tool_call>\n{"arguments": {}}\n</tool_call>', "name"),
        ('<tool_call>\n{"name": "bash", "arguments": [1]}\n</tool_call>', "must be an object"),
        ('<tool_call>\n{"name": "bash", "arguments": "nope"}\n</tool_call>', "not a JSON object"),
        ('<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>', "not among"),
        ('<tool_call>\n{"name": "bash", "arguments": {}}\n', "never closed"),
    ],
)
def test_hermes_malformed_call_stays_visible(block, reason):
    """A malformed call sets ill_formed, stays in the text verbatim, and says why."""
    text = f"Trying.\n{block}"
    result = HermesToolCallParser(TOOLS).parse(text)
    assert result.ill_formed
    assert result.calls == ()
    assert result.normal_text == text
    assert reason in " ".join(result.errors)


def test_hermes_good_and_bad_calls_together():
    """A good call is returned while a bad sibling stays as text and marks the turn."""
    good = '<tool_call>\n{"name": "bash", "arguments": {"command": "pwd"}}\n</tool_call>'
    bad = "<tool_call>\n{oops\n</tool_call>"
    result = HermesToolCallParser(TOOLS).parse(f"{good}\n{bad}")
    assert [c.name for c in result.calls] == ["bash"]
    assert result.ill_formed
    assert result.normal_text == bad


def test_hermes_reopened_tag_marks_first_as_unclosed():
    """'<tool_call>' opened twice before a close: the first is malformed, the second parses."""
    good = '<tool_call>{"name": "bash", "arguments": {}}</tool_call>'
    result = HermesToolCallParser(TOOLS).parse(f"<tool_call>oops {good}")
    assert [c.name for c in result.calls] == ["bash"]
    assert result.ill_formed and "not closed before" in result.errors[0]
    assert result.normal_text == "<tool_call>oops"


def test_hermes_round_trips_the_qwen3_template(qwen_tokenizer):
    """Calls rendered by the real Qwen3 template parse back (reasoning parser, then hermes)."""
    calls = [
        {"type": "function", "function": {"name": "bash", "arguments": {"command": "ls -la"}}},
        {
            "type": "function",
            "function": {"name": "write_file", "arguments": {"path": "é.py", "content": "x\n"}},
        },
    ]
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "Sure.", "tool_calls": calls},
    ]
    text = qwen_tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False)
    assistant = text.rsplit("<|im_start|>assistant\n", 1)[1].removesuffix("<|im_end|>\n")
    reasoning = Qwen3ReasoningParser().parse(assistant)
    assert reasoning.has_reasoning and reasoning.reasoning == ""
    result = HermesToolCallParser(TOOLS).parse(reasoning.content)
    assert result.normal_text == "Sure."
    assert [(c.name, c.arguments) for c in result.calls] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in calls
    ]


# -- qwen3_coder -------------------------------------------------------------------------


def coder_call(name, params):
    """A call in the Qwen3-Coder format, as that chat template writes it."""
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def test_qwen3_coder_types_parameters_by_schema():
    """Values are typed from the tool's JSON schema; strings keep inner whitespace."""
    raw = coder_call(
        "write_file",
        {
            "path": "src/a.py",
            "content": "def f():\n    return 1\n",
            "mode": "644",
            "ratio": "0.5",
            "force": "True",
            "tags": '["a", "b"]',
            "meta": "{'k': 1}",
            "maybe": "null",
        },
    )
    result = Qwen3CoderToolCallParser(TOOLS).parse(f"Writing it.\n{raw}")
    assert result.normal_text == "Writing it."
    (call,) = result.calls
    assert call.raw == raw
    assert call.arguments == {
        "path": "src/a.py",
        "content": "def f():\n    return 1\n",
        "mode": 644,
        "ratio": 0.5,
        "force": True,
        "tags": ["a", "b"],
        "meta": {"k": 1},
        "maybe": None,
    }


def test_qwen3_coder_without_schema_keeps_strings():
    """With no tools known every value stays the string the model wrote."""
    result = Qwen3CoderToolCallParser().parse(coder_call("anything", {"n": "3", "s": "x"}))
    assert result.calls[0].arguments == {"n": "3", "s": "x"}


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("<tool_call>\n<function=bash>\n<parameter=command>\nls\n</tool_call>", "</function>"),
        (
            "<tool_call>\n<function=bash>\n<parameter=command>\nls\n</function>\n</tool_call>",
            "</parameter>",
        ),
        ('<tool_call>\n{"name": "bash"}\n</tool_call>', "no <function=NAME>"),
        (coder_call("rm_rf", {"x": "1"}), "not among"),
        ("<tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n", "never closed"),
        (
            "<tool_call>\n<function=bash>\nstray<parameter=command>\nls\n</parameter>\n"
            "</function>\n</tool_call>",
            "between parameters",
        ),
    ],
)
def test_qwen3_coder_malformed_call_stays_visible(text, reason):
    """Broken XML calls set ill_formed, keep the text, and explain the problem."""
    result = Qwen3CoderToolCallParser(TOOLS).parse(text)
    assert result.ill_formed and result.calls == ()
    assert result.normal_text == text
    assert reason in " ".join(result.errors)


@given(
    st.dictionaries(
        st.from_regex(r"[a-z_]{1,8}", fullmatch=True),
        st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=30).filter(
            lambda v: "</parameter>" not in v
        ),
        max_size=4,
    )
)
def test_qwen3_coder_round_trips_string_parameters(params):
    """Any string parameters written in the format parse back exactly."""
    result = Qwen3CoderToolCallParser().parse(coder_call("f", params))
    assert not result.ill_formed
    assert result.calls[0].arguments == params


def test_convert_parameter_leaves_misfits_as_strings():
    """A value that does not fit its declared type is kept as the model wrote it."""
    assert convert_parameter("abc", {"type": "integer"}) == "abc"
    assert convert_parameter("maybe", {"type": "boolean"}) == "maybe"
    assert convert_parameter("[1,", {"type": "array"}) == "[1,"
    assert convert_parameter("7", {"type": "number"}) == 7
    assert convert_parameter("7", None) == "7"
    assert convert_parameter("null", None) == "null"
    assert convert_parameter("null", {"type": "string"}) == "null"
    assert convert_parameter("null", {"type": "integer"}) is None


# -- never raises ----------------------------------------------------------------------

fragments = st.sampled_from(
    [
        "<tool_call>",
        "</tool_call>",
        "<function=bash>",
        "</function>",
        "<parameter=command>",
        "</parameter>",
        '{"name": "bash", "arguments": {}}',
        "{",
        "}",
        "\n",
        "<think>",
        "</think>",
        "text",
    ]
)


@settings(max_examples=300)
@given(st.lists(st.one_of(fragments, st.text(max_size=5)), max_size=12).map("".join))
def test_parsers_never_raise_and_keep_text_when_nothing_parses(text):
    """On arbitrary tag soup no parser raises, and without calls the text is unchanged."""
    for parser in (HermesToolCallParser(TOOLS), Qwen3CoderToolCallParser(TOOLS)):
        result = parser.parse(text)
        if not result.calls:
            assert result.normal_text == text
        if parser.start_token not in text:
            assert not result.ill_formed
    for reasoning in (Qwen3ReasoningParser(), DeepSeekR1ReasoningParser()):
        reasoning.parse(text)


# -- reasoning ---------------------------------------------------------------------------


def test_qwen3_reasoning_with_think_block():
    """<think>…</think> splits into reasoning and content, whitespace trimmed."""
    result = Qwen3ReasoningParser().parse("<think>\nplan it\n</think>\n\nThe answer.")
    assert (result.reasoning, result.content) == ("plan it", "The answer.")
    assert result.has_reasoning and result.reasoning_closed


def test_reasoning_split_as_sampled_keeps_every_character():
    """``sampled_reasoning`` / ``sampled_content`` are the split with nothing trimmed."""
    cases = {
        "<think>\n  plan  \n</think>\n\n  Answer.  ": ("\n  plan  \n", "\n\n  Answer.  "),
        "<think>\n\n</think>\n\nHi": ("\n\n", "\n\nHi"),
        "plan\n</think>\n\nHi": ("plan\n", "\n\nHi"),
        "<think>\nplan <tool_call>x": ("\nplan ", "<tool_call>x"),
        "<think>\ncut off ": ("\ncut off ", ""),
    }
    for text, sampled in cases.items():
        result = Qwen3ReasoningParser().parse(text)
        assert (result.sampled_reasoning, result.sampled_content) == sampled, text
        assert result.reasoning == sampled[0].strip()


def test_qwen3_without_reasoning_returns_text_unchanged():
    """No think tags (enable_thinking=False) means all content, untouched."""
    result = Qwen3ReasoningParser().parse("Just text\n")
    assert (result.reasoning, result.content, result.has_reasoning) == ("", "Just text\n", False)


def test_reasoning_opened_by_the_prompt():
    """When the template opened <think>, output before </think> is reasoning."""
    text = "I should list files.\n</think>\n\nDone."
    for parser in (Qwen3ReasoningParser(), Qwen3ReasoningParser(in_reasoning=True)):
        result = parser.parse(text)
        assert (result.reasoning, result.content) == ("I should list files.", "Done.")
    assert DeepSeekR1ReasoningParser().parse(text).reasoning == "I should list files."
    not_opened = Qwen3ReasoningParser().parse(text, in_reasoning=False)
    assert not not_opened.has_reasoning and not_opened.content == text


def test_truncated_reasoning_is_unclosed():
    """Output cut off inside the block is all reasoning, flagged unclosed."""
    result = DeepSeekR1ReasoningParser().parse("<think>\nstill thinking")
    assert result.reasoning == "still thinking"
    assert result.content == "" and not result.reasoning_closed


def test_deepseek_r1_forces_reasoning_by_default():
    """deepseek_r1 treats output as reasoning until </think>, even without tags."""
    result = DeepSeekR1ReasoningParser().parse("thinking without a close")
    assert result.reasoning == "thinking without a close" and not result.reasoning_closed
    assert DeepSeekR1ReasoningParser().parse("plain", in_reasoning=False).content == "plain"


def test_qwen3_tool_call_ends_unclosed_reasoning():
    """A <tool_call> inside an unclosed block ends the reasoning; the call stays in content."""
    call = '<tool_call>\n{"name": "bash", "arguments": {}}\n</tool_call>'
    result = Qwen3ReasoningParser().parse(f"<think>\nneed ls\n{call}")
    assert result.reasoning == "need ls"
    assert result.content == call and result.reasoning_closed


def test_prompt_opens_reasoning(qwen_tokenizer):
    """The rendered generation prompt tells whether <think> is left open."""
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b", "reasoning_content": "r"},
        {"role": "tool", "content": "c"},
    ]
    normal = qwen_tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    no_think = qwen_tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False, enable_thinking=False
    )
    assert "</think>" in normal
    assert not ReasoningParser.prompt_opens_reasoning(normal)
    assert not ReasoningParser.prompt_opens_reasoning(no_think)
    assert ReasoningParser.prompt_opens_reasoning(normal + "<think>\n")


# -- registration ------------------------------------------------------------------------


def test_builtin_parsers_are_registered_by_type():
    """The plugin registers two tool-call and two reasoning parsers with parser_type."""
    registry = plugins.PluginRegistry(builtins=("agentrl.parsers",), load_entrypoints=False)
    assert registry.get("tool_parser", "hermes") is HermesToolCallParser
    assert registry.get("tool_parser", "qwen3_coder") is Qwen3CoderToolCallParser
    assert registry.get("reasoning_parser", "qwen3") is Qwen3ReasoningParser
    assert registry.get("reasoning_parser", "deepseek_r1") is DeepSeekR1ReasoningParser
    with pytest.raises(plugins.NotAvailableError, match="hermes"):
        registry.get("tool_parser", "nope")


def test_sglang_family_registers_nothing_without_sglang():
    """With SGLang not importable, no sglang:* parser is registered."""
    if sglang_family.sglang_parser_modules() is not None:
        pytest.fail("this test needs an environment without SGLang; see test_parsers_sglang.py")
    registered = []
    assert sglang_family.register_sglang_parsers(registered.append) == []
    assert registered == []


@pytest.fixture
def fake_sglang(monkeypatch):
    """Stand-ins for SGLang's parser modules (its Python API), installed in sys.modules."""

    class Item:
        def __init__(self, name, parameters):
            self.name, self.parameters = name, parameters

    class Detector:
        bot_token = "<tool_call>"
        think_end_token = "</think>"

        def has_tool_call(self, text):
            return self.bot_token in text

    class FunctionCallParser:
        ToolCallParserEnum: ClassVar[dict[str, type]] = {"hermes": Detector, "qwen25": Detector}

        def __init__(self, tools, tool_call_parser):
            self.tools, self.detector = tools, Detector()

        def parse_non_stream(self, text):
            head, sep, rest = text.partition("<tool_call>")
            if not sep:
                return text, []
            try:
                payload = json.loads(rest.split("</tool_call>")[0])
            except ValueError:
                return head, []
            return head.strip(), [Item(payload["name"], json.dumps(payload["arguments"]))]

    class ReasoningParserStub:
        DetectorMap: ClassVar[dict[str, type]] = {"qwen3": Detector, "deepseek-r1": Detector}

        def __init__(self, model_type, stream_reasoning, force_reasoning):
            self.detector = Detector()
            self.force = force_reasoning

        def parse_non_stream(self, text):
            if "</think>" not in text:
                return ("", text) if not self.force else (text, "")
            reasoning, _, content = text.partition("</think>")
            return reasoning.replace("<think>", ""), content

    class Tool:
        @classmethod
        def model_validate(cls, payload):
            return payload

    def module(name, **attrs):
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, mod)

    for name in ("sglang", "sglang.srt", "sglang.srt.function_call", "sglang.srt.parser"):
        module(name)
    module("sglang.srt.function_call.function_call_parser", FunctionCallParser=FunctionCallParser)
    module("sglang.srt.parser.reasoning_parser", ReasoningParser=ReasoningParserStub)
    module("sglang.srt.entrypoints.openai.protocol", Tool=Tool)
    return FunctionCallParser


def test_sglang_family_wraps_every_sglang_name(fake_sglang):
    """Every name in SGLang's registries is registered as sglang:<name>, typed correctly."""
    registered = []
    names = sglang_family.register_sglang_parsers(registered.append)
    assert names == ["sglang:hermes", "sglang:qwen25", "sglang:deepseek-r1", "sglang:qwen3"]
    kinds = {cls.name: cls.parser_type for cls in registered}
    assert kinds["sglang:qwen25"] == "tool_call" and kinds["sglang:qwen3"] == "reasoning"


def test_sglang_wrappers_keep_the_parser_contracts(fake_sglang):
    """Wrapped SGLang parsers return ToolCalls, flag unparsed calls and never raise."""
    registered = {}
    sglang_family.register_sglang_parsers(lambda cls: registered.setdefault(cls.name, cls))
    tool_parser = registered["sglang:hermes"](TOOLS)
    ok = tool_parser.parse(
        'Hi\n<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>'
    )
    assert ok.normal_text == "Hi"
    assert ok.calls == (ToolCall(name="bash", arguments={"command": "ls"}, raw=""),)
    bad_text = "Hi\n<tool_call>{nope</tool_call>"
    bad = tool_parser.parse(bad_text)
    assert bad.ill_formed and bad.normal_text == bad_text and bad.calls == ()
    reasoning = registered["sglang:deepseek-r1"]().parse("hmm</think>ok", in_reasoning=True)
    assert (reasoning.reasoning, reasoning.content) == ("hmm", "ok")


def test_sglang_names_do_not_collide_with_builtins(fake_sglang):
    """With SGLang present the registry holds built-ins and sglang:* side by side."""
    registry = plugins.PluginRegistry(builtins=("agentrl.parsers",), load_entrypoints=False)
    assert {"hermes", "sglang:hermes", "qwen3_coder"} <= set(registry.available("tool_parser"))
    assert {"qwen3", "sglang:qwen3", "deepseek_r1"} <= set(registry.available("reasoning_parser"))
