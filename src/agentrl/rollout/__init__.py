"""Rollouts: one task end to end (``run_rollout``), and many of them (``Runner``, ``Stack``).

``config`` (RolloutConfig, the prompt) → ``phases`` (boot, prepare, install, agent, diff,
grade, finish) → ``run`` (``run_rollout``) → ``stack`` (engine, middleware and plugins
built from options) → ``runner`` (many rollouts, resumable output files).
"""

from __future__ import annotations

from agentrl.rollout.config import (
    DEFAULT_PROMPT,
    RolloutConfig,
    default_guard_timeout,
    render_prompt,
)
from agentrl.rollout.run import RolloutResult, run_rollout

__all__ = [
    "DEFAULT_PROMPT",
    "RolloutConfig",
    "RolloutResult",
    "default_guard_timeout",
    "render_prompt",
    "run_rollout",
]
