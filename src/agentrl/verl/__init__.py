"""verl integration: an agent loop that runs agentrl rollouts inside verl's trainer.

Point verl at it with::

    actor_rollout_ref.rollout.agent.agent_loop_config_path=<agentrl.verl.AGENT_LOOP_CONFIG>
    actor_rollout_ref.rollout.agent.default_agent_loop=agentrl

The YAML file names ``agentrl.verl.loop.AgentrlAgentLoop`` and carries the agent options
(``agentrl.verl.options.VerlLoopOptions``); docs/trainers.md has a full training config.
Importing this package imports neither verl nor torch: only verl's agent-loop worker
imports ``agentrl.verl.loop`` (install ``agentrl[verl]``; supported: verl 0.9.1).
"""

from __future__ import annotations

import pathlib

from agentrl.verl.engine import VerlEngine, verl_sampling_params
from agentrl.verl.options import VerlLoopConfigError, VerlLoopOptions
from agentrl.verl.outputs import EXTRA_KEYS, excluded_output, rollout_output

__all__ = [
    "AGENT_LOOP_CONFIG",
    "EXTRA_KEYS",
    "SUPPORTED_VERL",
    "VerlEngine",
    "VerlLoopConfigError",
    "VerlLoopOptions",
    "excluded_output",
    "rollout_output",
    "verl_sampling_params",
]

#: The agent-loop config file to pass as ``agent_loop_config_path`` (copy it to change options).
AGENT_LOOP_CONFIG = pathlib.Path(__file__).with_name("agent_loop.yaml")

#: The verl versions this integration is tested against (pyproject's ``verl`` extra pins it).
SUPPORTED_VERL = ("0.9.1",)
