"""Median time to start a ``local`` sandbox, run ``true`` in it, and tear it down.

    python benchmarks/sandbox_local.py [--runs 20] [--repo PATH] [--overlay auto|never]

Prints the median and 90th percentile of: start (enter the context), the first ``true``,
start + ``true`` together, a warm ``true``, and teardown (leave the context).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from agentrl.sandboxes.local import LocalSandbox


async def one(repo: str | None, overlay: str) -> dict[str, float]:
    t0 = time.perf_counter()
    sb = LocalSandbox(repo=repo, overlay=overlay)
    await sb.start()
    t1 = time.perf_counter()
    result = await sb.exec("true")
    t2 = time.perf_counter()
    assert result.exit_code == 0, result
    await sb.exec("true")
    t3 = time.perf_counter()
    await sb.aclose()
    t4 = time.perf_counter()
    return {
        "start": t1 - t0,
        "first true": t2 - t1,
        "start + true": t2 - t0,
        "warm true": t3 - t2,
        "teardown": t4 - t3,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--repo", default=None, help="a repository to mount as the workspace")
    parser.add_argument("--overlay", default="auto", choices=["auto", "never", "require"])
    args = parser.parse_args()
    await one(args.repo, args.overlay)  # warm the page cache and the overlay probe
    runs = [await one(args.repo, args.overlay) for _ in range(args.runs)]
    print(f"local sandbox, {args.runs} runs, repo={args.repo}, overlay={args.overlay}")
    for key in runs[0]:
        values = sorted(r[key] for r in runs)
        p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
        print(
            f"  {key:<13} median {statistics.median(values) * 1000:7.1f} ms   p90 {p90 * 1000:7.1f} ms"
        )


if __name__ == "__main__":
    asyncio.run(main())
