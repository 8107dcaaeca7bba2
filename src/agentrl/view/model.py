"""The run page's numbers, computed from an output directory's rows.

Rows come from a file a hostile session may have shaped, so every field is read through
a typed getter: a missing or odd value is "unknown" (None), never an exception.
:func:`overview` is everything the run page shows: outcome counts, pass@k per task,
the reward distribution (of graded samples, as pass@k counts them), per-phase timings,
tokens per second, failures by reason, and for a Ray run its nodes and reschedules.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from agentrl.types import Outcome

__all__ = [
    "PHASES",
    "failure_reason",
    "graded_rewards",
    "node_table",
    "overview",
    "pass_at_k",
    "phase_stats",
    "reward_histogram",
    "rollout_summary",
]

#: The rollout phases in the order they run (others sort after, by name).
PHASES = ("boot", "prepare", "install", "agent", "diff", "grade", "teardown", "finish", "total")
_OUTCOMES = tuple(o.value for o in Outcome)
_FAILED = frozenset(o.value for o in Outcome if o not in (Outcome.SOLVED, Outcome.UNSOLVED))
_NUMBERS = re.compile(r"0x[0-9a-f]+|[0-9a-f]{12,}|\d+", re.IGNORECASE)
MAX_REASON = 200
MAX_KEYS_PER_REASON = 100
MAX_RESCHEDULED = 32


def text(value: Any, limit: int = 10_000) -> str | None:
    """``value`` when it is a string (cut to ``limit`` characters), else None."""
    return value[:limit] if isinstance(value, str) else None


def number(value: Any) -> float | None:
    """``value`` as a finite float, or None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def integer(value: Any) -> int | None:
    """``value`` when it is an int (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def rollout_summary(row: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a ``rollouts.jsonl`` row the run page lists, each checked for type."""
    timings = row.get("timings") if isinstance(row.get("timings"), Mapping) else {}
    grade = row.get("grade") if isinstance(row.get("grade"), Mapping) else None
    agent = number(timings.get("agent"))
    tokens = integer(row.get("sampled_tokens"))
    return {
        "key": text(row.get("key"), 500),
        "instance_id": text(row.get("instance_id"), 500),
        "sample_index": integer(row.get("sample_index")),
        "attempt": integer(row.get("attempt")),
        "harness": text(row.get("harness"), 100),
        "outcome": text(row.get("outcome"), 100),
        "reward": number(row.get("reward")),
        "remove_sample": row.get("remove_sample") is True,
        "num_samples": integer(row.get("num_samples")),
        "turns": integer(row.get("turns")),
        "sampled_tokens": tokens,
        "agent_exit_code": integer(row.get("agent_exit_code")),
        "timings": {
            str(k)[:50]: v for k, v in ((k, number(v)) for k, v in timings.items()) if v is not None
        },
        "tokens_per_second": (tokens / agent) if tokens is not None and agent else None,
        "grade": None
        if grade is None
        else {
            "reward": number(grade.get("reward")),
            "applied_cleanly": grade.get("applied_cleanly")
            if isinstance(grade.get("applied_cleanly"), bool)
            else None,
            "error": text(grade.get("error")),
            "details": grade.get("details") if isinstance(grade.get("details"), Mapping) else {},
        },
        "error": text(row.get("error")),
        "node_id": text(row.get("node_id"), 100),
        "node_ip": text(row.get("node_ip"), 100),
        "rescheduled": _rescheduled(row.get("rescheduled")),
    }


def _rescheduled(value: Any) -> list[dict[str, str | None]]:
    """A Ray row's ``rescheduled``: the nodes an earlier dispatch was lost on, and why."""
    if not isinstance(value, list):
        return []
    return [
        {"node_id": text(lost.get("node_id"), 100), "error": text(lost.get("error"), 1000)}
        for lost in value[:MAX_RESCHEDULED]
        if isinstance(lost, Mapping)
    ]


def pass_at_k(n: int, c: int, k: int) -> float | None:
    """The unbiased pass@k of ``c`` successes in ``n`` samples (None when ``k > n``)."""
    if n <= 0 or k <= 0 or k > n:
        return None
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def task_table(rollouts: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per task: samples graded, solved, pass@1 and pass@k with k the samples per task.

    Rollouts whose samples are removed (infra and grader errors) are not graded samples.
    """
    graded: dict[str, list[bool]] = defaultdict(list)
    every: Counter[str] = Counter()
    for row in rollouts:
        task = row["instance_id"] or "?"
        every[task] += 1
        if not row["remove_sample"]:
            graded[task].append(row["outcome"] == Outcome.SOLVED.value)
    k = max(every.values(), default=0)
    table = []
    for task in sorted(every):
        solved = graded.get(task, [])
        n, c = len(solved), sum(solved)
        table.append(
            {
                "instance_id": task,
                "rollouts": every[task],
                "graded": n,
                "solved": c,
                "pass@1": pass_at_k(n, c, 1),
                "pass@k": pass_at_k(n, c, min(k, n)) if n else None,
                "k": min(k, n),
            }
        )
    return table


def reward_histogram(
    rewards: Iterable[float],
    bins: int = 10,
    low: float | None = None,
    high: float | None = None,
) -> dict[str, Any]:
    """Counts of ``rewards`` in ``bins`` equal bins between their minimum and maximum
    (or between ``low`` and ``high``, so two runs' histograms share their bins)."""
    values = sorted(rewards)
    if not values:
        return {"bins": [], "count": 0, "mean": None}
    low = values[0] if low is None else min(low, values[0])
    high = values[-1] if high is None else max(high, values[-1])
    if low == high:
        edges = [(low, high, len(values))]
    else:
        width = (high - low) / bins
        counts = [0] * bins
        for v in values:
            counts[min(int((v - low) / width), bins - 1)] += 1
        edges = [(low + i * width, low + (i + 1) * width, n) for i, n in enumerate(counts)]
    return {
        "bins": [{"low": a, "high": b, "count": n} for a, b, n in edges],
        "count": len(values),
        "mean": statistics.fmean(values),
    }


def _quantile(values: Sequence[float], q: float) -> float:
    index = min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))
    return values[index]


def phase_stats(rollouts: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per phase: count, min, median, p90, max and mean seconds, phases in run order."""
    seconds: dict[str, list[float]] = defaultdict(list)
    for row in rollouts:
        for phase, value in row["timings"].items():
            seconds[phase].append(value)
    order = {name: i for i, name in enumerate(PHASES)}
    table = []
    for phase in sorted(seconds, key=lambda p: (order.get(p, len(order)), p)):
        values = sorted(seconds[phase])
        table.append(
            {
                "phase": phase,
                "count": len(values),
                "min": values[0],
                "median": statistics.median(values),
                "p90": _quantile(values, 0.9),
                "max": values[-1],
                "mean": statistics.fmean(values),
            }
        )
    return table


def failure_reason(row: Mapping[str, Any]) -> str:
    """A failure's reason with its numbers and ids blanked, so alike failures group."""
    error = row.get("error") or (row.get("grade") or {}).get("error") or ""
    first = error.strip().splitlines()[0] if error.strip() else f"{row.get('outcome')} (no error)"
    return _NUMBERS.sub("N", first)[:MAX_REASON]


def failure_groups(
    rollouts: Sequence[Mapping[str, Any]], earlier: Sequence[Mapping[str, Any]] = ()
) -> list[dict[str, Any]]:
    """Failed rollouts (and earlier failed attempts) grouped by outcome and reason."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for rows, current in ((rollouts, True), (earlier, False)):
        for row in rows:
            if row["outcome"] not in _FAILED and not row["error"]:
                continue
            outcome = row["outcome"] or "unknown"
            reason = failure_reason(row)
            group = groups.setdefault(
                (outcome, reason),
                {"outcome": outcome, "reason": reason, "count": 0, "keys": [], "earlier": 0},
            )
            group["count"] += 1
            if not current:
                group["earlier"] += 1
            if row["key"] and len(group["keys"]) < MAX_KEYS_PER_REASON:
                if row["key"] not in group["keys"]:
                    group["keys"].append(row["key"])
    return sorted(groups.values(), key=lambda g: (-g["count"], g["outcome"], g["reason"]))


def graded_rewards(rollouts: Iterable[Mapping[str, Any]]) -> list[float]:
    """The rewards of graded samples: removed ones (infra, grader errors) are no reward."""
    return [
        row["reward"] for row in rollouts if row["reward"] is not None and not row["remove_sample"]
    ]


def node_table(rollouts: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per Ray node: its rollouts, how many were solved or failed, and the dispatches lost
    on it (a rollout rescheduled from it). Empty for a run that did not use Ray."""
    nodes: dict[str, dict[str, Any]] = {}

    def entry(node_id: str) -> dict[str, Any]:
        return nodes.setdefault(
            node_id,
            {
                "node_id": node_id,
                "node_ip": None,
                "rollouts": 0,
                "solved": 0,
                "failed": 0,
                "lost": 0,
            },
        )

    for row in rollouts:
        if row["node_id"]:
            node = entry(row["node_id"])
            node["node_ip"] = node["node_ip"] or row["node_ip"]
            node["rollouts"] += 1
            node["solved"] += row["outcome"] == Outcome.SOLVED.value
            node["failed"] += row["outcome"] in _FAILED
        for lost in row["rescheduled"]:
            entry(lost["node_id"] or "unknown")["lost"] += 1
    return sorted(nodes.values(), key=lambda n: (-n["rollouts"], n["node_id"]))


def overview(
    rollouts: Sequence[Mapping[str, Any]],
    earlier: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """Everything the run page shows, from :func:`rollout_summary` rows."""
    outcomes = Counter(row["outcome"] or "unknown" for row in rollouts)
    ordered = {o: outcomes[o] for o in _OUTCOMES if outcomes[o]}
    ordered.update({o: n for o, n in sorted(outcomes.items()) if o not in ordered})
    rewards = graded_rewards(rollouts)
    tokens = sum(row["sampled_tokens"] or 0 for row in rollouts)
    agent = sum(row["timings"].get("agent", 0.0) for row in rollouts)
    rates = sorted(row["tokens_per_second"] for row in rollouts if row["tokens_per_second"])
    return {
        "rollouts": len(rollouts),
        "outcomes": ordered,
        "tasks": task_table(rollouts),
        "rewards": reward_histogram(rewards),
        "phases": phase_stats(rollouts),
        "sampled_tokens": tokens,
        "tokens_per_second": (tokens / agent) if agent else None,
        "tokens_per_second_median": statistics.median(rates) if rates else None,
        "failures": failure_groups(rollouts, earlier),
        "harnesses": sorted({row["harness"] for row in rollouts if row["harness"]}),
        "nodes": node_table(rollouts),
        "rescheduled": sum(1 for row in rollouts if row["rescheduled"]),
    }
