"""slime's --sglang-tool-call-parser / --sglang-reasoning-parser, read as SGLang names.

Each test goes through ``ServiceSettings.from_args(args, config).parser_classes()``, what
the service does on its first call. "SGLang present" is the stand-in of
tests/support/sglang_standin.py (SGLang's module layout on ``sys.path``, not SGLang).
"""

from __future__ import annotations

import types

import pytest

from agentrl.parsers import sglang as sglang_family
from agentrl.parsers.hermes import HermesToolCallParser
from agentrl.parsers.qwen3_coder import Qwen3CoderToolCallParser
from agentrl.parsers.reasoning import DeepSeekR1ReasoningParser, Qwen3ReasoningParser
from agentrl.slime.config import SlimeConfig, SlimeConfigError
from agentrl.slime.service import ServiceSettings, resolve_parser


def _settings(tool=None, reasoning=None):
    args = types.SimpleNamespace(
        hf_checkpoint="/models/m",
        sglang_router_ip="10.0.0.1",
        sglang_router_port=30000,
        sglang_tool_call_parser=tool,
        sglang_reasoning_parser=reasoning,
    )
    return ServiceSettings.from_args(args, SlimeConfig.from_env({}))


@pytest.mark.parametrize(
    ("tool", "reasoning", "expected"),
    [
        ("hermes", "qwen3", (HermesToolCallParser, Qwen3ReasoningParser)),
        ("qwen3_coder", "deepseek-r1", (Qwen3CoderToolCallParser, DeepSeekR1ReasoningParser)),
        (None, None, (None, None)),
        ("", "", (None, None)),
    ],
)
def test_proven_names_resolve_to_builtins_without_sglang(
    agentrl_registry, no_sglang, tool, reasoning, expected
):
    """SGLang names a built-in is proven identical for need no SGLang; unset flags are None."""
    assert _settings(tool, reasoning).parser_classes() == expected


def test_glm45_resolves_to_sglangs_parser_in_a_slime_job(agentrl_registry, standin_sglang):
    """--sglang-tool-call-parser glm45 / --sglang-reasoning-parser glm45 are SGLang's glm45."""
    tool, reasoning = _settings("glm45", "glm45").parser_classes()
    assert tool.name == "sglang:glm45" and tool.sglang_name == "glm45"
    assert reasoning.name == "sglang:glm45"
    assert issubclass(tool, sglang_family.SGLangToolCallParser)
    text = "<tool_call>bash\n<arg_key>command</arg_key>\n<arg_value>ls</arg_value>\n</tool_call>"
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {}}}]
    assert [(c.name, c.arguments) for c in tool(tools).parse(text).calls] == [
        ("bash", {"command": "ls"})
    ]


def test_proven_builtins_win_in_a_slime_job(agentrl_registry, standin_sglang):
    """With SGLang present, hermes / deepseek-r1 still get the built-ins proven identical."""
    assert _settings("hermes", "deepseek-r1").parser_classes() == (
        HermesToolCallParser,
        DeepSeekR1ReasoningParser,
    )
    assert _settings("qwen25", "qwen3-thinking").parser_classes()[0].name == "sglang:qwen25"


def test_glm45_without_sglang_names_the_flag_and_says_to_install(agentrl_registry, no_sglang):
    """Without SGLang, glm45 fails naming the flag, the built-ins, sglang:glm45 and pip."""
    with pytest.raises(SlimeConfigError) as caught:
        _settings("glm45", None).parser_classes()
    message = str(caught.value)
    assert message.startswith("--sglang-tool-call-parser 'glm45'")
    assert "hermes" in message and "qwen3_coder" in message and "'sglang:glm45'" in message
    assert "install SGLang" in message and "pip install" in message


def test_unknown_reasoning_name_names_its_flag(agentrl_registry, no_sglang):
    """The reasoning flag's error names --sglang-reasoning-parser and the built-ins."""
    with pytest.raises(SlimeConfigError, match=r"--sglang-reasoning-parser 'nope'.*deepseek_r1"):
        resolve_parser("reasoning_parser", "nope")
