"""Task rows: slime's JSONL shape, grader selection, loading, gold patches.

A row is one JSON object with ``prompt`` (a string or a chat message list), ``label`` and
``metadata``; the grader (``scaleswe``, ``swebench`` or a plugin's) decides how
``metadata`` is read. The grader is chosen per call, so training and evaluation may
differ; ``auto`` asks the registered graders which of them claims each row.

``select_protocol``, ``detect_protocol``, ``DEFAULT_PROTOCOL``, ``AUTO_PROTOCOL`` and
``load_tasks(protocol=...)`` are the deprecated names of ``select_grader``,
``detect_grader``, ``DEFAULT_GRADER``, ``AUTO_GRADER`` and ``load_tasks(grader=...)``.
"""

from __future__ import annotations

import logging
import os
import pathlib
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from agentrl import jsonio, settings
from agentrl.graders.base import resolve_host_path
from agentrl.types import DEFAULT_GRADER, Task

if TYPE_CHECKING:
    from agentrl.graders.base import Grader

__all__ = [
    "AUTO_GRADER",
    "AUTO_PROTOCOL",
    "DEFAULT_GRADER",
    "DEFAULT_PROTOCOL",
    "TaskLoadError",
    "TaskRow",
    "detect_grader",
    "detect_protocol",
    "duplicate_ids",
    "gold_patch",
    "iter_rows",
    "load_task_files",
    "load_tasks",
    "make_grader",
    "optional_str",
    "parse_common",
    "prompt_text",
    "refuse_duplicates",
    "require_mapping",
    "resolve_host_path",
    "select_grader",
    "select_protocol",
]

logger = logging.getLogger(__name__)

#: Pseudo-grader: choose a grader per row, the first registered one that claims it.
AUTO_GRADER = "auto"
#: Deprecated names of ``DEFAULT_GRADER`` and ``AUTO_GRADER``.
DEFAULT_PROTOCOL = DEFAULT_GRADER
AUTO_PROTOCOL = AUTO_GRADER

#: The setting read when no protocol is passed explicitly (its aliases: the older names).
_GRADER_SETTING = {False: "AGENTRL_TRAIN_GRADER", True: "AGENTRL_EVAL_GRADER"}


class TaskLoadError(ValueError):
    """A task file or one of its rows could not be read or parsed."""


def select_grader(
    grader: str | None = None,
    *,
    evaluation: bool = False,
    env: Mapping[str, str] | None = None,
    default: str = DEFAULT_GRADER,
) -> str:
    """The grader name for one call: explicit, then environment, then ``default``.

    Training reads ``AGENTRL_TRAIN_GRADER``, then the older ``AGENTRL_TRAIN_PROTOCOL`` and
    slime's ``SWE_TRAIN_PROTOCOL``; evaluation reads ``AGENTRL_EVAL_GRADER``,
    ``AGENTRL_EVAL_PROTOCOL``, ``SWE_EVAL_PROTOCOL``. The environment is read on every call,
    never at import time.
    """
    if grader:
        return grader.strip()
    return settings.get(_GRADER_SETTING[bool(evaluation)], env, default=default)


def detect_grader(row: Mapping[str, Any]) -> str:
    """The name of the first registered grader that claims ``row`` (``Grader.claims``).

    Plugins' graders are asked before the built-ins; a row nobody claims goes to
    ``DEFAULT_GRADER`` (scaleswe), whose ``check`` says what the row lacks.
    """
    from agentrl.plugins import get_graders

    for cls in get_graders():
        claims = getattr(cls, "claims", None)
        if claims is not None and claims(row):
            return cls.name
    return DEFAULT_GRADER


def make_grader(name: str, *, timeout: float | None = None) -> Grader:
    """The grader registered as ``name``, given a grading budget (``Grader.from_options``).

    ``timeout`` None leaves the grader's own default. Every caller that builds a grader
    by name (``load_tasks``, the rollout stack, ``agentrl check-tasks``) comes here.
    """
    from agentrl.plugins import get_grader

    return get_grader(name).from_options(timeout=timeout)


def select_protocol(
    protocol: str | None = None,
    *,
    evaluation: bool = False,
    env: Mapping[str, str] | None = None,
    default: str = DEFAULT_GRADER,
) -> str:
    """Deprecated: ``select_grader``."""
    warnings.warn(
        "select_protocol is deprecated; use select_grader", DeprecationWarning, stacklevel=2
    )
    return select_grader(protocol, evaluation=evaluation, env=env, default=default)


def detect_protocol(row: Mapping[str, Any]) -> str:
    """Deprecated: ``detect_grader``."""
    warnings.warn(
        "detect_protocol is deprecated; use detect_grader", DeprecationWarning, stacklevel=2
    )
    return detect_grader(row)


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
    allow = metadata.get("guard_allow")
    if allow not in (None, [], ()):
        if not isinstance(allow, (list, tuple)) or not all(isinstance(a, str) for a in allow):
            raise ValueError(
                f"metadata.guard_allow must be a list of guard pattern names, got {allow!r:.80}"
            )
        extra["guard_allow"] = list(allow)
    return metadata, remote, extra


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
    """``(line number, row)`` for every non-blank line of a JSONL file.

    A line that is not JSON is reported at its line and column in the file (a UTF-8
    byte-order mark opening the file is skipped, as editors write one).
    """
    file = pathlib.Path(path)
    try:
        handle = file.open(encoding="utf-8-sig")
    except OSError as exc:
        raise TaskLoadError(f"cannot open task file {file}: {exc}") from exc
    with handle:
        try:
            for number, raw in enumerate(handle, start=1):
                if not raw.strip():
                    continue
                try:
                    row = jsonio.loads_line(raw)
                except jsonio.JSONLineError as exc:
                    raise TaskLoadError(
                        f"{file}:{number}:{exc.column}: not valid JSON ({exc.msg}); "
                        "each line must be one JSON object"
                    ) from None
                if not isinstance(row, dict):
                    raise TaskLoadError(
                        f"{file}:{number}: expected a JSON object with prompt/label/metadata, "
                        f"got {type(row).__name__}"
                    )
                yield number, row
        except UnicodeDecodeError as exc:
            raise TaskLoadError(
                f"{file} is not UTF-8 text ({exc.reason} at byte {exc.start} of a read "
                "block); save the task file as UTF-8 JSONL"
            ) from None


def duplicate_ids(rows: Iterable[TaskRow]) -> dict[str, list[TaskRow]]:
    """The instance ids that more than one of ``rows`` has, each with all its rows."""
    seen: dict[str, list[TaskRow]] = {}
    for row in rows:
        seen.setdefault(row.task.instance_id, []).append(row)
    return {key: found for key, found in seen.items() if len(found) > 1}


def refuse_duplicates(rows: Sequence[TaskRow]) -> None:
    """Raise :class:`TaskLoadError` naming every instance id that several rows share.

    A rollout directory keys its ``rollouts.jsonl`` lines by instance id, so two tasks with
    one id would write two lines for one key (and resume one of them as the other).
    """
    duplicates = duplicate_ids(rows)
    if not duplicates:
        return
    listed = "; ".join(
        f"{key!r} at {', '.join(f'{r.source}:{r.line}' for r in found)}"
        for key, found in list(duplicates.items())[:10]
    )
    more = f" (and {len(duplicates) - 10} more)" if len(duplicates) > 10 else ""
    raise TaskLoadError(
        f"{len(duplicates)} instance ids appear more than once: {listed}{more}; each task "
        "needs its own instance id (remove the repeated rows, or re-import with "
        "`agentrl tasks import --dedupe`)"
    )


def load_tasks(
    path: str | os.PathLike[str],
    *,
    grader: str | Grader | None = None,
    evaluation: bool = False,
    protocol: str | None = None,
) -> list[TaskRow]:
    """Parse every row of a JSONL task file with the selected grader.

    ``grader`` is a grader instance or a name (``select_grader`` fills in a missing one);
    ``auto`` picks a grader per row with ``detect_grader``. ``protocol`` is the deprecated
    name of ``grader``. Relative host paths in a row (``metadata.repo``, swepro scripts,
    gold patches) are resolved against the JSONL file's directory.

    A file with no row, or with two rows of one instance id, raises :class:`TaskLoadError`
    (the duplicates named with their line numbers).
    """
    if protocol is not None:
        warnings.warn(
            "load_tasks(protocol=...) is deprecated; pass grader=...",
            DeprecationWarning,
            stacklevel=2,
        )
        grader = grader or protocol
    file = pathlib.Path(path)
    graders: dict[str, Grader] = {}
    if grader is None or isinstance(grader, str):
        chosen = select_grader(grader, evaluation=evaluation)
    else:
        chosen = grader.name
        graders[chosen] = grader
    base_dir = file.resolve().parent
    rows = []
    for number, row in iter_rows(file):
        name = detect_grader(row) if chosen == AUTO_GRADER else chosen
        if name not in graders:
            graders[name] = make_grader(name)
        row_grader = graders[name]
        try:
            task = row_grader.resolve_paths(row_grader.parse_task(row), base_dir)
        except (ValueError, TypeError, KeyError) as exc:
            raise TaskLoadError(f"{file}:{number}: {exc}") from exc
        rows.append(TaskRow(source=str(file), line=number, task=task))
    if not rows:
        raise TaskLoadError(
            f"no tasks in {file}: the file holds no row; expected one JSON object per line "
            "(make one with `agentrl tasks import`)"
        )
    refuse_duplicates(rows)
    logger.info("loaded %d tasks from %s (grader %s)", len(rows), file, chosen)
    return rows


def load_task_files(
    paths: Iterable[str | os.PathLike[str]],
    *,
    grader: str | Grader | None = None,
    evaluation: bool = False,
) -> list[TaskRow]:
    """:func:`load_tasks` of every file in ``paths``, refusing an instance id two files share."""
    rows = [row for path in paths for row in load_tasks(path, grader=grader, evaluation=evaluation)]
    refuse_duplicates(rows)
    return rows
