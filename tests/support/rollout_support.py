"""Shared helpers of the rollout and runner tests: the scripted solutions of the textstats
example task (as a Qwen3 policy would sample them) and small stand-ins for rollout results."""

from __future__ import annotations

import json
import os
from pathlib import Path

import attrs

from agentrl.trajectory import TrainingSample
from agentrl.types import Outcome, Task

REPO = Path(__file__).resolve().parents[2]
CLI_DIR = Path(os.environ.get("AGENTRL_CLI_DIR", REPO / ".cache" / "clis"))
#: The port the middleware's unix socket is relayed to inside each sandbox.
SANDBOX_PORT = 18001
CORE = "/workspace/textstats/core.py"
BUGGY = (
    '    for token in text.split(" "):\n'
    "        token = token.strip(_PUNCTUATION).lower()\n"
    "        result.append(token)"
)
FIXED = (
    "    for token in text.split():\n"
    "        token = token.strip(_PUNCTUATION).lower()\n"
    "        if token:\n"
    "            result.append(token)"
)
CODEX_PATCH = (
    "*** Begin Patch\n"
    "*** Update File: textstats/core.py\n"
    "@@\n"
    '-    for token in text.split(" "):\n'
    "+    for token in text.split():\n"
    "         token = token.strip(_PUNCTUATION).lower()\n"
    "-        result.append(token)\n"
    "+        if token:\n"
    "+            result.append(token)\n"
    "*** End Patch"
)
RUN_TESTS = "python -m pytest -q -p no:cacheprovider tests"
TASKS = REPO / "examples" / "tasks" / "scaleswe.jsonl"


def textstats_task() -> Task:
    """The textstats example task (eval_cmd grading), parsed by the scaleswe grader."""
    from agentrl.graders.scaleswe import ScaleSWEGrader
    from agentrl.graders.tasks import load_tasks

    rows = load_tasks(TASKS, grader=ScaleSWEGrader())
    return next(row.task for row in rows if row.task.instance_id == "textstats-1")


DONE = "The whitespace handling in `words` is fixed and the tests pass."


def example_task_file(tmp_path: Path, instance_id: str = "textstats-1") -> Path:
    """``tmp_path/task.jsonl``: one row of the example tasks, its host paths made absolute
    (for tests that run the ``agentrl`` command on it)."""
    for line in TASKS.read_text().splitlines():
        row = json.loads(line)
        meta = row["metadata"]
        if meta["instance_id"] == instance_id:
            for key in ("repo", "gold_patch_path"):
                if meta.get(key):
                    meta[key] = str(TASKS.parent / meta[key])
            path = tmp_path / "task.jsonl"
            path.write_text(json.dumps(row) + "\n")
            return path
    raise AssertionError(f"{instance_id} not in {TASKS}")


def tool_call(name: str, **arguments: object) -> str:
    """One tool call in the ``hermes`` format, exactly as Qwen3's chat template renders it."""
    call = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{call}\n</tool_call>"


def claude_solution() -> list[str]:
    """Read the file, fix it with Edit, run the tests with Bash, finish.

    The arguments are written the way Claude Code replays them (it adds ``replace_all``
    first to an Edit and drops a leading ``cd`` to its cwd from a Bash command), so the
    replayed history renders to exactly the sampled tokens and every turn trains.
    """
    return [
        "Let me look at how words are split.\n" + tool_call("Read", file_path=CORE),
        tool_call("Edit", replace_all=False, file_path=CORE, old_string=BUGGY, new_string=FIXED),
        tool_call("Bash", command=RUN_TESTS, description="Run the tests"),
        DONE,
    ]


def codex_solution() -> list[str]:
    """Read with exec_command, fix with apply_patch (through exec_command), test, finish."""
    return [
        tool_call("exec_command", cmd="cat textstats/core.py", workdir="/workspace"),
        tool_call(
            "exec_command", cmd=f"apply_patch <<'EOF'\n{CODEX_PATCH}\nEOF", workdir="/workspace"
        ),
        tool_call("exec_command", cmd=RUN_TESTS, workdir="/workspace"),
        DONE,
    ]


def qwen_code_solution() -> list[str]:
    """Read with read_file, fix with edit, run the tests with run_shell_command, finish."""
    return [
        "Let me look at how words are split.\n" + tool_call("read_file", file_path=CORE),
        tool_call("edit", file_path=CORE, old_string=BUGGY, new_string=FIXED),
        tool_call("run_shell_command", command=RUN_TESTS, description="Run the tests"),
        DONE,
    ]


def opencode_solution() -> list[str]:
    """Read with read, fix with edit, run the tests with bash, finish (opencode's tool names)."""
    return [
        "Let me look at how words are split.\n" + tool_call("read", filePath=CORE),
        tool_call("edit", filePath=CORE, oldString=BUGGY, newString=FIXED),
        tool_call("bash", command=RUN_TESTS, description="Run the tests"),
        DONE,
    ]


#: Whitespace a policy put around its thinking and its text (the parser must keep it).
PAD = "  "


def thinking(thought: str, answer: str) -> str:
    """``answer`` after a thinking block, as a Qwen3 thinking model samples a turn.

    The thought and the text start and end with :data:`PAD`, the whitespace a model
    sometimes samples there, which a re-rendered history would strip.
    """
    return f"<think>\n{PAD}{thought}{PAD}\n</think>\n\n{answer}"


def claude_thinking_solution() -> list[str]:
    """:func:`claude_solution` as a thinking model samples it, tool input keys out of order.

    Each turn thinks first; text is padded with whitespace; the Read, Edit and Bash inputs
    come in a key order other than their schema's (``limit`` before ``file_path``,
    ``new_string`` first, ``description`` before ``command``), which Claude Code re-orders
    when it replays them.
    """
    return [
        thinking(
            "The bug report is about splitting words.",
            f"{PAD}Let me look at how words are split.{PAD}\n"
            + tool_call("Read", limit=200, file_path=CORE),
        ),
        thinking(
            "split(' ') keeps empty tokens; split() does not.",
            tool_call(
                "Edit",
                new_string=FIXED,
                old_string=BUGGY,
                file_path=CORE,
                replace_all=False,
            ),
        ),
        thinking(
            "Now run the tests.",
            tool_call("Bash", description="Run the tests", command=RUN_TESTS),
        ),
        thinking("The tests pass.", f"{PAD}{DONE}{PAD}"),
    ]


def codex_thinking_solution() -> list[str]:
    """:func:`codex_solution` as a thinking model samples it, ``workdir`` before ``cmd``."""
    return [
        thinking(
            "Read the module first.",
            f"{PAD}Reading the module.{PAD}\n"
            + tool_call("exec_command", workdir="/workspace", cmd="cat textstats/core.py"),
        ),
        thinking(
            "split(' ') keeps empty tokens.",
            tool_call(
                "exec_command",
                workdir="/workspace",
                cmd=f"apply_patch <<'EOF'\n{CODEX_PATCH}\nEOF",
            ),
        ),
        thinking("Run the tests.", tool_call("exec_command", workdir="/workspace", cmd=RUN_TESTS)),
        thinking("The tests pass.", f"{PAD}{DONE}{PAD}"),
    ]


def FakeSample(reward: float = 1.0) -> TrainingSample:
    """A small real training sample: two prompt tokens, two trained response tokens."""
    return TrainingSample(
        tokens=(1, 2, 3, 4),
        prompt_length=2,
        response_length=2,
        loss_mask=(1, 1),
        rollout_logprobs=(-0.5, -0.25),
        reward=reward,
        metadata={"turns": (1,)},
    )


@attrs.frozen
class FakeResult:
    """Stands in for agentrl.rollout.RolloutResult (same attribute names)."""

    instance_id: str
    outcome: Outcome
    reward: float
    samples: tuple
    diff: str = "diff --git a/x b/x\n"
    agent_log: str = '{"type":"result"}\n'
    turns: int = 2
    sampled_tokens: int = 4
    timings: dict = attrs.Factory(lambda: {"agent": 1.5, "grade": 0.5})

    @property
    def remove_sample(self) -> bool:
        return not self.outcome.trainable

    def to_dict(self) -> dict:
        data = attrs.asdict(self, recurse=False)
        data.pop("samples")
        data["outcome"] = self.outcome
        return data


def fake_tasks(n: int) -> list[Task]:
    """``n`` small tasks named task-0, task-1, …"""
    return [Task(instance_id=f"task-{i}", problem_statement="fix it") for i in range(n)]
