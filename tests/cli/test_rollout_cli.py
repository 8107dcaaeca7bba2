"""`agentrl rollout` end to end: the real CLIs solve an example task through the whole stack.

The model is the scripted SGLang engine (the test double for a GPU server, speaking SGLang's
HTTP protocol), serving replies in the ``hermes`` tool-call format that name each CLI's real
tools. Everything else is real: the command line, the runner, the middleware, the Qwen3
tokenizer, bubblewrap, the CLIs from npm, git and the scaleswe grader.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import sys
from pathlib import Path

import pytest
from rollout_support import (
    CLI_DIR,
    DONE,
    FakeResult,
    FakeSample,
    claude_solution,
    codex_solution,
    example_task_file,
)
from rollout_support import fake_tasks as _tasks

from agentrl.cli.rollout import find_cli_dir, run_with_progress
from agentrl.rollout.runner import Runner
from agentrl.types import Outcome


def _read(path: str) -> str:
    return Path(path).read_text()


async def _agentrl(*args: str, cwd: Path, env: dict | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agentrl.cli",
        *args,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env or {**os.environ, "COLUMNS": "200"},
    )
    out, err = await asyncio.wait_for(proc.communicate(), 600)
    return proc.returncode, out.decode(), err.decode()


def _args(task_file, out, engine_url, tokenizer_dir, harness):
    return (
        "rollout",
        str(task_file),
        "--harness",
        harness,
        "--engine-url",
        engine_url,
        "--tokenizer",
        str(tokenizer_dir),
        "--cli-dir",
        str(CLI_DIR),
        "--out",
        str(out),
        "--agent-time-budget",
        "240",
        "--eval-timeout",
        "180",
    )


@pytest.mark.parametrize(
    ("harness", "solution"), [("claude_code", claude_solution), ("codex", codex_solution)]
)
async def test_rollout_command_solves_a_task(
    harness, solution, tmp_path, scripted_engine, qwen_tokenizer_dir
):
    """The command runs the CLI in a sandbox, grades 1.0, writes samples, and resumes."""
    if not (CLI_DIR / "bin" / "claude").exists():
        pytest.fail(
            f"agent CLIs missing in {CLI_DIR}; run `agentrl install-clis --dest .cache/clis`"
        )
    for reply in solution():
        scripted_engine.queue(reply)
    task_file = example_task_file(tmp_path, "textstats-1")
    out = tmp_path / "out"
    args = _args(task_file, out, scripted_engine.url, qwen_tokenizer_dir, harness)

    code, stdout, stderr = await _agentrl(*args, cwd=tmp_path)
    assert code == 0, stderr[-3000:]
    rollouts = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert [r["outcome"] for r in rollouts] == ["solved"], rollouts
    assert rollouts[0]["reward"] == 1.0 and rollouts[0]["remove_sample"] is False
    diff, agent_log = _read(rollouts[0]["diff_path"]), _read(rollouts[0]["agent_log_path"])
    assert "text.split()" in diff and agent_log.strip()
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 1
    sample = samples[0]
    assert len(sample["loss_mask"]) == len(sample["rollout_logprobs"]) == sample["response_length"]
    assert sample["response_length"] == len(sample["tokens"]) - sample["prompt_length"]
    trained = sum(sample["loss_mask"])
    sampled = sum(len(s.output_ids) for s in scripted_engine.served)
    assert trained == sampled > 0
    assert "solve rate" in stdout and "100.0%" in stdout

    served_before = len(scripted_engine.served)
    code, stdout, stderr = await _agentrl(*args, cwd=tmp_path)
    assert code == 0, stderr[-3000:]
    assert len(scripted_engine.served) == served_before, "a finished rollout was redone"
    assert "already done (resumed)" in stdout


async def test_ctrl_c_stops_cleanly_and_keeps_the_run_resumable(
    tmp_path, scripted_engine, qwen_tokenizer_dir
):
    """SIGINT mid-turn: exit 130 with a resume hint, the engine request aborted, no traceback."""
    if not (CLI_DIR / "bin" / "claude").exists():
        pytest.fail(
            f"agent CLIs missing in {CLI_DIR}; run `agentrl install-clis --dest .cache/clis`"
        )
    scripted_engine.queue(DONE, delay=120)
    task_file = example_task_file(tmp_path, "textstats-1")
    out = tmp_path / "out"
    args = _args(task_file, out, scripted_engine.url, qwen_tokenizer_dir, "claude_code")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agentrl.cli",
        *args,
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200"},
    )
    try:
        await scripted_engine.wait_for(lambda: bool(scripted_engine.generate_requests), 120)
        proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), 120)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    stderr = err.decode()
    assert proc.returncode == 130, stderr[-3000:]
    assert "re-run the same command to resume" in stderr and "Traceback" not in stderr
    await scripted_engine.wait_for(lambda: bool(scripted_engine.abort_requests), 10)
    assert not (out / "rollouts.jsonl").exists() or not (out / "rollouts.jsonl").read_text()


async def test_rollout_command_rejects_bad_configuration(tmp_path):
    """Missing engine URL, unknown harness, unreadable task files, a bad --prompt-mode: clear
    errors, exit 2 for a bad option and 1 for a file that cannot be read."""
    task_file = example_task_file(tmp_path, "textstats-1")
    code, _, stderr = await _agentrl("rollout", str(task_file), "--tokenizer", ".", cwd=tmp_path)
    assert code == 2 and "--engine sglang needs --engine-url" in stderr
    code, _, stderr = await _agentrl("rollout", str(tmp_path / "nope.jsonl"), cwd=tmp_path)
    assert code == 2 and "does not exist" in stderr
    url = ("--engine-url", "http://127.0.0.1:9")
    code, _, stderr = await _agentrl(
        "rollout", str(task_file), "--harness", "nope", *url, "--tokenizer", ".", cwd=tmp_path
    )
    assert code == 2 and "harness 'nope' is not available" in stderr, stderr[-2000:]
    assert "claude_code" in stderr and "Traceback" not in stderr
    code, _, stderr = await _agentrl(
        "rollout", str(task_file), *url, "--tokenizer", str(tmp_path), cwd=tmp_path
    )
    assert code == 1 and "tokenizer" in stderr and "Traceback" not in stderr, stderr[-2000:]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    code, _, stderr = await _agentrl(
        "rollout", str(bad), "--engine-url", "http://127.0.0.1:9", "--tokenizer", ".", cwd=tmp_path
    )
    assert code == 1 and "bad.jsonl:1" in stderr and "Traceback" not in stderr
    code, _, stderr = await _agentrl(
        "rollout", str(task_file), *url, "--prompt-mode", "spliced", cwd=tmp_path
    )
    assert code == 2 and "'--prompt-mode'" in stderr and "'splice', 'render'" in stderr, stderr


@pytest.mark.parametrize(
    ("option", "kind"),
    [
        ("--harness", "harness"),
        ("--sandbox", "sandbox"),
        ("--engine", "engine"),
        ("--grader", "grader"),
        ("--tool-parser", "tool parser"),
        ("--reasoning-parser", "reasoning parser"),
    ],
)
async def test_an_unknown_plugin_name_is_a_usage_error_reported_first(tmp_path, option, kind):
    """An unknown plugin name is exit 2 (as --help says of a bad option) listing the
    choices, reported before the tasks file is read and before the missing --engine-url
    and --tokenizer: the tasks file here is not even valid JSON."""
    bad_tasks = tmp_path / "tasks.jsonl"
    bad_tasks.write_text("{not json\n")
    code, _, stderr = await _agentrl("rollout", str(bad_tasks), option, "nope", cwd=tmp_path)
    assert code == 2, stderr[-2000:]
    assert f"Invalid value for '{option}': {kind} 'nope' is not available" in stderr, stderr
    assert "available: " in stderr and "Traceback" not in stderr
    assert "--engine-url" not in stderr and "tasks.jsonl" not in stderr


async def test_an_empty_tasks_file_is_an_error_not_zero_rollouts(tmp_path):
    """An empty tasks file (or one of blank lines) exits 1 naming the file, before the
    engine is asked: not exit 0 with a summary of zero rollouts."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    out = tmp_path / "out"
    code, stdout, stderr = await _agentrl(
        "rollout",
        str(empty),
        "--engine-url",
        "http://127.0.0.1:9",
        "--tokenizer",
        ".",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert code == 1, stdout[-2000:] + stderr[-2000:]
    assert f"no tasks in {empty}" in stderr
    assert "Traceback" not in stderr and not out.exists()


async def test_an_engine_that_does_not_answer_fails_before_any_rollout(
    tmp_path, qwen_tokenizer_dir
):
    """--engine-url where nothing listens: exit 1 at once with the URL and the connection
    error, no sandbox booted and no rollout written, where every rollout used to boot its
    sandbox and CLI and end minutes later as an infra_error."""
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    out = tmp_path / "out"
    args = _args(example_task_file(tmp_path), out, url, qwen_tokenizer_dir, "claude_code")
    code, _, stderr = await _agentrl(*args, cwd=tmp_path)
    assert code == 1, stderr[-3000:]
    assert f"the sglang engine at {url} does not answer" in stderr, stderr[-3000:]
    assert "unreachable" in stderr and "No rollout was started" in stderr
    assert "Traceback" not in stderr and not (out / "rollouts.jsonl").exists()


async def test_unknown_option_keys_are_usage_errors(tmp_path, scripted_engine, qwen_tokenizer_dir):
    """A misspelt --sandbox-options / --harness-options key: exit 2 listing the keys, no rollout."""
    task_file = example_task_file(tmp_path, "textstats-1")
    out = tmp_path / "out"
    args = _args(task_file, out, scripted_engine.url, qwen_tokenizer_dir, "claude_code")
    code, _, stderr = await _agentrl(*args, "--sandbox-options", '{"memroy_mb": 512}', cwd=tmp_path)
    assert code == 2, stderr[-3000:]
    assert "--sandbox-options: the 'local' sandbox has no option 'memroy_mb'" in stderr
    assert "did you mean 'memory_mb'?" in stderr and "pids" in stderr and "Traceback" not in stderr
    code, _, stderr = await _agentrl(*args, "--harness-options", '{"modle": "m"}', cwd=tmp_path)
    assert code == 2 and "the 'claude_code' harness has no option 'modle'" in stderr, stderr
    assert "cli_path" in stderr
    assert not scripted_engine.generate_requests and not (out / "rollouts.jsonl").exists()


async def test_e2b_task_without_image_fails_before_the_first_rollout(
    tmp_path, scripted_engine, qwen_tokenizer_dir
):
    """e2b, an image-less row and no template: one line naming the task, exit 1, nothing run."""
    task_file = example_task_file(tmp_path, "textstats-1")
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if "E2B" not in k}
    args = _args(task_file, out, scripted_engine.url, qwen_tokenizer_dir, "claude_code")
    code, _, stderr = await _agentrl(
        *args, "--sandbox", "e2b", "--public-host", "127.0.0.1", cwd=tmp_path, env=env
    )
    assert code == 1, stderr[-3000:]
    assert "task 'textstats-1' cannot run in the 'e2b' sandbox" in stderr
    assert "needs an image" in stderr and "Traceback" not in stderr
    assert not (out / "rollouts.jsonl").exists() or not (out / "rollouts.jsonl").read_text()


async def test_failed_rollouts_exit_1_and_run_again_on_resume(
    tmp_path, scripted_engine, qwen_tokenizer_dir
):
    """Every rollout an infra_error: exit 1 with a count; --keep-failed keeps it; a fixed re-run redoes it."""
    if not (CLI_DIR / "bin" / "claude").exists():
        pytest.fail(
            f"agent CLIs missing in {CLI_DIR}; run `agentrl install-clis --dest .cache/clis`"
        )
    task_file = example_task_file(tmp_path, "textstats-1")
    out = tmp_path / "out"
    args = _args(task_file, out, scripted_engine.url, qwen_tokenizer_dir, "claude_code")
    broken = ("--sandbox-options", '{"bwrap": "false"}')  # a "bubblewrap" that exits at once

    code, _, stderr = await _agentrl(*args, *broken, cwd=tmp_path)
    assert code == 1, stderr[-3000:]
    assert "1 rollout of 1 ended in infra_error/grader_error (1 infra_error)" in stderr
    assert f"{out / 'rollouts.jsonl'}" in stderr and "Traceback" not in stderr
    (failed,) = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert failed["outcome"] == "infra_error" and failed["attempt"] == 1

    code, stdout, stderr = await _agentrl(*args, *broken, "--keep-failed", cwd=tmp_path)
    assert code == 0, stderr[-3000:]
    assert not (out / "rollouts.failed.jsonl").exists()
    assert "rollouts this run" in stdout and not scripted_engine.generate_requests

    for reply in claude_solution():
        scripted_engine.queue(reply)
    code, stdout, stderr = await _agentrl(*args, cwd=tmp_path)
    assert code == 0, stderr[-3000:]
    rollouts = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert [(r["key"], r["outcome"], r["attempt"]) for r in rollouts] == [
        ("textstats-1#0", "solved", 2)
    ]
    old = [json.loads(line) for line in (out / "rollouts.failed.jsonl").read_text().splitlines()]
    assert old == [failed]
    assert re.search(r"retried \(infra/grader error before\)\W+1\W", stdout), stdout


def test_cli_dir_default_follows_the_install_script(tmp_path, monkeypatch):
    """AGENTRL_CLI_DIR (where install-clis.sh installs) is the default, if it holds the CLI."""
    install = tmp_path / "clis"
    (install / "bin").mkdir(parents=True)
    (install / "bin" / "codex").write_text("#!/bin/sh\n")
    monkeypatch.setenv("AGENTRL_CLI_DIR", str(install))
    monkeypatch.chdir(tmp_path)
    assert find_cli_dir() == install.resolve()
    assert find_cli_dir("codex") == install.resolve()
    assert find_cli_dir("claude") != install.resolve()


async def test_progress_line_counts_done_running_solved_failed(tmp_path, capsys):
    """The live line ends showing done/total, nothing running, solved, failed and tokens/s."""

    async def rollout(task, index):
        outcome = Outcome.INFRA_ERROR if task.instance_id == "task-0" else Outcome.SOLVED
        return FakeResult(task.instance_id, outcome, 1.0, (FakeSample(),))

    runner = Runner(rollout, tmp_path / "out")
    summary = await run_with_progress(runner, runner.plan(_tasks(3), 1))
    assert (summary.done, summary.solved, summary.failed) == (3, 2, 1)
    line = capsys.readouterr().out
    assert "3/3" in line and "running 0 · solved 2 · failed 1 ·" in line and "tok/s" in line


def test_summary_prints_the_out_path_as_text(capsys):
    """An --out path with square brackets is printed as written (not parsed as rich markup)."""
    import pathlib

    from agentrl.cli.rollout import print_summary
    from agentrl.rollout.runner import RunSummary

    print_summary(RunSummary(), pathlib.Path("runs/[bold]eval"), evaluation=True)
    assert "outputs in runs/[bold]eval/" in capsys.readouterr().out


def _documented_rollout_files() -> list[str]:
    """The per-rollout file names of docs/rollouts.md's "Output files" table, as written."""
    docs = (Path(__file__).resolve().parents[2] / "docs" / "rollouts.md").read_text()
    table = docs.split("### Output files", 1)[1].split("\n\n", 2)[1]
    return re.findall(r"^\| `([a-z_]+/[^`]+)` \| rollout \|", table, flags=re.MULTILINE)


async def test_the_documented_output_file_names_are_the_files_written(tmp_path):
    """docs/rollouts.md names each rollout's agent log, diff and session file: after a run,
    each name (INSTANCE, k filled in) is a file the runner wrote, so the table cannot drift
    from the runner (it once said ``KEY.log``, ``textstats-1#0.log``, where the file is
    ``textstats-1__0.log``)."""

    async def rollout(task, index):
        return FakeResult(task.instance_id, Outcome.SOLVED, 1.0, (FakeSample(),))

    out = tmp_path / "out"
    runner = Runner(rollout, out)
    await runner.run(runner.plan(_tasks(1), 2))
    documented = _documented_rollout_files()
    assert len(documented) >= 3, documented
    for name in documented:
        for k in (0, 1):
            path = out / name.replace("INSTANCE", "task-0").replace("__k", f"__{k}")
            assert path.is_file(), (name, sorted(p.name for p in path.parent.iterdir()))
