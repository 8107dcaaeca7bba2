"""A real Claude Code rollout in a ``docker`` sandbox: the scripted engine, the example task.

The CLI is the host's ``agentrl install-clis`` directory bound read-only into a container
of the offline base image; the middleware is reached through its socket directory; the
agent's diff is graded in a fresh container.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import subprocess
import sys
import time

import attrs
import pytest
from rollout_support import CLI_DIR, SANDBOX_PORT, claude_solution, textstats_task

from agentrl.graders.scaleswe import ScaleSWEGrader
from agentrl.harnesses.claude_code import ClaudeCodeHarness
from agentrl.rollout import RolloutConfig, run_rollout
from agentrl.sandboxes.docker import DockerSandbox
from agentrl.types import Outcome

pytestmark = pytest.mark.slow

EXAMPLES = pathlib.Path(__file__).resolve().parents[3] / "examples" / "tasks"


def _agentrl_containers(host: str) -> str:
    """The ids of every agentrl container on the daemon, one per line."""
    return subprocess.run(
        ["docker", "ps", "-aq", "--filter", "label=agentrl.sandbox=docker"],
        env={**os.environ, "DOCKER_HOST": host},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


async def test_a_missing_image_is_an_infra_error_naming_it(
    docker_options, agentrl_middleware, scripted_engine
):
    """A task whose image is not on the daemon: the rollout is an infra_error that names the
    image, within seconds, and the engine is never asked for a token."""
    task = attrs.evolve(textstats_task(), image="agentrl-test/never-built:3")
    options = {**docker_options, "services": {SANDBOX_PORT: agentrl_middleware.unix_path}}
    started = time.monotonic()
    result = await run_rollout(
        task,
        harness=ClaudeCodeHarness(cli_path="/nonexistent/claude", extra_args=(), extra_env={}),
        grader=ScaleSWEGrader(),
        sandbox_factory=lambda t: DockerSandbox.from_task(t, **options),
        middleware=agentrl_middleware,
        config=RolloutConfig(boot_retries=1, boot_backoff=0.1, middleware_port=SANDBOX_PORT),
    )
    assert result.outcome is Outcome.INFRA_ERROR
    assert "agentrl-test/never-built:3" in (result.error or "")
    assert time.monotonic() - started < 30
    assert not scripted_engine.served


async def test_the_rollout_command_runs_claude_code_in_containers(
    docker_options, scripted_engine, qwen_tokenizer_dir, tmp_path
):
    """``agentrl rollout tasks.jsonl --sandbox docker``: the real CLI in a container, graded in
    a fresh one, reward 1.0, and no container of the run left behind."""
    row = next(
        json.loads(line)
        for line in (EXAMPLES / "scaleswe.jsonl").read_text().splitlines()
        if json.loads(line)["metadata"]["instance_id"] == "textstats-1"
    )
    for key in ("repo", "gold_patch_path"):
        row["metadata"][key] = str(EXAMPLES / row["metadata"][key])
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(row) + "\n")
    for reply in claude_solution():
        scripted_engine.queue(reply)
    out = tmp_path / "out"
    options = {k: v for k, v in docker_options.items() if k != "run_id"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agentrl.cli",
        "rollout",
        str(tasks),
        "--sandbox",
        "docker",
        "--sandbox-options",
        json.dumps(options),
        "--harness",
        "claude_code",
        "--engine-url",
        scripted_engine.url,
        "--tokenizer",
        str(qwen_tokenizer_dir),
        "--cli-dir",
        str(CLI_DIR),
        "--out",
        str(out),
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(proc.communicate(), 600)
    assert proc.returncode == 0, stderr.decode()[-3000:]
    rollouts = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert [r["outcome"] for r in rollouts] == ["solved"], rollouts
    assert rollouts[0]["reward"] == 1.0
    listed = _agentrl_containers(docker_options["docker_host"])
    assert listed == ""
