"""GRPO on a CPU through real agentrl rollouts (``make learn``'s run), reported as a curve.

Runs :func:`agentrl.trl.learn.learn` with its defaults (SmolLM2-135M-Instruct, the
``tiny_agent`` harness on the ``write-file`` tasks, 4 prompts x 4 rollouts per step) and
prints exact success per step, seconds per step, the wall time and the peak RSS of this
process, with the goals: exact success >= 60% (mean of the last 3 steps) within 15
minutes, peak memory <= 8 GB. Needs ``make trl-deps`` and the demo model
(``scripts/vllm.sh model``).

    python benchmarks/learn.py [--out DIR] [--budget SECONDS] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _measure import goal_line, load_line

ROOT = Path(__file__).resolve().parents[1]
GOAL_SUCCESS = 0.6
GOAL_SECONDS = 900.0
GOAL_RSS_GB = 8.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="run directory (default: a temporary one)")
    parser.add_argument("--budget", type=float, default=GOAL_SECONDS)
    parser.add_argument("--json", action="store_true", help="print the curve as JSON")
    args = parser.parse_args(argv)
    try:
        import trl  # noqa: F401
    except ImportError:
        print("learn: trl is not installed (make trl-deps); nothing measured")
        return 1
    from agentrl.trl.learn import GOAL_WINDOW, LearnConfig, learn

    model = (
        subprocess.run(
            ["bash", str(ROOT / "scripts/vllm.sh"), "model"],
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    out = args.out or tempfile.mkdtemp(prefix="agentrl-learn-")
    print(load_line(), flush=True)
    report = learn(LearnConfig(model=model, out=out, budget=args.budget, target=GOAL_SUCCESS))
    print(load_line(), flush=True)
    if args.json:
        print(json.dumps(report))
    print("\nstep  exact success  seconds")
    for step, (success, seconds) in enumerate(
        zip(report["success"], report["seconds_per_step"], strict=True), 1
    ):
        print(f"{step:4d}  {success:12.0%}  {seconds:7.1f}")
    window = report["success"][-GOAL_WINDOW:]
    last = sum(window) / len(window) if window else 0.0
    print(
        goal_line(
            f"learn: exact success, mean of the last {GOAL_WINDOW} steps",
            f"{last:.0%}",
            f">= {GOAL_SUCCESS:.0%}",
            report["goal_reached"],
        )
    )
    wall = report["wall_seconds"]
    print(
        goal_line(
            "learn: wall time",
            f"{wall:.0f}s",
            f"<= {GOAL_SECONDS:.0f} s",
            report["goal_reached"] and wall <= GOAL_SECONDS,
        )
    )
    rss = report["peak_rss_gb"]
    print(
        goal_line(
            "learn: peak RSS (the trainer process)",
            f"{rss:.1f}GB",
            f"<= {GOAL_RSS_GB:.0f} GB",
            rss <= GOAL_RSS_GB,
        )
    )
    print(f"  curve: {out}/learning_curve.png · rollouts: agentrl view {out}/rollouts")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
