"""`agentrl serve --workers N`: sessions served by worker processes behind one address."""

from __future__ import annotations

import asyncio
import json
import os
import re

import pytest
from click.testing import CliRunner
from shard_support import child_pids, recipe

from agentrl.cli.serve import run_server, serve

pytest_plugins = ("middleware_fixtures",)


def test_workers_with_an_in_process_engine_is_a_usage_error(qwen_tokenizer_dir, tmp_path):
    """--workers 2 with the transformers engine stops before anything starts, saying why."""
    result = CliRunner().invoke(
        serve,
        [
            "--tokenizer",
            str(qwen_tokenizer_dir),
            "--engine",
            "transformers",
            "--model",
            str(tmp_path),
            "--workers",
            "2",
        ],
    )
    assert result.exit_code == 2
    assert "cannot be shared by worker processes" in result.output


def test_workers_must_be_positive(qwen_tokenizer_dir):
    """--workers 0 is refused by the option itself."""
    result = CliRunner().invoke(
        serve,
        ["--tokenizer", str(qwen_tokenizer_dir), "--engine-url", "http://x:1", "--workers", "0"],
    )
    assert result.exit_code == 2 and "--workers" in result.output


@pytest.mark.slow
async def test_serve_with_two_workers_serves_and_writes_the_trajectory(
    tmp_path, scripted_engine, sglang_client, qwen_tokenizer_dir, http
):
    """Two workers: the printed token reaches a worker process (not this one), the turn's
    sample is written on stop, and no worker outlives the server."""
    lines: list[str] = []
    serving = asyncio.Event()

    def announce(line: str) -> None:
        lines.append(line)
        if line.lstrip().startswith("Serving"):
            serving.set()

    stop = asyncio.Event()
    output = tmp_path / "trajectory.jsonl"
    before = child_pids()
    server = asyncio.create_task(
        run_server(
            engine=sglang_client,
            tokenizer=None,
            host="127.0.0.1",
            port=0,
            unix_path=None,
            tool_parser="hermes",
            reasoning_parser="qwen3",
            session_options={},
            output=output,
            reward=0.5,
            stop=stop,
            announce=announce,
            workers=2,
            recipe=recipe(scripted_engine.url, qwen_tokenizer_dir),
        )
    )
    await asyncio.wait_for(serving.wait(), 120)
    text = "\n".join(lines)
    url = re.search(r"agentrl middleware at (\S+)", text).group(1)
    token = re.search(r"ANTHROPIC_AUTH_TOKEN=(\S+)", text).group(1)
    workers = child_pids() - before
    assert len(workers) == 2
    scripted_engine.queue("Hello from a worker.")
    body = {"model": "m", "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}]}
    async with http.post(f"{url}/v1/messages", json=body, headers={"x-api-key": token}) as r:
        reply = await r.json()
        pid = int(r.headers["X-Agentrl-Worker-Pid"])
    assert reply["content"] == [{"type": "text", "text": "Hello from a worker."}]
    assert pid in workers and pid != os.getpid()
    stop.set()
    assert await asyncio.wait_for(server, 60) == 1
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert rows[0]["session"] == "claude_code" and rows[0]["reward"] == 0.5
    assert not (child_pids() & workers)
