"""The agentrl options of verl's ``agentrl`` agent loop, as verl users set them.

verl builds an agent loop with ``hydra.utils.instantiate`` from one entry of the file
``actor_rollout_ref.rollout.agent.agent_loop_config_path`` names; every key of that entry
besides ``name`` and ``_target_`` reaches the loop's constructor. So the agent side is
configured in that YAML file (see ``agentrl/verl/agent_loop.yaml`` and docs/trainers.md),
and the model side (tokenizer, lengths, sampling) comes from verl's own config.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs

__all__ = ["PROMPT_MODES", "VerlLoopConfigError", "VerlLoopOptions", "plain"]

#: The middleware's prompt modes (``agentrl.prompts.splice``).
PROMPT_MODES = ("splice", "render")


class VerlLoopConfigError(ValueError):
    """The agent loop's configuration is wrong; the message says what to set."""


def plain(value: Any) -> Any:
    """``value`` with OmegaConf containers turned into dicts and lists (hydra passes those)."""
    if type(value).__module__.startswith("omegaconf."):  # DictConfig, ListConfig
        from omegaconf import OmegaConf

        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def _non_negative(instance: Any, attribute: attrs.Attribute, value: int) -> None:
    if value < 0:
        raise VerlLoopConfigError(f"{attribute.name}: expected an integer >= 0, got {value!r}")


def _prompt_mode(instance: Any, attribute: attrs.Attribute, value: str) -> None:
    if value not in PROMPT_MODES:
        raise VerlLoopConfigError(
            f"prompt_mode: expected one of {', '.join(PROMPT_MODES)}, got {value!r}"
        )


@attrs.frozen(kw_only=True)
class VerlLoopOptions:
    """Harness, sandbox, grader, prompt mode and concurrency of the ``agentrl`` agent loop."""

    harness: str = "claude_code"
    sandbox: str = "e2b"
    #: The grader plugin (one for every row; ``auto`` is not supported here).
    grader: str = attrs.field(default="scaleswe")
    prompt_mode: str = attrs.field(default="splice", validator=_prompt_mode)
    #: Parser plugin names (SGLang's names; ``hermes`` for Qwen-style tool calls).
    tool_parser: str | None = "hermes"
    reasoning_parser: str | None = None
    #: Rollouts one verl agent-loop worker runs at once (0: as many as verl hands it).
    max_concurrent_rollouts: int = attrs.field(default=0, validator=_non_negative)
    #: Sandboxes booting at once per worker (agent and grading boots alike).
    boot_concurrency: int = attrs.field(default=16, validator=_non_negative)
    #: Where sandboxes reach the middleware: a unix socket (``local``) or TCP at public_host
    #: (``auto``: the address of the Ray node the agent-loop worker runs on).
    unix_socket: str | None = None
    public_host: str | None = None
    bind_host: str = "0.0.0.0"
    port: int = attrs.field(default=0, validator=_non_negative)
    #: Tokenizer directory (default: verl's ``actor_rollout_ref.model.path``).
    tokenizer: str | None = None
    fork_threshold_tokens: int = attrs.field(default=1024, validator=_non_negative)
    max_engine_aborts: int = attrs.field(default=8, validator=_non_negative)
    #: Where a dataset row keeps its agentrl task: this column, else ``extra_info[task_key]``.
    task_key: str = "agentrl_task"
    tasks_dir: str | None = None
    sandbox_options: dict[str, Any] = attrs.field(factory=dict)
    harness_options: dict[str, Any] = attrs.field(factory=dict)
    #: ``RolloutConfig`` fields (``agent_time_budget``, ``eval_timeout``, ``max_turns``, …).
    rollout: dict[str, Any] = attrs.field(factory=dict)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> VerlLoopOptions:
        """The options from the YAML entry's keys; unknown keys are an error naming the valid ones."""
        values = plain(dict(values))
        known = {field.name for field in attrs.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise VerlLoopConfigError(
                f"agentrl agent loop: unknown option(s) {', '.join(unknown)} in the "
                f"agent_loop_config_path entry; valid: {', '.join(sorted(known))}"
            )
        try:
            return cls(**values)
        except TypeError as exc:
            raise VerlLoopConfigError(f"agentrl agent loop options: {exc}") from None

    def task_row(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """The agentrl task row a verl dataset row carries (a mapping or its JSON text)."""
        value = row.get(self.task_key)
        if value is None:
            value = (plain(row.get("extra_info")) or {}).get(self.task_key)
        if isinstance(value, str):
            value = json.loads(value)
        if not isinstance(value, Mapping):
            raise VerlLoopConfigError(
                f"the dataset row has no agentrl task: expected a {self.task_key!r} column or "
                f"extra_info[{self.task_key!r}] holding an agentrl task row (a dict or its "
                f"JSON), got columns {sorted(row)}"
            )
        return plain(dict(value))
