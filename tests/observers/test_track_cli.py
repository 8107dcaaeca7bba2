"""`agentrl rollout --track tensorboard` end to end: a real CLI solves the example task through
the whole stack (scripted SGLang engine, bubblewrap, the scaleswe grader), and the run's
TensorBoard event files hold what the rollout did."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from rollout_support import CLI_DIR, claude_solution, example_task_file
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util


async def _agentrl(*args: str, cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agentrl.cli",
        *args,
        cwd=cwd,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 300)
    return proc.returncode or 0, err.decode()


@pytest.mark.slow
async def test_rollout_command_tracks_to_tensorboard(tmp_path, scripted_engine, qwen_tokenizer_dir):
    """``--track tensorboard`` (run name from the flags' defaults, directory --out): one
    solved rollout is step 1 of the scalars, with its turns and tokens, and the trajectory
    table closing the run names the task, the harness and the outcome."""
    if not (CLI_DIR / "bin" / "claude").exists():
        pytest.fail(
            f"agent CLIs missing in {CLI_DIR}; run `agentrl install-clis --dest .cache/clis`"
        )
    for reply in claude_solution():
        scripted_engine.queue(reply)
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRL_TRACK")}
    args = (
        "rollout",
        str(example_task_file(tmp_path)),
        "--engine-url",
        scripted_engine.url,
        "--tokenizer",
        str(qwen_tokenizer_dir),
        "--cli-dir",
        str(CLI_DIR),
        "--out",
        str(out),
        "--agent-time-budget",
        "240",
        "--track",
        "tensorboard",
    )
    code, stderr = await _agentrl(*args, cwd=tmp_path, env=env)
    assert code == 0, stderr[-3000:]

    (logdir,) = (out / "tensorboard").iterdir()
    accumulator = EventAccumulator(str(logdir))
    accumulator.Reload()
    scalars = {tag: accumulator.Scalars(tag) for tag in accumulator.Tags()["scalars"]}
    assert [(e.step, e.value) for e in scalars["reward"]] == [(1, 1.0)]
    assert [(e.step, e.value) for e in scalars["outcomes/solved"]] == [(1, 1.0)]
    rollout = json.loads((out / "rollouts.jsonl").read_text().splitlines()[0])
    assert scalars["turns"][0].value == rollout["turns"] > 0
    assert scalars["sampled_tokens"][0].value == rollout["sampled_tokens"] > 0
    assert scalars["seconds/agent"][0].value == pytest.approx(rollout["timings"]["agent"])
    proto = accumulator.Tensors("trajectories")[-1].tensor_proto
    table = tensor_util.make_ndarray(proto).item().decode().splitlines()
    assert len(table) == 3 and "| textstats-1 |" in table[2] and "| solved |" in table[2]
    assert f"| {rollout['session_id']} | claude_code |" in table[2]
    config = tensor_util.make_ndarray(accumulator.Tensors("config")[-1].tensor_proto).item()
    assert b'"harness": "claude_code"' in config


@pytest.mark.parametrize(
    ("flags", "env"),
    [(["--track", "wandb,mlflow"], {}), ([], {"AGENTRL_TRACK": "mlflow"})],
)
def test_an_unknown_tracker_is_a_usage_error(tmp_path, flags, env):
    """``--track mlflow`` or ``AGENTRL_TRACK=mlflow``: exit 2 naming the trackers there are,
    before any stack starts."""
    from agentrl.cli.rollout import rollout_command

    args = [str(example_task_file(tmp_path)), "--engine-url", "http://127.0.0.1:9", *flags]
    result = CliRunner().invoke(rollout_command, args, env={"AGENTRL_TRACK": None, **env})
    assert result.exit_code == 2, result.output
    assert "no tracker named 'mlflow'" in result.output and "wandb, tensorboard" in result.output
