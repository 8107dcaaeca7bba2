"""Claude Code (``@anthropic-ai/claude-code``), speaking the Anthropic Messages API."""

from __future__ import annotations

import json
from typing import ClassVar

import attrs

from agentrl.harnesses.base import ClientSetup, Harness, HarnessContext

__all__ = ["ClaudeCodeHarness"]


@attrs.define(kw_only=True)
class ClaudeCodeHarness(Harness):
    """Runs ``claude -p PROMPT --output-format stream-json --verbose`` headless.

    The session token travels as ``ANTHROPIC_AUTH_TOKEN`` (``Authorization: Bearer``) to
    ``ANTHROPIC_BASE_URL``; non-essential traffic (update checks, telemetry, the ``HEAD``
    probe) is off; permissions are pre-accepted (``bypassPermissions``) in the user
    settings and on the command line. Claude Code refuses ``bypassPermissions`` as root
    unless ``IS_SANDBOX=1``, which is set only when the agent user is root.

    Extra arguments / environment: ``AGENTRL_CLAUDE_CODE_EXTRA_ARGS`` (JSON list) and
    ``AGENTRL_CLAUDE_CODE_EXTRA_ENV`` (JSON object), or slime's
    ``SLIME_AGENT_CC_EXTRA_ARGS`` / ``SLIME_AGENT_CC_EXTRA_ENVS``.
    """

    name: ClassVar[str] = "claude_code"
    protocol: ClassVar[str] = "anthropic"
    binary: ClassVar[str] = "claude"
    npm_package: ClassVar[str] = "@anthropic-ai/claude-code"
    extra_args_vars: ClassVar[tuple[str, ...]] = (
        "AGENTRL_CLAUDE_CODE_EXTRA_ARGS",
        "SLIME_AGENT_CC_EXTRA_ARGS",
    )
    extra_env_vars: ClassVar[tuple[str, ...]] = (
        "AGENTRL_CLAUDE_CODE_EXTRA_ENV",
        "SLIME_AGENT_CC_EXTRA_ENVS",
    )
    workspace_excludes: ClassVar[tuple[str, ...]] = (".claude",)

    @classmethod
    def client_setup(cls, base_url: str, token: str) -> ClientSetup:
        """``claude`` with the session's URL and token in its environment, no side traffic."""
        return ClientSetup(
            title="Claude Code",
            lines=(
                f"ANTHROPIC_BASE_URL={base_url} ANTHROPIC_AUTH_TOKEN={token} \\",
                f"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 {cls.binary}",
            ),
        )

    def config_files(self, ctx: HarnessContext) -> dict[str, str]:
        settings = {
            "permissions": {"defaultMode": "bypassPermissions"},
            "skipDangerousModePermissionPrompt": True,
            "includeCoAuthoredBy": False,
        }
        state = {"hasCompletedOnboarding": True, "bypassPermissionsModeAccepted": True}
        return {
            f"{self.home}/.claude/settings.json": json.dumps(settings, indent=2) + "\n",
            f"{self.home}/.claude.json": json.dumps(state, indent=2) + "\n",
        }

    def command(self, ctx: HarnessContext) -> list[str]:
        argv = ["-p", "--output-format", "stream-json", "--verbose"]
        argv += ["--permission-mode", "bypassPermissions"]
        model = ctx.model or self.model
        if model:
            argv += ["--model", model]
        return argv

    def cli_environment(self, ctx: HarnessContext, time_budget: float) -> dict[str, str]:
        env = {
            "ANTHROPIC_BASE_URL": ctx.base_url.rstrip("/"),
            "ANTHROPIC_AUTH_TOKEN": ctx.api_key,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            # The middleware answers only after the whole generation; don't give up early.
            "API_TIMEOUT_MS": str(max(60_000, int(time_budget * 1000))),
        }
        if ctx.user == "root":
            env["IS_SANDBOX"] = "1"
        return env
