"""OpenAI Codex CLI (``@openai/codex``), speaking the OpenAI Responses API.

Codex 0.95 and later accept only ``wire_api = "responses"``.
"""

from __future__ import annotations

import json
from typing import ClassVar

import attrs

from agentrl.harnesses.base import ClientSetup, Harness, HarnessContext

__all__ = ["CodexHarness"]

#: The model name Codex sends. A name Codex has no metadata for keeps it on the plain
#: function-tool loop (``exec_command`` plus ``apply_patch`` through it); without one it
#: picks its default model's "code mode" with a single freeform tool.
DEFAULT_MODEL = "agentrl-policy"
_PROVIDER = "agentrl"
_KEY_VAR = "AGENTRL_SESSION_TOKEN"
#: The variable a person sets to the session token for a Codex run by hand on the host.
_HOST_KEY_VAR = "AGENTRL_TOKEN"


def _toml_str(value: str) -> str:
    # A JSON string literal is a valid TOML basic string.
    return json.dumps(value, ensure_ascii=False)


@attrs.define(kw_only=True)
class CodexHarness(Harness):
    """Runs ``codex exec --json --dangerously-bypass-approvals-and-sandbox PROMPT``.

    ``$CODEX_HOME/config.toml`` declares a custom model provider whose ``base_url`` is the
    middleware's ``/v1`` (inline, so no ``OPENAI_BASE_URL`` is needed), ``wire_api =
    "responses"``, and ``env_key`` naming the variable that holds the session token (sent as
    ``Authorization: Bearer``). stdin is ``/dev/null``: ``codex exec`` otherwise waits for it.

    Extra arguments / environment: ``AGENTRL_CODEX_EXTRA_ARGS`` (JSON list) and
    ``AGENTRL_CODEX_EXTRA_ENV`` (JSON object), or ``SLIME_AGENT_CODEX_EXTRA_ARGS`` /
    ``SLIME_AGENT_CODEX_EXTRA_ENVS``.
    """

    name: ClassVar[str] = "codex"
    protocol: ClassVar[str] = "openai_responses"
    binary: ClassVar[str] = "codex"
    npm_package: ClassVar[str] = "@openai/codex"
    extra_args_vars: ClassVar[tuple[str, ...]] = (
        "AGENTRL_CODEX_EXTRA_ARGS",
        "SLIME_AGENT_CODEX_EXTRA_ARGS",
    )
    extra_env_vars: ClassVar[tuple[str, ...]] = (
        "AGENTRL_CODEX_EXTRA_ENV",
        "SLIME_AGENT_CODEX_EXTRA_ENVS",
        "SLIME_AGENT_CODEX_EXTRA_ENV",
    )
    workspace_excludes: ClassVar[tuple[str, ...]] = (".codex",)

    #: Seconds Codex waits for the first byte of a streamed reply before retrying.
    stream_idle_timeout: float = 3600.0

    @classmethod
    def client_setup(cls, base_url: str, token: str) -> ClientSetup:
        """A ``config.toml`` provider for the middleware's ``/v1``, the token in an env var."""
        return ClientSetup(
            title=f"Codex (in $CODEX_HOME/config.toml, then run with {_HOST_KEY_VAR} set)",
            lines=(
                f"model = {_toml_str(DEFAULT_MODEL)}",
                f"model_provider = {_toml_str(_PROVIDER)}",
                f"[model_providers.{_PROVIDER}]",
                f"name = {_toml_str(_PROVIDER)}",
                f"base_url = {_toml_str(base_url + '/v1')}",
                f"env_key = {_toml_str(_HOST_KEY_VAR)}",
                'wire_api = "responses"',
                f"{_HOST_KEY_VAR}={token} {cls.binary}",
            ),
        )

    @property
    def codex_home(self) -> str:
        return f"{self.home}/.codex"

    def owned_dirs(self) -> tuple[str, ...]:
        return (self.codex_home,)

    def config_toml(self, ctx: HarnessContext) -> str:
        """The ``config.toml`` that routes every model call to the session."""
        base_url = ctx.base_url.rstrip("/") + "/v1"
        model = ctx.model or self.model or DEFAULT_MODEL
        return "\n".join(
            [
                f"model = {_toml_str(model)}",
                f"model_provider = {_toml_str(_PROVIDER)}",
                'approval_policy = "never"',
                'sandbox_mode = "danger-full-access"',
                "check_for_update_on_startup = false",
                "",
                f"[model_providers.{_PROVIDER}]",
                'name = "agentrl middleware"',
                f"base_url = {_toml_str(base_url)}",
                f"env_key = {_toml_str(_KEY_VAR)}",
                'wire_api = "responses"',
                # The middleware streams only once the whole generation is done.
                f"stream_idle_timeout_ms = {int(self.stream_idle_timeout * 1000)}",
                "request_max_retries = 2",
                "stream_max_retries = 2",
                "",
            ]
        )

    def config_files(self, ctx: HarnessContext) -> dict[str, str]:
        return {f"{self.codex_home}/config.toml": self.config_toml(ctx)}

    def command(self, ctx: HarnessContext) -> list[str]:
        return [
            "exec",
            "--json",
            "--dangerously-bypass-approvals-and-sandbox",
            "--skip-git-repo-check",
            "-C",
            ctx.workdir,
        ]

    def cli_environment(self, ctx: HarnessContext, time_budget: float) -> dict[str, str]:
        return {
            "CODEX_HOME": self.codex_home,
            _KEY_VAR: ctx.api_key,
        }
