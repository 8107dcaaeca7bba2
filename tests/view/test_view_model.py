"""The run page's numbers (agentrl.view.model) from rows, odd rows included."""

from __future__ import annotations

import math

import pytest

from agentrl.view.model import (
    failure_reason,
    overview,
    pass_at_k,
    phase_stats,
    reward_histogram,
    rollout_summary,
)


def _row(key, task, outcome, reward=0.0, **extra):
    return rollout_summary(
        {
            "key": key,
            "instance_id": task,
            "outcome": outcome,
            "reward": reward,
            "remove_sample": outcome in ("infra_error", "grader_error"),
            **extra,
        }
    )


def test_pass_at_k_is_the_unbiased_estimator():
    """pass@k = 1 - C(n-c, k) / C(n, k); all-or-nothing edges; None when k exceeds n."""
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(5, 2))
    assert pass_at_k(2, 1, 3) is None and pass_at_k(0, 0, 1) is None


def test_tasks_table_counts_graded_samples_and_k_is_samples_per_task():
    """Infra errors are not graded samples; k is the most samples any task has."""
    rows = [
        _row("a#0", "a", "solved", 1.0),
        _row("a#1", "a", "unsolved"),
        _row("a#2", "a", "infra_error"),
        _row("b#0", "b", "unsolved"),
    ]
    tasks = {t["instance_id"]: t for t in overview(rows)["tasks"]}
    assert tasks["a"]["rollouts"] == 3 and tasks["a"]["graded"] == 2 and tasks["a"]["solved"] == 1
    assert tasks["a"]["pass@1"] == pytest.approx(0.5) and tasks["a"]["pass@k"] == 1.0
    assert tasks["a"]["k"] == 2
    assert tasks["b"]["pass@k"] == 0.0 and tasks["b"]["k"] == 1


def test_outcomes_in_enum_order_and_failures_grouped_by_reason():
    """Outcome counts follow Outcome's order; failures differing only in numbers group."""
    rows = [
        _row("a#0", "a", "infra_error", error="boot failed after 3 attempts (port 4711)"),
        _row("b#0", "b", "infra_error", error="boot failed after 5 attempts (port 9)"),
        _row("c#0", "c", "solved", 1.0),
        _row("d#0", "d", "agent_error", error="agent exited 137\ntrace..."),
    ]
    data = overview(rows, earlier=[_row("c#0", "c", "grader_error", error="grader crashed")])
    assert list(data["outcomes"]) == ["solved", "agent_error", "infra_error"]
    groups = {(g["outcome"], g["reason"]): g for g in data["failures"]}
    boot = groups[("infra_error", "boot failed after N attempts (port N)")]
    assert boot["count"] == 2 and boot["keys"] == ["a#0", "b#0"]
    assert groups[("agent_error", "agent exited N")]["count"] == 1
    assert groups[("grader_error", "grader crashed")]["earlier"] == 1


def test_odd_rows_read_as_unknown_not_errors():
    """Wrong types, NaN and missing keys become None; nothing raises."""
    row = rollout_summary(
        {
            "key": 5,
            "reward": float("nan"),
            "timings": {"agent": "x", "boot": 1},
            "grade": [1],
            "turns": True,
            "sampled_tokens": 10,
        }
    )
    assert row["key"] is None and row["reward"] is None and row["turns"] is None
    assert row["timings"] == {"boot": 1.0} and row["grade"] is None
    assert row["tokens_per_second"] is None
    assert failure_reason({"outcome": "timeout", "error": None}) == "timeout (no error)"


def test_reward_histogram_and_phase_stats():
    """Rewards fall into equal bins; phases come in run order with median and p90."""
    hist = reward_histogram([0.0, 0.0, 0.5, 1.0], bins=2)
    assert [b["count"] for b in hist["bins"]] == [2, 2] and hist["mean"] == pytest.approx(0.375)
    assert reward_histogram([1.0, 1.0])["bins"] == [{"low": 1.0, "high": 1.0, "count": 2}]
    rows = [
        _row(f"k{i}", "t", "solved", timings={"grade": i, "boot": 1.0, "zz": 2}) for i in range(10)
    ]
    stats = phase_stats(rows)
    assert [s["phase"] for s in stats] == ["boot", "grade", "zz"]
    grade = stats[1]
    assert grade["median"] == 4.5 and grade["p90"] == 8.0 and grade["max"] == 9.0


def test_tokens_per_second_from_sampled_tokens_and_agent_seconds():
    """tokens/s is sampled tokens over agent seconds, run-wide and per rollout."""
    rows = [
        _row("a", "a", "solved", sampled_tokens=100, timings={"agent": 10.0}),
        _row("b", "b", "solved", sampled_tokens=300, timings={"agent": 10.0}),
    ]
    assert rows[0]["tokens_per_second"] == 10.0
    assert overview(rows)["tokens_per_second"] == 20.0


def test_reward_histogram_counts_graded_samples_only():
    """An infra_error rollout's reward 0 is no sample (pass@k leaves it out): the reward
    histogram leaves it out too."""
    rows = [
        _row("a#0", "a", "solved", 1.0),
        _row("a#1", "a", "infra_error", 0.0),
        _row("a#2", "a", "grader_error", 0.0),
    ]
    data = overview(rows)
    assert data["rewards"]["count"] == 1 and data["rewards"]["mean"] == 1.0
    assert data["tasks"][0]["graded"] == 1


def test_ray_rows_give_nodes_and_reschedules():
    """Rows from a Ray run: each node's rollouts, solved and failed, and the dispatches
    lost on a node (from ``rescheduled``); odd entries are unknown, not errors."""
    lost = [{"node_id": "n1", "error": "node died"}, "junk", {"node_id": 5}]
    rows = [
        _row("a#0", "a", "solved", 1.0, node_id="n2", node_ip="10.0.0.2", rescheduled=lost),
        _row("b#0", "b", "agent_error", node_id="n2", node_ip="10.0.0.2"),
        _row("c#0", "c", "unsolved", node_id="n1", node_ip="10.0.0.1", rescheduled="x"),
    ]
    assert rows[0]["rescheduled"] == [
        {"node_id": "n1", "error": "node died"},
        {"node_id": None, "error": None},
    ]
    assert rows[2]["rescheduled"] == []
    data = overview(rows)
    nodes = {n["node_id"]: n for n in data["nodes"]}
    assert nodes["n2"] == {
        "node_id": "n2", "node_ip": "10.0.0.2", "rollouts": 2, "solved": 1, "failed": 1, "lost": 0
    }  # fmt: skip
    assert nodes["n1"]["lost"] == 1 and nodes["unknown"]["lost"] == 1
    assert data["rescheduled"] == 1
    assert overview([_row("d#0", "d", "solved", 1.0)])["nodes"] == []


def test_two_runs_compare_with_shared_bins():
    """Two runs: outcomes in either, pass@k per task side by side (a task one run lacks
    is None there), and histograms over the same range so the bars line up."""
    from agentrl.view.compare import compare_runs

    def run(title, rows):
        return {"title": title, "kind": "rollout", "rollouts": rows, "overview": overview(rows)}

    a = run("a", [_row("t#0", "t", "solved", 1.0, sampled_tokens=100)])
    b = run("b", [_row("t#0", "t", "unsolved", 0.0, sampled_tokens=300),
                  _row("u#0", "u", "infra_error", 0.0, sampled_tokens=10)])  # fmt: skip
    data = compare_runs([a, b])
    assert data["outcomes"] == ["solved", "unsolved", "infra_error"]
    tasks = {t["instance_id"]: t["runs"] for t in data["tasks"]}
    assert tasks["t"][0]["pass@1"] == 1.0 and tasks["t"][1]["pass@1"] == 0.0
    assert tasks["u"][0] is None and tasks["u"][1]["graded"] == 0
    ra, rb = data["runs"][0]["rewards"], data["runs"][1]["rewards"]
    assert ra["bins"][0]["low"] == rb["bins"][0]["low"] == 0.0 and rb["count"] == 1
    ta, tb = data["runs"][0]["tokens"], data["runs"][1]["tokens"]
    assert ta["bins"][-1]["high"] == tb["bins"][-1]["high"] == 300.0
    assert data["runs"][1]["pass@1"] == 0.0 and data["runs"][1]["pass@k"] == 0.0
