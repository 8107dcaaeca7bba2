"""opencode (``opencode-ai``), speaking OpenAI Chat Completions through its openai-compatible provider."""

from __future__ import annotations

import json
from typing import Any, ClassVar

import attrs

from agentrl.harnesses.base import ClientSetup, Harness, HarnessContext

__all__ = ["OpencodeHarness"]

#: The model name opencode sends (as ``agentrl/<model>`` on its side).
DEFAULT_MODEL = "agentrl-policy"
_PROVIDER = "agentrl"
_KEY_VAR = "AGENTRL_SESSION_TOKEN"
#: The variable a person sets to the session token for an opencode run by hand on the host.
_HOST_KEY_VAR = "AGENTRL_TOKEN"
#: Switches that keep opencode off the network: no update check, no models.dev fetch, no
#: LSP server or default plugin downloads, no config or skills from the task's repository
#: or from ``~/.claude``.
_OFFLINE_ENV = {
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    "OPENCODE_DISABLE_PROJECT_CONFIG": "1",
    "OPENCODE_DISABLE_CLAUDE_CODE": "1",
    "OPENCODE_DISABLE_SHARE": "1",
}


def _positive(instance: Any, attribute: attrs.Attribute, value: int | None) -> None:
    if value is not None and value < 1:
        raise ValueError(f"{attribute.name}: expected a positive integer or None, got {value!r}")


@attrs.define(kw_only=True)
class OpencodeHarness(Harness):
    """Runs ``opencode run --format json --auto --title agentrl`` with the prompt on stdin.

    ``$XDG_CONFIG_HOME/opencode/opencode.json`` (under the harness HOME) declares a provider
    ``agentrl`` (``@ai-sdk/openai-compatible``, bundled in the binary) whose ``baseURL`` is the
    middleware's ``/v1`` and whose ``apiKey`` is read from ``$AGENTRL_SESSION_TOKEN`` (sent
    as ``Authorization: Bearer``); every permission is allowed. The prompt goes on stdin
    because ``opencode run "PROMPT"`` wraps a message argument holding spaces in double
    quotes; ``--title`` skips the session-title side request. A project ``opencode.json``
    in the task's repository is ignored (``OPENCODE_DISABLE_PROJECT_CONFIG``).

    Options: ``tools`` (tool name -> enabled, e.g. ``{"webfetch": false}``), ``max_steps``
    (the build agent's step limit; opencode then ends the last step's prompt with an
    assistant-role "MAXIMUM STEPS REACHED" message), ``instructions`` (text added to the
    system prompt), ``context_limit`` / ``output_limit`` (the model's token limits: a
    context limit turns on opencode's auto-compaction; the output limit is ``max_tokens``,
    32000 by default). Extra arguments / environment: ``AGENTRL_OPENCODE_EXTRA_ARGS`` (JSON
    list) and ``AGENTRL_OPENCODE_EXTRA_ENV`` (JSON object).
    """

    name: ClassVar[str] = "opencode"
    protocol: ClassVar[str] = "openai_chat"
    binary: ClassVar[str] = "opencode"
    npm_package: ClassVar[str] = "opencode-ai"
    extra_args_vars: ClassVar[tuple[str, ...]] = ("AGENTRL_OPENCODE_EXTRA_ARGS",)
    extra_env_vars: ClassVar[tuple[str, ...]] = ("AGENTRL_OPENCODE_EXTRA_ENV",)
    workspace_excludes: ClassVar[tuple[str, ...]] = (".opencode",)
    prompt_on_stdin: ClassVar[bool] = True

    tools: dict[str, bool] = attrs.field(factory=dict)
    max_steps: int | None = attrs.field(default=None, validator=_positive)
    instructions: str | None = None
    context_limit: int | None = attrs.field(default=None, validator=_positive)
    output_limit: int | None = attrs.field(default=None, validator=_positive)
    #: Seconds opencode waits for a reply (the middleware streams once the turn is done).
    request_timeout: float = 3600.0

    @classmethod
    def client_setup(cls, base_url: str, token: str) -> ClientSetup:
        """An ``opencode.json`` provider for the middleware's ``/v1``, the token in an env var."""
        config = {
            "provider": {
                _PROVIDER: {
                    "npm": "@ai-sdk/openai-compatible",
                    "options": {"baseURL": base_url + "/v1", "apiKey": f"{{env:{_HOST_KEY_VAR}}}"},
                    "models": {DEFAULT_MODEL: {}},
                }
            },
            "model": f"{_PROVIDER}/{DEFAULT_MODEL}",
        }
        return ClientSetup(
            title=f"opencode (in ~/.config/opencode/opencode.json, then run with {_HOST_KEY_VAR} set)",
            lines=(json.dumps(config), f"{_HOST_KEY_VAR}={token} {cls.binary}"),
        )

    @property
    def config_home(self) -> str:
        return f"{self.home}/.config"

    @property
    def instructions_path(self) -> str:
        return f"{self.state_dir}/instructions.md"

    def owned_dirs(self) -> tuple[str, ...]:
        return (f"{self.home}/.local", f"{self.home}/.cache")

    def config(self, ctx: HarnessContext) -> dict[str, Any]:
        """The ``opencode.json`` that routes every model call to the session."""
        model = ctx.model or self.model or DEFAULT_MODEL
        model_entry: dict[str, Any] = {"name": model}
        if self.context_limit or self.output_limit:
            model_entry["limit"] = {
                "context": self.context_limit or 0,
                "output": self.output_limit or 32000,
            }
        config: dict[str, Any] = {
            "$schema": "https://opencode.ai/config.json",
            "provider": {
                _PROVIDER: {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "agentrl middleware",
                    "options": {
                        "baseURL": ctx.base_url.rstrip("/") + "/v1",
                        "apiKey": f"{{env:{_KEY_VAR}}}",
                        "timeout": int(self.request_timeout * 1000),
                    },
                    "models": {model: model_entry},
                }
            },
            "model": f"{_PROVIDER}/{model}",
            "small_model": f"{_PROVIDER}/{model}",
            "autoupdate": False,
            "share": "disabled",
            # No git snapshots of the workspace for undo (nothing to undo headless).
            "snapshot": False,
            "permission": "allow",
        }
        if self.tools:
            config["tools"] = dict(self.tools)
        if self.max_steps is not None:
            config["agent"] = {"build": {"steps": self.max_steps}}
        if self.instructions:
            config["instructions"] = [self.instructions_path]
        return config

    def config_files(self, ctx: HarnessContext) -> dict[str, str]:
        files = {
            f"{self.config_home}/opencode/opencode.json": json.dumps(self.config(ctx), indent=2)
            + "\n"
        }
        if self.instructions:
            files[self.instructions_path] = self.instructions
        return files

    def command(self, ctx: HarnessContext) -> list[str]:
        return ["run", "--format", "json", "--auto", "--title", "agentrl"]

    def cli_environment(self, ctx: HarnessContext, time_budget: float) -> dict[str, str]:
        return {
            "XDG_CONFIG_HOME": self.config_home,
            "XDG_DATA_HOME": f"{self.home}/.local/share",
            "XDG_STATE_HOME": f"{self.home}/.local/state",
            "XDG_CACHE_HOME": f"{self.home}/.cache",
            _KEY_VAR: ctx.api_key,
            **_OFFLINE_ENV,
        }
