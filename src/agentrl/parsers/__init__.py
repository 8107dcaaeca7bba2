"""Tool-call and reasoning parsers (built-in plugin `agentrl.parsers`)."""

from __future__ import annotations

from agentrl.hookspecs import hookimpl


@hookimpl(trylast=True)
def register_parsers(register):
    """Register the built-in classes; heavy dependencies load only when one is used."""
    from agentrl.parsers.hermes import HermesToolCallParser
    from agentrl.parsers.qwen3_coder import Qwen3CoderToolCallParser
    from agentrl.parsers.reasoning import DeepSeekR1ReasoningParser, Qwen3ReasoningParser
    from agentrl.parsers.sglang import register_sglang_parsers

    register(HermesToolCallParser)
    register(Qwen3CoderToolCallParser)
    register(Qwen3ReasoningParser)
    register(DeepSeekR1ReasoningParser)
    register_sglang_parsers(register)
