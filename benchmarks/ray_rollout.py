"""Rollouts per minute on a local Ray cluster of 1 and 2 nodes, and what Ray costs a rollout.

    python benchmarks/ray_rollout.py [--quick] [--rollouts N] [--concurrency C]

Goal: spreading rollouts over a Ray cluster costs a rollout little beside the rollout
itself, so ``agentrl rollout --ray`` scales with the nodes given to it. Each rollout is
the real Claude Code CLI (``.cache/clis``, ``AGENTRL_CLI_DIR``) in the real ``local``
sandbox on the bundled textstats task, its turns played by the scripted SGLang engine in
this process (every node reaches it by URL), graded by the scaleswe grader; the same
``Runner`` commits every result (the driver is the only writer). In one run, back to back:

- **local**: ``Stack`` + ``Runner`` in this process, ``C`` rollouts at once;
- **ray, 1 node**: a real head node (``ray start --block``), its node actor running ``C``
  at once;
- **ray, 2 nodes**: a second node process joined, ``C`` at once on each.

It prints rollouts/min of each (first dispatch to last commit; the stacks' start-up is
not counted) and, each with its goal:

- **scheduling overhead per rollout**: the driver's time for a Ray rollout (send the job,
  get the result back) minus the rollout's own ``timings["total"]`` on its node, the
  median (goal ≤ 0.25 s);
- **1 node vs local**: rollouts/min of Ray on one node over the local runner's, same
  concurrency (goal ≥ 0.85);
- **2 nodes vs 1 node**: rollouts/min (goal ≥ 1.0: a second node adds slots. On this one
  machine the two nodes share its CPUs, so the ratio says what Ray costs, not what a
  second machine would add).

``--quick``: 2 rollouts a run. Timings on a shared machine are noisy: compare the ratios,
which are measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import statistics
import sys
import tempfile
import time
from typing import Any

from _driver import goal_line

from agentrl.graders.scaleswe import ScaleSWEGrader
from agentrl.graders.tasks import load_tasks
from agentrl.rollout.cluster import RayCluster
from agentrl.rollout.runner import Runner
from agentrl.rollout.stack import Stack, StackOptions
from agentrl.testing.scripted_engine import ScriptedReply

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "support"))

from rollout_support import claude_solution  # noqa: E402

OVERHEAD_GOAL = 0.25
LOCAL_RATIO_GOAL = 0.85
SCALE_GOAL = 1.0


class Policy:
    """The scripted engine's responder: every session plays Claude Code's solution."""

    def __init__(self) -> None:
        self.replies = claude_solution()
        self.turns: dict[str, int] = {}

    def __call__(self, body: Any, headers: Any) -> ScriptedReply:
        key = headers.get("X-SMG-Routing-Key") or ""
        turn = self.turns.get(key, 0)
        self.turns[key] = turn + 1
        return ScriptedReply(text=self.replies[min(turn, len(self.replies) - 1)])


def textstats_task() -> Any:
    rows = load_tasks(REPO / "examples" / "tasks" / "scaleswe.jsonl", grader=ScaleSWEGrader())
    return next(row.task for row in rows if row.task.instance_id == "textstats-1")


async def timed_run(rollout_fn: Any, out: pathlib.Path, n: int, concurrency: int) -> float:
    """Seconds for ``n`` rollouts through a ``Runner`` (all must solve)."""
    runner = Runner(rollout_fn, out, concurrency=concurrency)
    jobs = runner.plan([textstats_task()], n)
    started = time.monotonic()
    summary = await runner.run(jobs)
    wall = time.monotonic() - started
    if summary.solved != n:
        raise SystemExit(f"not every rollout solved the task: {dict(summary.outcomes)}")
    return wall


async def ray_run(
    options: StackOptions, address: str, out: pathlib.Path, n: int, per_node: int
) -> tuple[float, list[float], int]:
    """Seconds for ``n`` rollouts on the cluster, each one's overhead, and the node count."""
    overheads: list[float] = []
    async with RayCluster(options, address=address, slots_per_node=per_node) as cluster:

        async def rollout(task: Any, index: int) -> Any:
            started = time.monotonic()
            result = await cluster.rollout(task, index)
            overheads.append(time.monotonic() - started - result.result.timings["total"])
            return result

        wall = await timed_run(rollout, out, n, cluster.slots)
        return wall, overheads, len(cluster.nodes)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rollouts a run")
    parser.add_argument("--rollouts", type=int, default=0, help="per run (default 4)")
    parser.add_argument("--concurrency", type=int, default=2, help="per node (and local)")
    args = parser.parse_args()
    n = args.rollouts or (2 if args.quick else 4)
    c = args.concurrency

    from agentrl.testing.ray_cluster import RAY_ENV, LocalRayCluster

    os.environ.update(RAY_ENV)  # this process is the driver
    try:
        import ray  # noqa: F401
    except ImportError:
        print("ray_rollout benchmark SKIPPED: ray is not installed (agentrl's [ray] extra)")
        return
    from agentrl.testing.scripted_engine import ScriptedEngine
    from agentrl.tokenizers import load_tokenizer, qwen_tokenizer_dir

    cli_dir = pathlib.Path(os.environ.get("AGENTRL_CLI_DIR", REPO / ".cache" / "clis"))
    if not (cli_dir / "bin" / "claude").exists():
        print(f"ray_rollout benchmark SKIPPED: no Claude Code in {cli_dir} (agentrl install-clis)")
        return
    tokenizer_dir = str(qwen_tokenizer_dir())
    print("ray_rollout benchmark: Claude Code + scripted engine + local sandbox, textstats task")
    print(f"  {n} rollouts a run, {c} at once per node (and locally)")
    (REPO / ".cache").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="agentrl-bench-ray-", dir=REPO / ".cache") as scratch:
        root = pathlib.Path(scratch)
        async with ScriptedEngine(load_tokenizer(tokenizer_dir), responder=Policy()) as engine:
            options = StackOptions(
                engine_url=engine.url,
                tokenizer=tokenizer_dir,
                cli_dir=str(cli_dir),
                sandbox_options={"state_dir": str(root / "sandboxes")},
                boot_concurrency=c,
                rollout={"agent_time_budget": 180, "eval_timeout": 120},
            )
            async with Stack(options) as stack:
                await timed_run(stack.rollout, root / "warm", 1, 1)  # page cache, probes
                local = await timed_run(stack.rollout, root / "local", n, c)
            with LocalRayCluster(num_cpus=2) as cluster:
                one, over_one, _ = await ray_run(options, cluster.address, root / "ray1", n, c)
                cluster.add_node("node2")
                two, over_two, nodes = await ray_run(options, cluster.address, root / "ray2", n, c)
    report(n, c, local, one, two, over_one + over_two, nodes)


def report(
    n: int, c: int, local: float, one: float, two: float, overheads: list[float], nodes: int
) -> None:
    per_min = {name: n / wall * 60 for name, wall in (("local", local), ("1", one), ("2", two))}
    print(f"  local runner: {n} rollouts in {local:.1f}s = {per_min['local']:.1f} rollouts/min")
    print(f"  ray, 1 node:  {n} rollouts in {one:.1f}s = {per_min['1']:.1f} rollouts/min")
    print(f"  ray, {nodes} nodes: {n} rollouts in {two:.1f}s = {per_min['2']:.1f} rollouts/min")
    overhead = statistics.median(overheads)
    print(
        goal_line(
            "ray: scheduling overhead per rollout (median)",
            f"{overhead:.3f} s",
            f"<= {OVERHEAD_GOAL} s",
            overhead <= OVERHEAD_GOAL,
        )
    )
    ratio = per_min["1"] / per_min["local"]
    print(
        goal_line(
            f"ray: rollouts/min, 1 node vs local (c={c})",
            f"{ratio:.2f}x",
            f">= {LOCAL_RATIO_GOAL}x",
            ratio >= LOCAL_RATIO_GOAL,
        )
    )
    scale = per_min["2"] / per_min["1"]
    print(
        goal_line(
            "ray: rollouts/min, 2 nodes vs 1 (one machine's CPUs)",
            f"{scale:.2f}x",
            f">= {SCALE_GOAL}x",
            scale >= SCALE_GOAL,
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
