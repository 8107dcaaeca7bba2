"""Agent-side configuration for the slime integration, read from the environment in one place.

Every knob has an ``AGENTRL_*`` name and, where slime's coding-agent example has one, that
name as an alias (``SWE_AGENT``, ``ADAPTER_PUBLIC_HOST``, …), so an existing launcher keeps
working. The ``AGENTRL_*`` name wins when both are set. The names, types and parsing live in
``agentrl.settings`` (docs/settings.md). Nothing is read at import time:
``SlimeConfig.from_env()`` runs on the first ``generate`` call.
"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Mapping
from typing import Any

import attrs

from agentrl import settings

__all__ = ["ENV_VARS", "HARNESS_TARBALL_SETTINGS", "SlimeConfig", "SlimeConfigError"]

logger = logging.getLogger(__name__)

#: The middleware's prompt modes (``agentrl.prompts.splice.PROMPT_MODES``).
PROMPT_MODES = ("splice", "render")


class SlimeConfigError(ValueError):
    """The slime integration is misconfigured; the message says what to set."""


#: ``SlimeConfig`` field -> its setting in ``agentrl.settings`` (name, aliases, type, help).
_FIELD_SETTINGS: dict[str, str] = {
    "harness": "AGENTRL_HARNESS",
    "sandbox": "AGENTRL_SANDBOX",
    "grader": "AGENTRL_TRAIN_GRADER",
    "eval_grader": "AGENTRL_EVAL_GRADER",
    "public_host": "AGENTRL_PUBLIC_HOST",
    "bind_host": "AGENTRL_BIND_HOST",
    "port": "AGENTRL_PORT",
    "unix_socket": "AGENTRL_UNIX_SOCKET",
    "agent_time_budget": "AGENTRL_AGENT_TIME_BUDGET",
    "eval_timeout": "AGENTRL_EVAL_TIMEOUT",
    "guard_timeout": "AGENTRL_ROLLOUT_GUARD",
    "boot_concurrency": "AGENTRL_BOOT_CONCURRENCY",
    "middleware_workers": "AGENTRL_MIDDLEWARE_WORKERS",
    "boot_retries": "AGENTRL_BOOT_RETRIES",
    "fork_threshold_tokens": "AGENTRL_FORK_THRESHOLD_TOKENS",
    "prompt_mode": "AGENTRL_PROMPT_MODE",
    "max_engine_aborts": "AGENTRL_MAX_ENGINE_ABORTS",
    "tasks_dir": "AGENTRL_TASKS_DIR",
    "prompt": "AGENTRL_PROMPT_TEMPLATE",
    "max_turns": "AGENTRL_MAX_TURNS",
    "cli_path": "AGENTRL_CLI_PATH",
    "cli_tarballs": "AGENTRL_CLI_TARBALLS",
    "node_tarball": "AGENTRL_NODE_TARBALL",
    "model": "AGENTRL_MODEL",
    "sandbox_options": "AGENTRL_SANDBOX_OPTIONS",
    "abort_poll_interval": "AGENTRL_ABORT_POLL_SEC",
    "drain_timeout": "AGENTRL_ABORT_DRAIN_SEC",
}

#: harness -> the setting holding that harness's own CLI tarballs, read while
#: ``AGENTRL_CLI_TARBALLS`` is unset. slime's launcher exports ``SLIME_AGENT_CC_TARBALL``
#: whatever ``SWE_AGENT`` says, so each harness takes only its own variable.
HARNESS_TARBALL_SETTINGS: dict[str, str] = {
    "claude_code": "AGENTRL_CLAUDE_CODE_TARBALLS",
    "codex": "AGENTRL_CODEX_TARBALLS",
}

#: Every environment variable the integration reads (``.name``, ``.aliases``, ``.help``).
ENV_VARS: tuple[settings.Setting, ...] = tuple(
    settings.setting(name)
    for name in (*_FIELD_SETTINGS.values(), *HARNESS_TARBALL_SETTINGS.values())
)


def _positive(instance: Any, attribute: attrs.Attribute, value: float | int | None) -> None:
    if value is not None and value <= 0:
        raise SlimeConfigError(f"{_env_name(attribute.name)} must be positive, got {value!r}")


def _non_negative(instance: Any, attribute: attrs.Attribute, value: int) -> None:
    if value < 0:
        raise SlimeConfigError(f"{_env_name(attribute.name)} must be >= 0, got {value!r}")


def _prompt_mode(instance: Any, attribute: attrs.Attribute, value: str) -> None:
    if value not in PROMPT_MODES:
        raise SlimeConfigError(
            f"{_env_name(attribute.name)} must be one of {', '.join(PROMPT_MODES)}, got {value!r}"
        )


def _zero_is_none(value: float | None) -> float | None:
    # slime's example treats SWE_ROLLOUT_GUARD_SEC=0 as "derive it".
    return None if value is not None and value == 0 else value


def _env_name(field: str) -> str:
    return _FIELD_SETTINGS[field]


def _read(name: str, environ: Mapping[str, str] | None) -> settings.Value:
    try:
        return settings.get(name, environ, default=None)
    except settings.SettingsError as exc:
        raise SlimeConfigError(str(exc)) from None


@attrs.frozen(kw_only=True)
class SlimeConfig:
    """What the slime integration needs beyond slime's own ``args``."""

    harness: str = "claude_code"
    sandbox: str = "e2b"
    grader: str = "scaleswe"
    eval_grader: str | None = None
    public_host: str | None = None
    bind_host: str = "0.0.0.0"
    port: int = attrs.field(default=18001, validator=_non_negative)
    unix_socket: str | None = None
    agent_time_budget: float = attrs.field(default=1800.0, validator=_positive)
    eval_timeout: float = attrs.field(default=600.0, validator=_positive)
    guard_timeout: float | None = attrs.field(
        default=None, converter=_zero_is_none, validator=_positive
    )
    boot_concurrency: int = attrs.field(default=16, validator=_positive)
    middleware_workers: int = attrs.field(default=1, validator=_positive)
    boot_retries: int = attrs.field(default=2, validator=_non_negative)
    fork_threshold_tokens: int = attrs.field(default=1024, validator=_non_negative)
    prompt_mode: str = attrs.field(default="splice", validator=_prompt_mode)
    max_engine_aborts: int = attrs.field(default=8, validator=_non_negative)
    tasks_dir: str | None = None
    prompt: str | None = None
    max_turns: int | None = attrs.field(default=None, validator=_positive)
    cli_path: str | None = None
    cli_tarballs: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    node_tarball: str | None = None
    model: str | None = None
    sandbox_options: dict[str, Any] = attrs.field(factory=dict)
    abort_poll_interval: float = attrs.field(default=0.5, validator=_positive)
    drain_timeout: float = attrs.field(default=30.0, validator=_positive)

    @property
    def rollout_guard(self) -> float:
        """The wall-clock cap on one rollout: explicit, else agent budget + 2 × eval + 180 s."""
        if self.guard_timeout is not None:
            return self.guard_timeout
        from agentrl.rollout import default_guard_timeout

        return default_guard_timeout(self.agent_time_budget, self.eval_timeout)

    def grader_name(self, evaluation: bool) -> str:
        """The grader plugin name for a training or an evaluation rollout."""
        return (self.eval_grader or self.grader) if evaluation else self.grader

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SlimeConfig:
        """Read every knob from ``environ`` (default ``os.environ``); aliases are accepted.

        The CLI tarballs are ``AGENTRL_CLI_TARBALLS``, else the chosen harness's own
        variable (``HARNESS_TARBALL_SETTINGS``): Codex never gets Claude Code's tarball.
        """
        values: dict[str, Any] = {}
        for field, name in _FIELD_SETTINGS.items():
            value = _read(name, environ)
            if value is not None:
                # The one path field is kept as text, as slime's launcher passes it.
                values[field] = str(value) if isinstance(value, pathlib.Path) else value
        own = HARNESS_TARBALL_SETTINGS.get(values.get("harness", "claude_code"))
        if not values.get("cli_tarballs") and own is not None:
            values["cli_tarballs"] = _read(own, environ) or ()
        return cls(**values)

    def validate(self) -> None:
        """Check the combination of settings; raise ``SlimeConfigError`` saying what to set."""
        from agentrl.plugins import get_sandbox

        if self.unix_socket:
            return
        if getattr(get_sandbox(self.sandbox), "reaches_middleware_over_unix_socket", False):
            raise SlimeConfigError(
                f"the {self.sandbox!r} sandbox has no network: the agent reaches the middleware "
                "through a unix socket bound into the sandbox. Set AGENTRL_UNIX_SOCKET to a "
                "socket path on this node (short, e.g. /tmp/agentrl-mw.sock)"
            )
        self.require_public_host()

    def require_public_host(self) -> str:
        """The public host, or an error saying how to set it."""
        if not self.public_host:
            raise SlimeConfigError(
                f"sandbox {self.sandbox!r} reaches the middleware over the network, but no "
                "public host is set. Set AGENTRL_PUBLIC_HOST (or ADAPTER_PUBLIC_HOST) to an "
                "address of this node that the sandboxes can route to (not 127.0.0.1), and "
                "forward it to the Ray job in --runtime-env-json"
            )
        return self.public_host

    def harness_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for the harness class (only the ones that are set)."""
        options: dict[str, Any] = {}
        if self.cli_path:
            options["cli_path"] = self.cli_path
        if self.cli_tarballs:
            options["tarballs"] = self.cli_tarballs
        if self.node_tarball:
            options["node_tarball"] = self.node_tarball
        return options

    def rollout_kwargs(self) -> dict[str, Any]:
        """The ``RolloutConfig`` fields set from here (budgets, prompt, turn cap, model)."""
        options: dict[str, Any] = {
            "agent_time_budget": self.agent_time_budget,
            "eval_timeout": self.eval_timeout,
            "guard_timeout": self.rollout_guard,
            "boot_retries": self.boot_retries,
            "max_turns": self.max_turns,
            "model": self.model,
        }
        if self.prompt:
            options["prompt_template"] = self.prompt
        return options

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)
