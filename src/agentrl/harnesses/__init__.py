"""Agent harnesses, one per agent CLI (built-in plugin `agentrl.harnesses`)."""

from __future__ import annotations

from agentrl.hookspecs import hookimpl


@hookimpl(trylast=True)
def register_harnesses(register):
    """Register the built-in classes; heavy dependencies load only when one is used."""
    from agentrl.harnesses.claude_code import ClaudeCodeHarness
    from agentrl.harnesses.codex import CodexHarness
    from agentrl.harnesses.mini_swe_agent import MiniSweAgentHarness
    from agentrl.harnesses.opencode import OpencodeHarness
    from agentrl.harnesses.qwen_code import QwenCodeHarness
    from agentrl.harnesses.tiny_agent import TinyAgentHarness

    register(ClaudeCodeHarness)
    register(CodexHarness)
    register(QwenCodeHarness)
    register(OpencodeHarness)
    register(MiniSweAgentHarness)
    register(TinyAgentHarness)
