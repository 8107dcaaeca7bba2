"""Parser names: a bare SGLang name resolves to the proven built-in or to SGLang's parser.

The registry getters (``plugins.get_tool_parser`` / ``get_reasoning_parser``) do the
resolution, so ``agentrl serve --tool-parser glm45`` and slime's
``--sglang-tool-call-parser glm45`` mean the same. "SGLang present" is the stand-in of
tests/support/sglang_standin.py: SGLang's module layout on ``sys.path``, not SGLang.
"""

from __future__ import annotations

import pytest
import sglang_standin

from agentrl import plugins
from agentrl.parsers import sglang as sglang_family
from agentrl.parsers.base import ReasoningParser, ToolCall, ToolCallParser
from agentrl.parsers.hermes import HermesToolCallParser
from agentrl.parsers.qwen3_coder import Qwen3CoderToolCallParser
from agentrl.parsers.reasoning import DeepSeekR1ReasoningParser, Qwen3ReasoningParser

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]

#: SGLang name -> the built-in the differential test (test_parsers_sglang.py) proves
#: identical. Claiming another name needs a differential test first.
PROVEN = {
    ("tool_parser", "hermes"): HermesToolCallParser,
    ("tool_parser", "qwen3_coder"): Qwen3CoderToolCallParser,
    ("reasoning_parser", "qwen3"): Qwen3ReasoningParser,
    ("reasoning_parser", "deepseek-r1"): DeepSeekR1ReasoningParser,
}


def _get(kind, name):
    getter = plugins.get_tool_parser if kind == "tool_parser" else plugins.get_reasoning_parser
    return getter(name)


def test_builtins_claim_exactly_the_proven_sglang_names():
    """Each built-in's sglang_equivalents is what the differential test proves, no more."""
    claimed = {
        (kind, name): cls
        for kind, base in (("tool_parser", ToolCallParser), ("reasoning_parser", ReasoningParser))
        for cls in plugins.PluginRegistry(
            builtins=("agentrl.parsers",), load_entrypoints=False
        ).registered(kind)
        if issubclass(cls, base)
        for name in cls.sglang_equivalents
    }
    assert claimed == PROVEN


@pytest.mark.parametrize(("kind", "name"), sorted(PROVEN))
def test_proven_sglang_names_resolve_to_builtins_without_sglang(
    agentrl_registry, no_sglang, kind, name
):
    """Without SGLang, an SGLang name a built-in is proven to match resolves to it."""
    assert _get(kind, name) is PROVEN[(kind, name)]


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("tool_parser", "glm45"),
        ("tool_parser", "qwen25"),
        ("tool_parser", "sglang:glm45"),
        ("reasoning_parser", "qwen3-thinking"),
    ],
)
def test_unknown_name_without_sglang_says_to_install_it(agentrl_registry, no_sglang, kind, name):
    """Without SGLang a non-built-in name fails listing the built-ins, sglang:<name>, pip."""
    with pytest.raises(plugins.NotAvailableError) as caught:
        _get(kind, name)
    message = str(caught.value)
    builtins = ("hermes", "qwen3_coder") if kind == "tool_parser" else ("qwen3", "deepseek_r1")
    assert all(builtin in message for builtin in builtins)
    bare = name.removeprefix("sglang:")
    assert f"'sglang:{bare}'" in message
    assert "install SGLang" in message and "pip install" in message
    assert "make test-sglang" in message


def test_getters_resolve_a_bare_name_to_sglangs_parser(agentrl_registry, standin_sglang):
    """With SGLang's modules present, glm45 (no built-in) is SGLang's glm45, and it parses."""
    cls = plugins.get_tool_parser("glm45")
    assert cls is plugins.get_tool_parser("sglang:glm45")
    assert issubclass(cls, sglang_family.SGLangToolCallParser) and cls.sglang_name == "glm45"
    function_call_parser, _ = sglang_family.sglang_parser_modules()
    assert sglang_standin.is_standin(function_call_parser)
    text = "Checking.\n<tool_call>bash\n<arg_key>command</arg_key>\n<arg_value>ls</arg_value>\n</tool_call>"
    result = cls(TOOLS).parse(text)
    assert result.calls == (ToolCall(name="bash", arguments={"command": "ls"}, raw=""),)
    assert result.normal_text == "Checking." and not result.ill_formed
    reasoning = plugins.get_reasoning_parser("glm45")
    assert reasoning.name == "sglang:glm45"
    split = reasoning().parse("<think>plan</think>done")
    assert (split.reasoning, split.content) == ("plan", "done")


def test_unproven_alias_is_sglangs_own_when_sglang_is_present(agentrl_registry, standin_sglang):
    """qwen25 and qwen3-thinking are not proven identical to a built-in: SGLang's serve them."""
    assert plugins.get_tool_parser("qwen25").name == "sglang:qwen25"
    assert plugins.get_reasoning_parser("qwen3-thinking").name == "sglang:qwen3-thinking"


@pytest.mark.parametrize(("kind", "name"), sorted(PROVEN))
def test_proven_builtins_win_over_sglang(agentrl_registry, standin_sglang, kind, name):
    """With SGLang present, a name a built-in is proven identical for still gets the built-in."""
    assert f"sglang:{name}" in plugins.available(kind)
    assert _get(kind, name) is PROVEN[(kind, name)]


def test_name_sglang_lacks_too_says_so(agentrl_registry, standin_sglang):
    """With SGLang present, a name neither knows fails saying SGLang has no such parser."""
    with pytest.raises(plugins.NotAvailableError) as caught:
        plugins.get_tool_parser("qwen3")
    message = str(caught.value)
    assert "SGLang has no parser named 'qwen3'" in message
    assert "sglang:glm45" in message and "hermes" in message


def test_get_parser_rejects_other_kinds(agentrl_registry):
    """get_parser is for parser kinds only; another kind is a programming error."""
    with pytest.raises(ValueError, match="not a parser kind"):
        agentrl_registry.get_parser("sandbox", "local")
