"""Agent-side configuration for the slime integration, read from the environment in one place.

Every knob has an ``AGENTRL_*`` name and, where slime's coding-agent example has one, that
name as an alias (``SWE_AGENT``, ``ADAPTER_PUBLIC_HOST``, …), so an existing launcher keeps
working. The ``AGENTRL_*`` name wins when both are set. Nothing is read at import time:
``SlimeConfig.from_env()`` runs on the first ``generate`` call.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import Any

import attrs

__all__ = ["ENV_VARS", "SlimeConfig", "SlimeConfigError"]

logger = logging.getLogger(__name__)


class SlimeConfigError(ValueError):
    """The slime integration is misconfigured; the message says what to set."""


@attrs.frozen(kw_only=True)
class _Var:
    field: str
    name: str
    aliases: tuple[str, ...]
    kind: type
    help: str


#: Every environment variable the integration reads: (field, AGENTRL name, aliases, type, help).
ENV_VARS: tuple[_Var, ...] = (
    _Var(
        field="harness",
        name="AGENTRL_HARNESS",
        aliases=("SWE_AGENT",),
        kind=str,
        help="agent harness plugin (claude_code, codex, …)",
    ),
    _Var(
        field="sandbox",
        name="AGENTRL_SANDBOX",
        aliases=(),
        kind=str,
        help="sandbox plugin the agent and the grader run in (e2b, local, …)",
    ),
    _Var(
        field="grader",
        name="AGENTRL_TRAIN_PROTOCOL",
        aliases=("SWE_TRAIN_PROTOCOL",),
        kind=str,
        help="grader plugin for training rollouts (scaleswe, swebench, …)",
    ),
    _Var(
        field="eval_grader",
        name="AGENTRL_EVAL_PROTOCOL",
        aliases=("SWE_EVAL_PROTOCOL",),
        kind=str,
        help="grader plugin for evaluation rollouts (default: AGENTRL_TRAIN_PROTOCOL)",
    ),
    _Var(
        field="public_host",
        name="AGENTRL_PUBLIC_HOST",
        aliases=("ADAPTER_PUBLIC_HOST",),
        kind=str,
        help="host name or IP the sandboxes dial back to reach the middleware "
        "('auto': this node's own address)",
    ),
    _Var(
        field="bind_host",
        name="AGENTRL_BIND_HOST",
        aliases=("ADAPTER_BIND_HOST",),
        kind=str,
        help="address the middleware listens on",
    ),
    _Var(
        field="port",
        name="AGENTRL_PORT",
        aliases=("ADAPTER_PORT",),
        kind=int,
        help="TCP port the middleware listens on (0: any free port)",
    ),
    _Var(
        field="unix_socket",
        name="AGENTRL_UNIX_SOCKET",
        aliases=(),
        kind=str,
        help="serve the middleware on this unix socket instead of TCP (local sandboxes)",
    ),
    _Var(
        field="agent_time_budget",
        name="AGENTRL_AGENT_TIME_BUDGET",
        aliases=("SWE_AGENT_TIME_BUDGET_SEC",),
        kind=float,
        help="seconds the agent CLI may run",
    ),
    _Var(
        field="eval_timeout",
        name="AGENTRL_EVAL_TIMEOUT",
        aliases=("SWE_EVAL_TIMEOUT_SEC",),
        kind=float,
        help="seconds grading may take",
    ),
    _Var(
        field="guard_timeout",
        name="AGENTRL_ROLLOUT_GUARD",
        aliases=("SWE_ROLLOUT_GUARD_SEC",),
        kind=float,
        help="wall-clock cap on a whole rollout (default: agent budget + eval timeout + 180)",
    ),
    _Var(
        field="boot_concurrency",
        name="AGENTRL_BOOT_CONCURRENCY",
        aliases=("SWE_BOOT_CONCURRENCY",),
        kind=int,
        help="sandboxes booting at once in this process",
    ),
    _Var(
        field="boot_retries",
        name="AGENTRL_BOOT_RETRIES",
        aliases=("SWE_BOOT_RETRIES",),
        kind=int,
        help="boot retries after a failed first attempt (then the rollout is an infra failure)",
    ),
    _Var(
        field="fork_threshold_tokens",
        name="AGENTRL_FORK_THRESHOLD_TOKENS",
        aliases=("SLIME_FORK_MERGE_MAX_RESPONSE_TOKENS",),
        kind=int,
        help="a drift inside a response shorter than this is realigned, longer forks",
    ),
    _Var(
        field="tasks_dir",
        name="AGENTRL_TASKS_DIR",
        aliases=(),
        kind=str,
        help="directory relative host paths in task rows (metadata.repo, gold patches, "
        "swepro scripts) are resolved against (default: the rollout process's working "
        "directory)",
    ),
    _Var(
        field="prompt",
        name="AGENTRL_PROMPT_TEMPLATE",
        aliases=("SWE_CC_PROMPT",),
        kind=str,
        help="the agent's task prompt; {problem_statement}, {workdir}, {problem_file} and "
        "{instance_id} are filled in (default: agentrl.rollout.DEFAULT_PROMPT)",
    ),
    _Var(
        field="max_turns",
        name="AGENTRL_MAX_TURNS",
        aliases=(),
        kind=int,
        help="model calls one rollout may make before the middleware answers 429",
    ),
    _Var(
        field="cli_path",
        name="AGENTRL_CLI_PATH",
        aliases=(),
        kind=str,
        help="the agent CLI's executable as the sandbox sees it (skips installing it)",
    ),
    _Var(
        field="cli_tarballs",
        name="AGENTRL_CLI_TARBALLS",
        aliases=("SLIME_AGENT_CC_TARBALL",),
        kind=tuple,
        help="host paths of the CLI's npm tarballs, comma separated (installed in the sandbox)",
    ),
    _Var(
        field="node_tarball",
        name="AGENTRL_NODE_TARBALL",
        aliases=("SLIME_AGENT_NODE_TARBALL",),
        kind=str,
        help="host path of a Node.js linux-x64 tarball, for sandboxes without node",
    ),
    _Var(
        field="model",
        name="AGENTRL_MODEL",
        aliases=(),
        kind=str,
        help="model name the agent CLI is told to use (any name; the middleware serves it)",
    ),
    _Var(
        field="sandbox_options",
        name="AGENTRL_SANDBOX_OPTIONS",
        aliases=(),
        kind=dict,
        help="JSON object of keyword options for the sandbox backend's from_task",
    ),
    _Var(
        field="abort_poll_interval",
        name="AGENTRL_ABORT_POLL_SEC",
        aliases=(),
        kind=float,
        help="how often a rollout checks whether slime is aborting the batch",
    ),
    _Var(
        field="drain_timeout",
        name="AGENTRL_ABORT_DRAIN_SEC",
        aliases=(),
        kind=float,
        help="seconds an aborted rollout waits for its session to close before returning",
    ),
)


def _positive(instance: Any, attribute: attrs.Attribute, value: float | int | None) -> None:
    if value is not None and value <= 0:
        raise SlimeConfigError(f"{_env_name(attribute.name)} must be positive, got {value!r}")


def _non_negative(instance: Any, attribute: attrs.Attribute, value: int) -> None:
    if value < 0:
        raise SlimeConfigError(f"{_env_name(attribute.name)} must be >= 0, got {value!r}")


def _zero_is_none(value: float | None) -> float | None:
    # slime's example treats SWE_ROLLOUT_GUARD_SEC=0 as "derive it".
    return None if value is not None and value == 0 else value


def _env_name(field: str) -> str:
    return next(var.name for var in ENV_VARS if var.field == field)


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
    boot_retries: int = attrs.field(default=2, validator=_non_negative)
    fork_threshold_tokens: int = attrs.field(default=1024, validator=_non_negative)
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
        """The wall-clock cap on one rollout: explicit, else agent budget + eval + 180 s."""
        if self.guard_timeout is not None:
            return self.guard_timeout
        from agentrl.rollout import default_guard_timeout

        return default_guard_timeout(self.agent_time_budget, self.eval_timeout)

    def grader_name(self, evaluation: bool) -> str:
        """The grader plugin name for a training or an evaluation rollout."""
        return (self.eval_grader or self.grader) if evaluation else self.grader

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SlimeConfig:
        """Read every knob from ``environ`` (default ``os.environ``); aliases are accepted."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for var in ENV_VARS:
            raw, source = _lookup(env, var)
            if raw is None:
                continue
            values[var.field] = _convert(raw, source, var)
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


def _lookup(env: Mapping[str, str], var: _Var) -> tuple[str | None, str]:
    primary = env.get(var.name)
    for alias in var.aliases:
        other = env.get(alias)
        if other is None or other == "":
            continue
        if primary not in (None, "") and primary != other:
            logger.warning(
                "%s=%r and %s=%r disagree; using %s", var.name, primary, alias, other, var.name
            )
            continue
        if primary in (None, ""):
            return other, alias
    if primary in (None, ""):
        return None, var.name
    return primary, var.name


def _convert(raw: str, source: str, var: _Var) -> Any:
    raw = raw.strip()
    if var.kind is str:
        return raw
    if var.kind is tuple:
        return tuple(part.strip() for part in raw.split(",") if part.strip())
    if var.kind is dict:
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise SlimeConfigError(
                f"{source} is not valid JSON ({exc}); set it to a JSON object ({var.help})"
            ) from None
        if not isinstance(value, dict):
            raise SlimeConfigError(
                f"{source} must be a JSON object, got {type(value).__name__} ({var.help})"
            )
        return value
    try:
        value = var.kind(raw)
    except ValueError:
        kind = "an integer" if var.kind is int else "a number"
        raise SlimeConfigError(
            f"{source}={raw!r} is not {kind}; set it to {kind} ({var.help})"
        ) from None
    return value
