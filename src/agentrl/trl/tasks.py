"""The ``write-file`` task family: create a file with an exact text, graded by ``eval_cmd``.

Rows are generated from a seed (``learn_rows(count, seed)``) in the ``scaleswe`` row shape:
the repository is a one-file directory (``task_repo``), the prompt names a file and its
exact text, and the grader's own command decides, in a fresh sandbox that receives only
the agent's diff: solved iff the file exists and its text (trailing newlines aside) is
exactly the one asked for. Nothing the agent prints reaches the grader. It is the task a
135M model turns in about a second through the ``tiny_agent`` harness, solved some of the
time at first, so GRPO has a signal from its first steps.

The prompt's form decides the base rate. SmolLM2-135M-Instruct with the harness's default
instruction, temperature 0.7, 40 tokens, 512 samples over 32 tasks (served by vLLM,
``/v1/chat/completions``): "Create the file NAME containing exactly this text: TEXT"
was solved 0.4–0.6% of the time; the field form used here ("Create this file:" then
``path:`` and ``content:`` lines) 4.1–6.4%.
"""

from __future__ import annotations

import pathlib
import random
import shlex
from typing import Any

__all__ = ["FAMILY", "learn_rows", "task_repo"]

#: The task family's name (every instance id starts with it).
FAMILY = "write-file"

_STEMS = (
    "notes", "todo", "hello", "greeting", "status", "answer", "message", "result",
    "summary", "color", "animal", "fruit", "city", "planet", "word", "name",
)  # fmt: skip
_EXTENSIONS = (".txt", ".md")
_WORDS = (
    "apple", "banana", "cherry", "river", "mountain", "ocean", "green", "blue", "red",
    "yellow", "tiger", "rabbit", "paris", "london", "tokyo", "mars", "venus", "hello",
    "world", "done", "ready", "sunny", "cloudy", "seven", "twelve", "coffee", "tea",
)  # fmt: skip

_README = "# scratch\n\nAn empty project: files are created here on request.\n"


def task_repo(root: str | pathlib.Path) -> pathlib.Path:
    """The tasks' repository (a README only), written under ``root`` once; its path."""
    repo = pathlib.Path(root) / "write-file-repo"
    readme = repo / "README.md"
    if not readme.is_file() or readme.read_text() != _README:
        repo.mkdir(parents=True, exist_ok=True)
        readme.write_text(_README)
    return repo


def _row(index: int, name: str, text: str, repo: pathlib.Path) -> dict[str, Any]:
    prompt = f"Create this file:\npath: {name}\ncontent: {text}"
    check = (
        f'test -f {shlex.quote(name)} && test "$(cat {shlex.quote(name)})" = {shlex.quote(text)}'
    )
    instance_id = f"{FAMILY}-{index:04d}"
    return {
        "prompt": prompt,
        "label": instance_id,
        "metadata": {
            "instance_id": instance_id,
            "problem_statement": prompt,
            "repo": str(repo),
            "workdir": "/workspace",
            "eval_cmd": check,
        },
    }


def learn_rows(count: int, *, seed: int, root: str | pathlib.Path) -> list[dict[str, Any]]:
    """``count`` distinct task rows drawn with ``seed`` (their repository under ``root``)."""
    rng = random.Random(seed)
    repo = task_repo(root)
    seen: set[str] = set()
    rows: list[dict[str, Any]] = []
    while len(rows) < count:
        name = rng.choice(_STEMS) + rng.choice(_EXTENSIONS)
        text = " ".join(rng.sample(_WORDS, rng.choice((1, 2))))
        if name in seen and len(seen) < len(_STEMS) * len(_EXTENSIONS):
            continue
        seen.add(name)
        rows.append(_row(len(rows), name, text, repo))
    return rows
