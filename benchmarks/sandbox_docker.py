"""Start + ``true`` in a ``docker`` sandbox against ``local``, measured in the same run.

    python benchmarks/sandbox_docker.py --image IMAGE [--docker-host unix://…] [--runs 16]
                                        [--total 16] [--concurrency 8]

Without ``--docker-host`` it starts a private dockerd (``scripts/dockerd.sh``) under /tmp
and, without ``--image``, imports the offline base image (``scripts/docker-base-image.sh``).
Prints, for each backend, the median and 90th percentile of start + the first ``true`` one
at a time (``--runs``), then of each sandbox and the wall time for ``--total`` sandboxes
``--concurrency`` at a time (teardown not counted in the per-sandbox figure).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import pathlib
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator

from agentrl.sandboxes.base import Sandbox
from agentrl.sandboxes.docker import DockerSandbox
from agentrl.sandboxes.local import LocalSandbox

ROOT = pathlib.Path(__file__).resolve().parents[1]


async def one(make: Callable[[], Sandbox]) -> float:
    started = time.perf_counter()
    sandbox = make()
    await sandbox.start()
    try:
        result = await sandbox.exec("true")
        assert result.exit_code == 0, result
        return time.perf_counter() - started
    finally:
        await sandbox.aclose()


async def batch(make: Callable[[], Sandbox], total: int, concurrency: int) -> tuple[list, float]:
    gate = asyncio.Semaphore(concurrency)

    async def gated() -> float:
        async with gate:
            return await one(make)

    started = time.perf_counter()
    times = await asyncio.gather(*(gated() for _ in range(total)))
    return list(times), time.perf_counter() - started


def stats(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return f"median {statistics.median(ordered) * 1000:7.1f} ms   p90 {p90 * 1000:7.1f} ms"


@contextlib.contextmanager
def daemon(host: str | None) -> Iterator[str]:
    if host:
        yield host
        return
    workdir = tempfile.mkdtemp(prefix="adk-b-", dir="/tmp")
    script = str(ROOT / "scripts" / "dockerd.sh")
    started = subprocess.run([script, "start", workdir], check=True, capture_output=True, text=True)
    try:
        yield started.stdout.strip()
    finally:
        subprocess.run([script, "stop", workdir], check=False)
        subprocess.run(["rm", "-rf", "--one-file-system", workdir], check=False)


async def measure(host: str, image: str, args: argparse.Namespace) -> None:
    backends: dict[str, Callable[[], Sandbox]] = {
        "local": lambda: LocalSandbox(),
        "docker": lambda: DockerSandbox(image=image, docker_host=host),
    }
    for make in backends.values():
        await one(make)  # warm caches (and the docker sweep of this process)
    print(f"start + true, {args.runs} runs one at a time (docker image {image})")
    for name, make in backends.items():
        times = [await one(make) for _ in range(args.runs)]
        print(f"  {name:<7} {stats(times)}")
    print(f"start + true, {args.total} sandboxes {args.concurrency} at a time")
    for name, make in backends.items():
        times, wall = await batch(make, args.total, args.concurrency)
        print(f"  {name:<7} {stats(times)}   wall {wall:6.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default=None)
    parser.add_argument("--docker-host", default=None)
    parser.add_argument("--runs", type=int, default=16)
    parser.add_argument("--total", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    with daemon(args.docker_host) as host:
        image = (
            args.image
            or subprocess.run(
                [str(ROOT / "scripts" / "docker-base-image.sh")],
                env={**os.environ, "DOCKER_HOST": host},
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
        )
        asyncio.run(measure(host, image, args))


if __name__ == "__main__":
    main()
