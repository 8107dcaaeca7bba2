"""Helpers of the Ray rollout tests: one local 2-node cluster, a per-session scripted policy,
and the CLI run as a driver subprocess."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rollout_support import CLI_DIR, claude_solution

from agentrl.testing.ray_cluster import RAY_ENV
from agentrl.testing.scripted_engine import ScriptedReply


def session_index(routing_key: str) -> int:
    """The sample index in a CLI rollout's session id (``INSTANCE-INDEX-HEX``)."""
    return int(routing_key.rsplit("-", 2)[-2])


class SessionScript:
    """A scripted engine responder: every session (routing key) plays Claude Code's solution.

    ``delay(index, first)`` is the delay of a session's first reply, given its sample index
    and whether it is the first session seen for that index (a re-dispatch is not).
    """

    def __init__(self, delay: Callable[[int, bool], float] | None = None) -> None:
        self.replies = claude_solution()
        self.delay = delay or (lambda index, first: 0.0)
        self.turns: collections.Counter[str] = collections.Counter()
        self.sessions: list[str] = []

    def __call__(self, body: Any, headers: Any) -> ScriptedReply:
        key = headers.get("X-SMG-Routing-Key") or ""
        turn = self.turns[key]
        self.turns[key] += 1
        delay = 0.0
        if turn == 0:
            index = session_index(key)
            first = all(session_index(seen) != index for seen in self.sessions)
            self.sessions.append(key)
            delay = self.delay(index, first)
        return ScriptedReply(text=self.replies[min(turn, len(self.replies) - 1)], delay=delay)

    def indexes(self) -> list[int]:
        """The sample index of every session started, in order."""
        return [session_index(key) for key in self.sessions]


def rollout_args(
    tasks: Path, out: Path, engine_url: str, tokenizer: Path, state_dir: Path, *extra: str
) -> list[str]:
    """``agentrl rollout`` of the textstats task, sandboxes' host state under ``state_dir``."""
    return [
        sys.executable,
        "-m",
        "agentrl.cli",
        "rollout",
        str(tasks),
        "--engine-url",
        engine_url,
        "--tokenizer",
        str(tokenizer),
        "--cli-dir",
        str(CLI_DIR),
        "--out",
        str(out),
        "--agent-time-budget",
        "120",
        "--eval-timeout",
        "120",
        "--sandbox-options",
        json.dumps({"state_dir": str(state_dir)}),
        *extra,
    ]


async def start(args: Sequence[str], cwd: Path) -> asyncio.subprocess.Process:
    """Start a driver (the CLI) with the cluster's environment."""
    env = {**os.environ, **RAY_ENV, "COLUMNS": "200"}
    return await asyncio.create_subprocess_exec(
        *args,
        cwd=cwd,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def run(args: Sequence[str], cwd: Path, timeout: float = 240) -> tuple[int, str, str]:
    """Run a driver to its end: exit code, stdout, stderr."""
    proc = await start(args, cwd)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return proc.returncode or 0, out.decode(), err.decode()


def rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSONL file."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def layout(out: Path) -> set[str]:
    """Every file under ``out``, relative."""
    return {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}


def sandbox_processes(state_dir: Path) -> list[int]:
    """Pids of processes naming ``state_dir`` (bubblewrap sandboxes, their launchers)."""
    needle = str(state_dir).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def start_local_cluster(*nodes: str) -> Any:
    """A started ``LocalRayCluster`` (head plus ``nodes``) on this machine, for a fixture
    to yield and stop. Outside CI a machine without Ray or where Ray cannot start skips;
    in CI both fail, as do missing agent CLIs."""
    import pytest

    if os.environ.get("CI", "").lower() != "true":
        pytest.importorskip("ray")
    from agentrl.testing.ray_cluster import LocalRayCluster, RayStartError

    if not (CLI_DIR / "bin" / "claude").exists():
        pytest.fail(f"agent CLIs missing in {CLI_DIR}; run `agentrl install-clis`")
    cluster = LocalRayCluster(num_cpus=2, nodes=nodes)
    try:
        cluster.start(nodes)
    except RayStartError as exc:
        cluster.stop()
        if os.environ.get("CI", "").lower() == "true":
            raise
        pytest.skip(f"a local Ray cluster does not start here: {exc}")
    return cluster
