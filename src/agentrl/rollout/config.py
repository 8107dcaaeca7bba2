"""How a rollout is configured: its prompt, budgets and timeouts (``RolloutConfig``)."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

import attrs

from agentrl import settings
from agentrl.types import Task

__all__ = ["DEFAULT_PROMPT", "RolloutConfig", "default_guard_timeout", "render_prompt"]

logger = logging.getLogger(__name__)

DEFAULT_PROMPT = """\
Resolve the issue below in the repository at {workdir} (it is also saved as \
{workdir}/{problem_file}). Change the source code so that the issue is fixed; do not \
modify the existing tests and do not commit.

<issue>
{problem_statement}
</issue>
"""

#: The placeholders ``render_prompt`` fills in.
_PLACEHOLDER = re.compile(r"\{(problem_statement|workdir|problem_file|instance_id)\}")

#: Untracked files an agent's own tool runs leave behind; never part of its diff.
DEFAULT_DIFF_IGNORE = (
    "__pycache__/",
    "*.py[cod]",
    ".pytest_cache/",
    ".mypy_cache/",
    ".ruff_cache/",
    ".hypothesis/",
    ".tox/",
    ".nox/",
    ".coverage",
    "*.egg-info/",
    "node_modules/",
)


#: Seconds the outer guard allows beyond the agent's budget and grading (boot, install, …).
GUARD_MARGIN = 180.0
#: Seconds the outer grading guard allows beyond ``eval_timeout`` (boot, prepare).
GRADE_SETUP_MARGIN = 120.0


def grading_guard(eval_timeout: float) -> float:
    """The outer bound on grading: the grade, and the empty-diff control that decides whose
    failure a broken grade is (``Grader.grade``), each ``eval_timeout`` plus the margin."""
    return 2 * (eval_timeout + GRADE_SETUP_MARGIN)


def default_guard_timeout(agent_time_budget: float, eval_timeout: float) -> float:
    """The rollout guard when none is set: the agent's budget, grading twice (the grade and
    the control that may follow it, see ``Grader.grade``), and ``GUARD_MARGIN``."""
    return agent_time_budget + 2 * eval_timeout + GUARD_MARGIN


#: ``RolloutConfig`` field -> the setting ``from_env`` reads it from.
_ENV_SETTINGS = {
    "agent_time_budget": "AGENTRL_AGENT_TIME_BUDGET",
    "eval_timeout": "AGENTRL_EVAL_TIMEOUT",
    "guard_timeout": "AGENTRL_ROLLOUT_GUARD",
    "boot_retries": "AGENTRL_BOOT_RETRIES",
    "max_context_tokens": "AGENTRL_MAX_CONTEXT_TOKENS",
    "max_turns": "AGENTRL_MAX_TURNS",
    "prompt_template": "AGENTRL_PROMPT_TEMPLATE",
}


def _guard_default(self: RolloutConfig) -> float:
    return default_guard_timeout(self.agent_time_budget, self.eval_timeout)


@attrs.frozen(kw_only=True)
class RolloutConfig:
    """Budgets, limits and addresses for one rollout (``from_env`` reads the defaults).

    ``middleware_host`` / ``middleware_port`` are the middleware's address as the sandbox
    backend needs it for ``Sandbox.url_for`` (default: taken from ``middleware.url``).
    ``max_sample_tokens`` 0 means the context budget. ``guard_timeout`` defaults to
    ``agent_time_budget + 2 * eval_timeout + 180``.
    """

    agent_time_budget: float = 1800.0
    eval_timeout: float = 600.0
    guard_timeout: float = attrs.field(default=attrs.Factory(_guard_default, takes_self=True))
    boot_retries: int = 2
    boot_backoff: float = 2.0
    boot_timeout: float = 300.0
    prepare_timeout: float = 600.0
    max_context_tokens: int = 0
    max_sample_tokens: int = 0
    max_turns: int | None = None
    middleware_host: str | None = None
    middleware_port: int | None = None
    agent_user: str = "agent"
    model: str | None = None
    prompt_template: str = DEFAULT_PROMPT
    problem_file: str = "PROBLEM_STATEMENT.md"
    diff_ignore: tuple[str, ...] = attrs.field(default=DEFAULT_DIFF_IGNORE, converter=tuple)
    grade_empty_diff: bool = False

    def __attrs_post_init__(self) -> None:
        for name in ("agent_time_budget", "eval_timeout", "guard_timeout", "boot_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"RolloutConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.boot_retries < 0:
            raise ValueError(f"RolloutConfig.boot_retries must be >= 0, got {self.boot_retries}")
        if self.guard_timeout < self.agent_time_budget:
            raise ValueError(
                f"RolloutConfig.guard_timeout ({self.guard_timeout}s) is shorter than "
                f"agent_time_budget ({self.agent_time_budget}s); the guard would always fire "
                "first. Leave guard_timeout unset for agent + 2 × eval + 180 s"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> RolloutConfig:
        """Defaults from ``AGENTRL_*`` variables (or slime's ``SWE_*``), then ``overrides``.

        ``AGENTRL_AGENT_TIME_BUDGET`` / ``SWE_AGENT_TIME_BUDGET_SEC``,
        ``AGENTRL_EVAL_TIMEOUT`` / ``SWE_EVAL_TIMEOUT_SEC``, ``AGENTRL_ROLLOUT_GUARD`` /
        ``SWE_ROLLOUT_GUARD_SEC``, ``AGENTRL_BOOT_RETRIES`` / ``SWE_BOOT_RETRIES``,
        ``AGENTRL_MAX_CONTEXT_TOKENS``, ``AGENTRL_MAX_TURNS``, ``AGENTRL_PROMPT_TEMPLATE``
        (or ``SWE_CC_PROMPT``); parsed by ``agentrl.settings`` (docs/settings.md).
        """
        values: dict[str, Any] = {}
        for field, name in _ENV_SETTINGS.items():
            value = settings.get(name, environ, default=None)
            if value is not None:
                values[field] = value
        values.update(overrides)
        return cls(**values)


def render_prompt(template: str, task: Task, problem_file: str) -> str:
    """The agent's prompt: ``template`` with its placeholders filled in.

    Only ``{problem_statement}``, ``{workdir}``, ``{problem_file}`` and ``{instance_id}``
    are replaced; any other braces stay as written, so a template may contain code.
    """
    values = {
        "problem_statement": task.problem_statement,
        "workdir": task.workdir,
        "problem_file": problem_file,
        "instance_id": task.instance_id,
    }
    # One pass, so a placeholder-like text inside the issue itself is left as written.
    return _PLACEHOLDER.sub(lambda match: values[match.group(1)], template)
