"""mini-swe-agent (PyPI ``mini-swe-agent``), speaking OpenAI Chat Completions through litellm."""

from __future__ import annotations

import json
from typing import Any, ClassVar

import attrs

from agentrl.harnesses.base import ClientSetup, Harness, HarnessContext

__all__ = ["MiniSweAgentHarness"]

#: The model name mini-swe-agent sends (litellm's ``openai/`` provider strips the prefix).
DEFAULT_MODEL = "agentrl-policy"
#: The variable a person sets to the session token for a run by hand on the host.
_KEY_VAR = "OPENAI_API_KEY"


@attrs.define(kw_only=True)
class MiniSweAgentHarness(Harness):
    """Runs ``mini -y --exit-immediately -c mini.yaml -c agentrl.yaml -o TRAJ -t PROMPT``.

    mini-swe-agent's one tool is ``bash``: each command runs in a fresh ``bash`` subprocess
    in the workdir, and the agent ends by running ``echo
    COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` (it exits 0, also when it hits ``step_limit``).
    The config layered over ``base_config`` (a built-in such as ``mini.yaml``, or a path in
    the sandbox) points litellm's ``openai/`` provider at the middleware's ``/v1`` (the
    token in ``OPENAI_API_KEY``), turns off cost tracking (the policy has no price) and
    confirmations (``yolo``, no exit prompt), and saves the trajectory under ``state_dir``.
    litellm's model-cost map is read from the package, not fetched.

    Options: ``model`` (the name sent), ``step_limit`` (model calls; 0 = none),
    ``system_template`` / ``instance_template`` (Jinja templates replacing the base
    config's, ``{{task}}`` being the prompt), ``command_timeout`` (seconds one bash command
    may run), ``request_timeout`` (seconds one model call may take) and ``model_attempts``
    (tries per model call). Extra arguments / environment: ``AGENTRL_MINI_SWE_AGENT_EXTRA_ARGS``
    (JSON list) and ``AGENTRL_MINI_SWE_AGENT_EXTRA_ENV`` (JSON object).
    """

    name: ClassVar[str] = "mini_swe_agent"
    protocol: ClassVar[str] = "openai_chat"
    binary: ClassVar[str] = "mini"
    install_kind: ClassVar[str] = "python"
    python_package: ClassVar[str] = "mini-swe-agent"
    python_module: ClassVar[str] = "minisweagent"
    prompt_option: ClassVar[str | None] = "-t"
    extra_args_vars: ClassVar[tuple[str, ...]] = ("AGENTRL_MINI_SWE_AGENT_EXTRA_ARGS",)
    extra_env_vars: ClassVar[tuple[str, ...]] = ("AGENTRL_MINI_SWE_AGENT_EXTRA_ENV",)

    base_config: str = "mini.yaml"
    step_limit: int = attrs.field(default=250, validator=attrs.validators.ge(0))
    system_template: str | None = None
    instance_template: str | None = None
    command_timeout: int = attrs.field(default=300, validator=attrs.validators.gt(0))
    request_timeout: float = attrs.field(default=3600.0, validator=attrs.validators.gt(0))
    model_attempts: int = attrs.field(default=3, validator=attrs.validators.ge(1))

    @classmethod
    def client_setup(cls, base_url: str, token: str) -> ClientSetup:
        """``mini`` with litellm's OpenAI provider at the session's ``/v1``, cost tracking off."""
        return ClientSetup(
            title="mini-swe-agent",
            lines=(
                f"{_KEY_VAR}={token} MSWEA_CONFIGURED=true MSWEA_COST_TRACKING=ignore_errors \\",
                "LITELLM_LOCAL_MODEL_COST_MAP=True \\",
                f"{cls.binary} -m openai/{DEFAULT_MODEL} -c mini.yaml "
                f"-c model.model_kwargs.api_base={base_url}/v1",
            ),
        )

    @property
    def mini_dir(self) -> str:
        return f"{self.state_dir}/mini"

    @property
    def config_path(self) -> str:
        return f"{self.mini_dir}/agentrl.yaml"

    @property
    def trajectory_path(self) -> str:
        """Where mini-swe-agent saves its trajectory (messages, exit status) after every step."""
        return f"{self.mini_dir}/trajectory.json"

    def owned_dirs(self) -> tuple[str, ...]:
        return (self.mini_dir,)

    def config(self, ctx: HarnessContext) -> dict[str, Any]:
        """The configuration layered over ``base_config`` (mini-swe-agent merges them)."""
        agent: dict[str, Any] = {
            "mode": "yolo",
            "confirm_exit": False,
            "step_limit": self.step_limit,
            "cost_limit": 0,
        }
        for key in ("system_template", "instance_template"):
            if getattr(self, key) is not None:
                agent[key] = getattr(self, key)
        return {
            "agent": agent,
            "model": {
                "model_class": "litellm",
                "model_name": f"openai/{ctx.model or self.model or DEFAULT_MODEL}",
                "cost_tracking": "ignore_errors",
                "model_kwargs": {
                    "api_base": ctx.base_url.rstrip("/") + "/v1",
                    "timeout": self.request_timeout,
                    # mini-swe-agent retries a failed call itself (model_attempts).
                    "max_retries": 0,
                },
            },
            "environment": {
                "environment_class": "local",
                "cwd": ctx.workdir,
                "timeout": self.command_timeout,
            },
        }

    def config_files(self, ctx: HarnessContext) -> dict[str, str]:
        # JSON is YAML: no YAML writer needed.
        return {self.config_path: json.dumps(self.config(ctx), indent=2) + "\n"}

    def command(self, ctx: HarnessContext) -> list[str]:
        # -o: the command line's default output path wins over a config's.
        return [
            "-y",
            "--exit-immediately",
            "-c",
            self.base_config,
            "-c",
            self.config_path,
            "-o",
            self.trajectory_path,
        ]

    def cli_environment(self, ctx: HarnessContext, time_budget: float) -> dict[str, str]:
        return {
            _KEY_VAR: ctx.api_key,
            # No first-run setup prompt, no banner, no cost-map download, no pricing.
            "MSWEA_CONFIGURED": "true",
            "MSWEA_SILENT_STARTUP": "1",
            "MSWEA_COST_TRACKING": "ignore_errors",
            "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": str(self.model_attempts),
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        }
