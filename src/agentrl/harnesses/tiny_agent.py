"""The tiny agent: a short agent loop a small model can drive (``agentrl.trl``'s learning demo).

Its whole agent is ``tiny_agent_loop.py`` (standard library only), uploaded into the
sandbox and run by the sandbox's own ``python3``: a one-line system prompt, a one-line
instruction, one tool (``write_file``, called as a JSON object in the reply's text or
natively), OpenAI Chat Completions to the middleware. A 135M-parameter
model on a CPU turns it in about a second, where Claude Code's system prompt alone is
thousands of tokens.
"""

from __future__ import annotations

import json
import pathlib
from typing import ClassVar

import attrs

from agentrl.harnesses.base import Harness, HarnessContext

__all__ = ["DEFAULT_INSTRUCTION", "DEFAULT_SYSTEM_PROMPT", "TinyAgentHarness"]

#: The agent's system prompt (SmolLM2's own default: the model follows it best).
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."
#: Put before the task in the user message: how to call ``write_file`` in plain text.
DEFAULT_INSTRUCTION = (
    'Write a JSON object with "path" set to the file name and "content" set to the text.\n'
)
#: The loop's source, uploaded into every sandbox.
LOOP_SOURCE = pathlib.Path(__file__).with_name("tiny_agent_loop.py")
_KEY_VAR = "OPENAI_API_KEY"


@attrs.define(kw_only=True)
class TinyAgentHarness(Harness):
    """Runs ``python3 tiny_agent_loop.py CONFIG PROMPT`` with the sandbox's ``python3``.

    Options: ``system_prompt``, ``instruction`` (put before the task in the user message),
    ``native_tools`` (offer ``write_file`` as an OpenAI tool too; its schema then enters
    the prompt through the chat template, ~150 tokens), ``max_turns`` (model calls; 1 = one reply, its tool calls
    run and the episode ends; 2 = the tool's result, then a final answer), ``max_tokens``
    (per reply; 0 = the session's default) and ``request_timeout`` (seconds per call).
    """

    name: ClassVar[str] = "tiny_agent"
    protocol: ClassVar[str] = "openai_chat"
    binary: ClassVar[str] = "python3"
    install_kind: ClassVar[str] = "image"

    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    instruction: str = DEFAULT_INSTRUCTION
    native_tools: bool = False
    max_turns: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    max_tokens: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    request_timeout: float = attrs.field(default=600.0, validator=attrs.validators.gt(0))

    @property
    def script_path(self) -> str:
        return f"{self.state_dir}/tiny_agent_loop.py"

    @property
    def config_path(self) -> str:
        return f"{self.state_dir}/tiny_agent.json"

    def config_files(self, ctx: HarnessContext) -> dict[str, str]:
        config = {
            "base_url": ctx.base_url,
            "model": ctx.model or self.model or "agentrl-policy",
            "system": self.system_prompt,
            "instruction": self.instruction,
            "native_tools": self.native_tools,
            "max_turns": self.max_turns,
            "max_tokens": self.max_tokens,
            "timeout": self.request_timeout,
        }
        return {
            self.script_path: LOOP_SOURCE.read_text(),
            self.config_path: json.dumps(config, indent=2) + "\n",
        }

    def command(self, ctx: HarnessContext) -> list[str]:
        return [self.script_path, self.config_path]

    def cli_environment(self, ctx: HarnessContext, time_budget: float) -> dict[str, str]:
        return {_KEY_VAR: ctx.api_key, "PYTHONDONTWRITEBYTECODE": "1"}
