"""Task rows: slime's JSONL shape, protocol selection, loading, gold patches.

A row is one JSON object with ``prompt`` (a string or a chat message list), ``label`` and
``metadata``; the grading protocol (``scaleswe`` or ``swebench``) decides how ``metadata``
is read. The protocol is chosen per call, so training and evaluation may differ.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from agentrl import settings
from agentrl.types import Task

__all__ = [
    "AUTO_PROTOCOL",
    "DEFAULT_PROTOCOL",
    "TaskLoadError",
    "TaskRow",
    "detect_protocol",
    "gold_patch",
    "grader_for",
    "iter_rows",
    "load_tasks",
    "optional_str",
    "parse_common",
    "prompt_text",
    "require_mapping",
    "resolve_host_path",
    "select_protocol",
]

logger = logging.getLogger(__name__)

DEFAULT_PROTOCOL = "scaleswe"
#: Pseudo-protocol: choose ``swebench`` or ``scaleswe`` per row from the row's shape.
AUTO_PROTOCOL = "auto"

#: The setting read when no protocol is passed explicitly (its aliases: the older names).
_GRADER_SETTING = {False: "AGENTRL_TRAIN_GRADER", True: "AGENTRL_EVAL_GRADER"}


class TaskLoadError(ValueError):
    """A task file or one of its rows could not be read or parsed."""


def select_protocol(
    protocol: str | None = None,
    *,
    evaluation: bool = False,
    env: Mapping[str, str] | None = None,
    default: str = DEFAULT_PROTOCOL,
) -> str:
    """The grading protocol for one call: explicit, then environment, then ``default``.

    Training reads ``AGENTRL_TRAIN_GRADER``, then the older ``AGENTRL_TRAIN_PROTOCOL`` and
    slime's ``SWE_TRAIN_PROTOCOL``; evaluation reads ``AGENTRL_EVAL_GRADER``,
    ``AGENTRL_EVAL_PROTOCOL``, ``SWE_EVAL_PROTOCOL``. The environment is read on every call,
    never at import time.
    """
    if protocol:
        return protocol.strip()
    return settings.get(_GRADER_SETTING[bool(evaluation)], env, default=default)


def detect_protocol(row: Mapping[str, Any]) -> str:
    """``swebench`` for a row shaped like a SWE-bench instance, else ``scaleswe``.

    A SWE-bench row carries ``metadata.remote_env_info`` with a ``test_patch`` or an
    ``eval_script`` and none of scaleswe's grading fields (swepro, eval_cmd, f2p_script).
    """
    metadata = row.get("metadata")
    if not isinstance(metadata, Mapping):
        return DEFAULT_PROTOCOL
    remote = metadata.get("remote_env_info")
    if not isinstance(remote, Mapping):
        return DEFAULT_PROTOCOL
    scaleswe = metadata.get("swepro") or metadata.get("eval_cmd") or remote.get("f2p_script")
    if (remote.get("test_patch") or remote.get("eval_script")) and not scaleswe:
        return "swebench"
    return DEFAULT_PROTOCOL


def grader_for(protocol: str) -> Any:
    """The grader registered as ``protocol``, built with its defaults (``Grader.from_options``)."""
    from agentrl.plugins import get_grader

    return get_grader(protocol).from_options()


def prompt_text(prompt: Any) -> str:
    """The issue text of a slime prompt: a string, or the first user message's text."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        for message in prompt:
            if isinstance(message, Mapping) and message.get("role") == "user":
                return _flatten_content(message.get("content"))
    return ""


def _flatten_content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, Mapping) and isinstance(block.get("text"), str):
                parts.append(block["text"])
        return "\n".join(parts)
    return ""


def require_mapping(value: Any, field: str) -> Mapping[str, Any]:
    """``value`` as a mapping (``{}`` when absent); ``ValueError`` naming ``field`` otherwise."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{field} must be a JSON object, got {type(value).__name__}")
    return value


def optional_str(value: Any, field: str) -> str | None:
    """``value`` as a string (``None`` when absent or empty); ``ValueError`` naming ``field``."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError(f"{field} must be a string, got {type(value).__name__}")
    return value


def parse_common(row: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any], dict]:
    """``(metadata, remote_env_info, task metadata)`` shared by both row formats."""
    if not isinstance(row, Mapping):
        raise ValueError(f"a task row must be a JSON object, got {type(row).__name__}")
    metadata = require_mapping(row.get("metadata"), "metadata")
    remote = require_mapping(metadata.get("remote_env_info"), "metadata.remote_env_info")
    extra: dict[str, Any] = {}
    label = row.get("label")
    if isinstance(label, str) and label:
        extra["label"] = label
    gold = optional_str(metadata.get("gold_patch"), "metadata.gold_patch")
    if gold:
        extra["gold_patch"] = gold
    gold_path = optional_str(metadata.get("gold_patch_path"), "metadata.gold_patch_path")
    if gold_path:
        extra["gold_patch_path"] = gold_path
    return metadata, remote, extra


def resolve_host_path(value: str | None, base_dir: pathlib.Path | None) -> str | None:
    """``value`` made absolute against ``base_dir`` when it is a relative host path."""
    if not value or base_dir is None:
        return value
    path = pathlib.Path(value).expanduser()
    if path.is_absolute():
        return str(path)
    return str((base_dir / path).resolve())


def gold_patch(task: Task) -> str | None:
    """The reference fix of ``task`` (inline, or read from ``gold_patch_path``), if any."""
    inline = task.metadata.get("gold_patch")
    if isinstance(inline, str) and inline:
        return inline
    path = task.metadata.get("gold_patch_path")
    if isinstance(path, str) and path:
        try:
            return pathlib.Path(path).read_text()
        except OSError as exc:
            raise TaskLoadError(
                f"task {task.instance_id}: cannot read its gold patch {path}: {exc}; "
                "fix metadata.gold_patch_path (relative paths resolve against the JSONL file)"
            ) from exc
    return None


@attrs.frozen(kw_only=True)
class TaskRow:
    """One parsed row with where it came from."""

    source: str
    line: int
    task: Task


def iter_rows(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, row)`` for every non-blank line of a JSONL file."""
    file = pathlib.Path(path)
    try:
        handle = file.open(encoding="utf-8")
    except OSError as exc:
        raise TaskLoadError(f"cannot open task file {file}: {exc}") from exc
    with handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise TaskLoadError(
                    f"{file}:{number}: not valid JSON ({exc.msg} at column {exc.colno}); "
                    "each line must be one JSON object"
                ) from exc
            if not isinstance(row, dict):
                raise TaskLoadError(
                    f"{file}:{number}: expected a JSON object with prompt/label/metadata, "
                    f"got {type(row).__name__}"
                )
            yield number, row


def load_tasks(
    path: str | os.PathLike[str],
    *,
    protocol: str | None = None,
    evaluation: bool = False,
    grader: Any | None = None,
) -> list[TaskRow]:
    """Parse every row of a JSONL task file with the selected protocol's grader.

    ``grader`` (an instance) wins over ``protocol``; protocol ``auto`` picks a grader per
    row with ``detect_protocol``. Relative host paths in a row (``metadata.repo``, swepro
    scripts, gold patches) are resolved against the JSONL file's directory.
    """
    file = pathlib.Path(path)
    graders: dict[str, Any] = {}
    chosen = grader.name if grader is not None else select_protocol(protocol, evaluation=evaluation)
    if grader is not None:
        graders[chosen] = grader
    base_dir = file.resolve().parent
    rows = []
    for number, row in iter_rows(file):
        name = detect_protocol(row) if chosen == AUTO_PROTOCOL else chosen
        if name not in graders:
            graders[name] = grader_for(name)
        row_grader = graders[name]
        try:
            task = row_grader.resolve_paths(row_grader.parse_task(row), base_dir)
        except (ValueError, TypeError, KeyError) as exc:
            raise TaskLoadError(f"{file}:{number}: {exc}") from exc
        rows.append(TaskRow(source=str(file), line=number, task=task))
    logger.info("loaded %d tasks from %s (protocol %s)", len(rows), file, chosen)
    return rows
