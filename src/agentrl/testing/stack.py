"""The pieces of a rollout stack that tests assemble around the doubles: middleware, sandboxes.

``started_middleware`` runs the real middleware (all three built-in adapters, Qwen3's
parsers) in front of any engine, usually the real ``sglang`` client aimed at the scripted
SGLang server; ``LocalSandboxes`` is a ``SandboxFactory`` of real ``local`` sandboxes for
``Grader.grade`` and ``run_rollout``. Importing this module loads nothing heavy.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrl.adapters.base import Adapter
    from agentrl.engines.base import Engine
    from agentrl.parsers.base import ReasoningParser, ToolCallParser
    from agentrl.sandboxes.local import LocalSandbox
    from agentrl.serve.middleware import Middleware
    from agentrl.types import Task

__all__ = ["LocalSandboxes", "builtin_adapters", "qwen_parsers", "started_middleware"]


def qwen_parsers() -> tuple[ToolCallParser, ReasoningParser]:
    """Qwen3's parsers: ``hermes`` tool calls and ``qwen3`` reasoning."""
    from agentrl.parsers.hermes import HermesToolCallParser
    from agentrl.parsers.reasoning import Qwen3ReasoningParser

    return HermesToolCallParser(), Qwen3ReasoningParser()


def builtin_adapters() -> list[Adapter]:
    """Anthropic Messages, OpenAI Responses and OpenAI Chat Completions, in that order."""
    from agentrl.adapters.anthropic import AnthropicAdapter
    from agentrl.adapters.openai_chat import OpenAIChatAdapter
    from agentrl.adapters.openai_responses import OpenAIResponsesAdapter

    return [AnthropicAdapter(), OpenAIResponsesAdapter(), OpenAIChatAdapter()]


@contextlib.asynccontextmanager
async def started_middleware(
    engine: Engine, tokenizer: Any, *, unix_path: str | None = None, **options: Any
) -> AsyncIterator[Middleware]:
    """A middleware on 127.0.0.1:0 (and ``unix_path`` when given) with the built-in adapters
    and Qwen3's parsers, closed on exit; ``options`` go to ``Middleware`` as they are."""
    from agentrl.serve.middleware import Middleware
    from agentrl.trajectory import TrajectoryManager

    tool_parser, reasoning_parser = qwen_parsers()
    middleware = Middleware(
        engine=engine,
        tokenizer=tokenizer,
        tool_parser=tool_parser,
        reasoning_parser=reasoning_parser,
        trajectory=TrajectoryManager(),
        adapters=builtin_adapters(),
        **options,
    )
    await middleware.start(host="127.0.0.1", port=0, unix_path=unix_path)
    try:
        yield middleware
    finally:
        await middleware.close()


class LocalSandboxes:
    """A ``SandboxFactory``: ``factory(task)`` is a ``local`` sandbox for ``task``, not started.

    ``options`` go to ``LocalSandbox.from_task`` (add ``services={port: middleware.unix_path}``
    for an agent that calls the middleware); ``built`` lists every sandbox made, in order.
    """

    def __init__(self, state_dir: str | os.PathLike[str], **options: Any) -> None:
        self.options: dict[str, Any] = {"state_dir": pathlib.Path(state_dir), **options}
        self.built: list[LocalSandbox] = []

    def __call__(self, task: Task) -> LocalSandbox:
        from agentrl.sandboxes.local import LocalSandbox

        sandbox = LocalSandbox.from_task(task, **self.options)
        self.built.append(sandbox)
        return sandbox
