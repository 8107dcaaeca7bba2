"""Preflight: scripted agent sessions through the real middleware, measured before training.

``agentrl preflight`` and ``benchmarks/yield.py`` run them. :mod:`.scenarios` holds the
library of sessions a Qwen3-style policy plays, :mod:`.clients` the requests Claude Code
and Codex send, :mod:`.engine` the in-process engine that answers with the scripted
token ids, :mod:`.run` drives a scenario over HTTP in a prompt mode, and :mod:`.report`
measures what the training samples kept: per turn the drift class, tokens trained vs
sampled, tool-call parsing and whether thinking survived into the next prompt; per
session the yield and the sample tokens against the final context.
"""

from __future__ import annotations

from agentrl.preflight.report import SessionReport, TurnReport
from agentrl.preflight.run import (
    PROMPT_MODES,
    PreflightError,
    run_preflight,
    run_scenario,
)
from agentrl.preflight.scenarios import SCENARIOS, Scenario, scenario_named

__all__ = [
    "PROMPT_MODES",
    "SCENARIOS",
    "PreflightError",
    "Scenario",
    "SessionReport",
    "TurnReport",
    "run_preflight",
    "run_scenario",
    "scenario_named",
]
