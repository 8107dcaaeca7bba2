"""Qwen Code (``@qwen-code/qwen-code``), speaking the OpenAI Chat Completions API."""

from __future__ import annotations

import json
from typing import Any, ClassVar

import attrs

from agentrl.harnesses.base import ClientSetup, Harness, HarnessContext

__all__ = ["QwenCodeHarness"]

#: The model name Qwen Code sends (any name: the middleware serves every one).
DEFAULT_MODEL = "agentrl-policy"


@attrs.define(kw_only=True)
class QwenCodeHarness(Harness):
    """Runs ``qwen --yolo --output-format stream-json PROMPT`` headless (one-shot).

    ``$HOME/.qwen/settings.json`` selects the OpenAI-compatible provider and the model
    name, and turns off what would leave the sandbox or add model calls: usage statistics
    (sent to Aliyun RUM unless disabled), telemetry, auto-update, managed auto-memory,
    follow-up suggestions and tool-use summaries. The session token travels as
    ``OPENAI_API_KEY`` (``Authorization: Bearer``) to ``OPENAI_BASE_URL`` (the middleware's
    ``/v1``). Every tool call is pre-approved (``--yolo``).

    Options: ``max_turns`` (``model.maxSessionTurns``), ``exclude_tools`` (``tools.exclude``),
    ``core_tools`` (``tools.core``: only these built-in tools), ``append_system_prompt``
    (``--append-system-prompt``), ``request_timeout`` (seconds Qwen Code waits for a reply;
    the middleware answers only once the whole generation is done), ``max_retries`` (of a
    failed model call).

    Extra arguments / environment: ``AGENTRL_QWEN_CODE_EXTRA_ARGS`` (JSON list) and
    ``AGENTRL_QWEN_CODE_EXTRA_ENV`` (JSON object).
    """

    name: ClassVar[str] = "qwen_code"
    protocol: ClassVar[str] = "openai_chat"
    binary: ClassVar[str] = "qwen"
    npm_package: ClassVar[str] = "@qwen-code/qwen-code"
    extra_args_vars: ClassVar[tuple[str, ...]] = ("AGENTRL_QWEN_CODE_EXTRA_ARGS",)
    extra_env_vars: ClassVar[tuple[str, ...]] = ("AGENTRL_QWEN_CODE_EXTRA_ENV",)
    workspace_excludes: ClassVar[tuple[str, ...]] = (".qwen",)

    max_turns: int | None = None
    exclude_tools: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    core_tools: tuple[str, ...] | None = attrs.field(
        default=None, converter=attrs.converters.optional(tuple)
    )
    append_system_prompt: str | None = None
    request_timeout: float = 3600.0
    max_retries: int = 2

    @classmethod
    def client_setup(cls, base_url: str, token: str) -> ClientSetup:
        """``qwen`` with the session's URL and token in its environment, no usage statistics."""
        return ClientSetup(
            title="Qwen Code",
            lines=(
                f"OPENAI_BASE_URL={base_url}/v1 OPENAI_API_KEY={token} \\",
                f"QWEN_USAGE_STATISTICS_ENABLED=false {cls.binary} --auth-type openai "
                f"--model {DEFAULT_MODEL}",
            ),
        )

    def settings(self, ctx: HarnessContext) -> dict[str, Any]:
        """The user ``settings.json`` that routes every model call to the session."""
        timeout_ms = int(self.request_timeout * 1000)
        tools: dict[str, Any] = {"useRipgrep": False}
        if self.exclude_tools:
            tools["exclude"] = list(self.exclude_tools)
        if self.core_tools is not None:
            tools["core"] = list(self.core_tools)
        model: dict[str, Any] = {
            "name": ctx.model or self.model or DEFAULT_MODEL,
            "generationConfig": {
                "timeout": timeout_ms,
                "streamIdleTimeoutMs": timeout_ms,
                "maxRetries": self.max_retries,
            },
        }
        if self.max_turns is not None:
            model["maxSessionTurns"] = self.max_turns
        return {
            "security": {"auth": {"selectedType": "openai"}},
            "model": model,
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
            "general": {"enableAutoUpdate": False},
            "memory": {"enableManagedAutoMemory": False, "enableManagedAutoDream": False},
            "ui": {"enableFollowupSuggestions": False},
            "experimental": {"emitToolUseSummaries": False},
            "tools": tools,
        }

    def config_files(self, ctx: HarnessContext) -> dict[str, str]:
        settings = json.dumps(self.settings(ctx), indent=2) + "\n"
        return {f"{self.home}/.qwen/settings.json": settings}

    def command(self, ctx: HarnessContext) -> list[str]:
        # The prompt follows as the positional query (one-shot, like the deprecated -p).
        argv = ["--yolo", "--output-format", "stream-json"]
        if self.append_system_prompt:
            argv += ["--append-system-prompt", self.append_system_prompt]
        return argv

    def cli_environment(self, ctx: HarnessContext, time_budget: float) -> dict[str, str]:
        return {
            "OPENAI_BASE_URL": ctx.base_url.rstrip("/") + "/v1",
            "OPENAI_API_KEY": ctx.api_key,
            "QWEN_USAGE_STATISTICS_ENABLED": "false",  # also off in settings.json
            # Yolo without Qwen Code's own sandbox: the agentrl sandbox is the boundary.
            "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1",
        }
