"""Two runs side by side (``agentrl view RUN_A RUN_B``): outcome counts, pass@k per task,
and the reward and token distributions of both, binned alike so the bars compare."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.view.model import graded_rewards, reward_histogram

__all__ = ["compare_runs"]


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def _tokens(run: Mapping[str, Any]) -> list[float]:
    return [float(r["sampled_tokens"]) for r in run["rollouts"] if r["sampled_tokens"] is not None]


def _shared_histograms(values: Sequence[list[float]]) -> list[dict[str, Any]]:
    every = [v for run in values for v in run]
    low, high = (min(every), max(every)) if every else (None, None)
    return [reward_histogram(run, low=low, high=high) for run in values]


def compare_runs(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The comparison page's data from each run's ``run_data()``."""
    rewards = _shared_histograms([graded_rewards(run["rollouts"]) for run in runs])
    tokens = _shared_histograms([_tokens(run) for run in runs])
    by_task = [{t["instance_id"]: t for t in run["overview"]["tasks"]} for run in runs]
    names = sorted({name for tasks in by_task for name in tasks})
    return {
        "runs": [
            {
                "title": run["title"],
                "kind": run["kind"],
                "rollouts": len(run["rollouts"]),
                "outcomes": run["overview"]["outcomes"],
                "pass@1": _mean([t["pass@1"] for t in run["overview"]["tasks"]]),
                "pass@k": _mean([t["pass@k"] for t in run["overview"]["tasks"]]),
                "rewards": rewards[i],
                "tokens": tokens[i],
                "sampled_tokens": run["overview"]["sampled_tokens"],
                "tokens_per_second": run["overview"]["tokens_per_second"],
            }
            for i, run in enumerate(runs)
        ],
        "outcomes": list(dict.fromkeys(o for run in runs for o in run["overview"]["outcomes"])),
        "tasks": [
            {"instance_id": name, "runs": [tasks.get(name) for tasks in by_task]} for name in names
        ],
    }
