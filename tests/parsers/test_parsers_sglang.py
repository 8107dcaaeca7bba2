"""Differential tests: the built-in parsers agree with SGLang's on well-formed output.

Opt-in (marker ``sglang``, deselected by default): run with ``make test-sglang`` or
``python -m pytest -m sglang tests/parsers/test_parsers_sglang.py`` after ``pip install sglang``.
Malformed output is out of scope here: there the built-ins deliberately keep the text
visible and flag ``ill_formed``, where SGLang logs and drops.

A built-in lists in ``sglang_equivalents`` exactly the SGLang names proven here; the last
tests check, against real SGLang, that every SGLang name resolves through the registry
(the proven built-in or SGLang's own) and that docs/slime.md names only parsers SGLang has.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.parsers import sglang as sglang_family
from agentrl.parsers.hermes import HermesToolCallParser
from agentrl.parsers.qwen3_coder import Qwen3CoderToolCallParser
from agentrl.parsers.reasoning import DeepSeekR1ReasoningParser, Qwen3ReasoningParser

pytestmark = pytest.mark.sglang

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write a file",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "content": {"type": "string"},
                    "mode": {"type": "integer"},
                    "force": {"type": "boolean"},
                },
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    },
]


@pytest.fixture(scope="module")
def sglang_parsers():
    """SGLang's parser classes wrapped as sglang:<name>; fails loudly if SGLang is missing."""
    if sglang_family.sglang_parser_modules() is None:
        pytest.fail(
            "SGLang's parser modules do not import; install SGLang (pip install sglang) to run "
            "the differential tests"
        )
    registered = {}
    sglang_family.register_sglang_parsers(
        lambda cls: registered.setdefault((cls.parser_type, cls.name), cls)
    )
    return registered


safe_text = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=30
).filter(lambda t: "<" not in t and ">" not in t)
write_args = st.fixed_dictionaries(
    {"path": safe_text.filter(lambda t: t.strip() == t and t), "content": safe_text},
    optional={"mode": st.integers(0, 4096), "force": st.booleans()},
)


def hermes_call(name, args):
    """One call as the Qwen3 template writes it."""
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(args, ensure_ascii=False)}}}\n</tool_call>'


def coder_call(name, args):
    """One call as the Qwen3-Coder template writes it."""
    body = "".join(
        f"<parameter={k}>\n{json.dumps(v) if not isinstance(v, str) else v}\n</parameter>\n"
        for k, v in args.items()
    )
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def calls_of(result):
    """(name, arguments) pairs of a parse result."""
    return [(c.name, c.arguments) for c in result.calls]


@settings(max_examples=100, deadline=None)
@given(prefix=safe_text, calls=st.lists(write_args, min_size=1, max_size=3))
def test_hermes_matches_sglang(sglang_parsers, prefix, calls):
    """Built-in hermes and sglang:hermes return the same calls and leading text."""
    text = (prefix + "\n" if prefix.strip() else "") + "\n".join(
        hermes_call("write_file", args) for args in calls
    )
    ours = HermesToolCallParser(TOOLS).parse(text)
    theirs = sglang_parsers[("tool_call", "sglang:hermes")](TOOLS).parse(text)
    assert calls_of(ours) == calls_of(theirs)
    assert ours.normal_text.strip() == theirs.normal_text.strip()


@settings(max_examples=100, deadline=None)
@given(prefix=safe_text, calls=st.lists(write_args, min_size=1, max_size=3))
def test_qwen3_coder_matches_sglang(sglang_parsers, prefix, calls):
    """Built-in qwen3_coder and sglang:qwen3_coder agree on calls, typed by the schema."""
    text = (prefix + "\n" if prefix.strip() else "") + "\n".join(
        coder_call("write_file", args) for args in calls
    )
    ours = Qwen3CoderToolCallParser(TOOLS).parse(text)
    theirs = sglang_parsers[("tool_call", "sglang:qwen3_coder")](TOOLS).parse(text)
    assert calls_of(ours) == calls_of(theirs)
    assert ours.normal_text.strip() == theirs.normal_text.strip()


@settings(max_examples=100, deadline=None)
@given(reasoning=safe_text, content=safe_text, opened=st.booleans())
def test_reasoning_parsers_match_sglang(sglang_parsers, reasoning, content, opened):
    """qwen3 / deepseek_r1 split reasoning like sglang:qwen3 / sglang:deepseek-r1."""
    text = ("" if opened else "<think>\n") + f"{reasoning}\n</think>\n\n{content}"
    pairs = [
        (Qwen3ReasoningParser(), sglang_parsers[("reasoning", "sglang:qwen3")]()),
        (DeepSeekR1ReasoningParser(), sglang_parsers[("reasoning", "sglang:deepseek-r1")]()),
    ]
    for ours_parser, theirs_parser in pairs:
        ours = ours_parser.parse(text, in_reasoning=True if opened else None)
        theirs = theirs_parser.parse(text, in_reasoning=True if opened else None)
        assert ours.reasoning.strip() == theirs.reasoning.strip()
        assert ours.content.strip() == theirs.content.strip()


def test_every_sglang_name_is_registered(sglang_parsers):
    """Each name in SGLang's registries appears as an sglang:<name> parser."""
    function_call_parser, reasoning_parser = sglang_family.sglang_parser_modules()
    tool_names = {name for kind, name in sglang_parsers if kind == "tool_call"}
    reasoning_names = {name for kind, name in sglang_parsers if kind == "reasoning"}
    assert tool_names == {f"sglang:{n}" for n in function_call_parser.ToolCallParserEnum}
    assert reasoning_names == {f"sglang:{n}" for n in reasoning_parser.DetectorMap}


def test_bare_sglang_names_resolve_through_the_registry(agentrl_registry, sglang_parsers):
    """Every SGLang name resolves by the registry getters: the proven built-in or SGLang's."""
    from agentrl import plugins

    function_call_parser, reasoning_parser = sglang_family.sglang_parser_modules()
    lookups = [
        (plugins.get_tool_parser, function_call_parser.ToolCallParserEnum),
        (plugins.get_reasoning_parser, reasoning_parser.DetectorMap),
    ]
    for getter, sglang_names in lookups:
        for name in sglang_names:
            cls = getter(name)
            if name in cls.sglang_equivalents:
                assert not cls.name.startswith("sglang:")
            else:
                assert (cls.name, cls.sglang_name) == (f"sglang:{name}", name)
    assert plugins.get_tool_parser("glm45").name == "sglang:glm45"


def test_builtin_names_sglang_also_has_are_proven(sglang_parsers):
    """A built-in whose own name is an SGLang name claims it, so the name means one format."""
    function_call_parser, reasoning_parser = sglang_family.sglang_parser_modules()
    for builtin, sglang_names in [
        (HermesToolCallParser, function_call_parser.ToolCallParserEnum),
        (Qwen3CoderToolCallParser, function_call_parser.ToolCallParserEnum),
        (Qwen3ReasoningParser, reasoning_parser.DetectorMap),
        (DeepSeekR1ReasoningParser, reasoning_parser.DetectorMap),
    ]:
        assert set(builtin.sglang_equivalents) <= set(sglang_names)
        if builtin.name in sglang_names:
            assert builtin.name in builtin.sglang_equivalents


def test_docs_parser_table_lists_only_names_sglang_accepts(sglang_parsers):
    """docs/slime.md's parser table names only tool-call / reasoning parsers SGLang has."""
    import pathlib
    import re

    docs = pathlib.Path(__file__).resolve().parents[2] / "docs" / "slime.md"
    table = docs.read_text().split("| SGLang name |", 1)[1].split("\n\n", 1)[0]
    function_call_parser, reasoning_parser = sglang_family.sglang_parser_modules()
    known = {"tool calls": function_call_parser.ToolCallParserEnum}
    known["reasoning"] = reasoning_parser.DetectorMap
    checked = 0
    for row in table.splitlines()[2:]:
        for part in row.split("|")[1].split(";"):
            kind = re.search(r"\((tool calls|reasoning)\)", part).group(1)
            for name in re.findall(r"`([^`]+)`", part):
                assert name in known[kind], f"docs/slime.md lists {kind} parser {name!r}"
                checked += 1
    assert checked >= 20
