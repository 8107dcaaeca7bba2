"""What ``agentrl view`` reads: an ``agentrl rollout`` output directory, the samples
JSONL ``agentrl serve --output`` writes, or slime's ``--save-debug-rollout-data`` files
(:mod:`~agentrl.view.slime_dump`), as the run page's and rollout pages' data.

::

    source = RunSource.open("runs/demo")
    source.run_data()                 # the run page: rows and numbers
    source.rollout_data("textstats-1#0")  # one rollout: task, diff, grade, session, tokens

A rollout is looked up by its key among the rows read at open; a key that names no row
is None, whatever it holds. Sample rows are indexed by key (byte offsets) at open and
read only when their rollout is asked for.
"""

from __future__ import annotations

import json
import logging
import pathlib
import re
import threading
from collections.abc import Mapping
from typing import Any

import attrs

from agentrl.rollout.runner import FAILED_FILE, ROLLOUTS_FILE, SAMPLES_FILE, SUMMARY_FILE
from agentrl.view import files
from agentrl.view.model import overview, rollout_summary, text
from agentrl.view.session import CLASS_CODES, build_session
from agentrl.view.tokens import TokenText, load_token_text

__all__ = ["RunSource", "ViewError"]

logger = logging.getLogger(__name__)

_KEY_PREFIX = re.compile(rb'^\{"(key|session)": ("(?:[^"\\]|\\.){0,1000}")')
MAX_PROBLEM_CHARS = 64 * 1024


class ViewError(RuntimeError):
    """The path is not something ``agentrl view`` can show."""


def _line_key(line: bytes, field: str) -> str | None:
    match = _KEY_PREFIX.match(line)
    if match and match.group(1).decode() == field:
        try:
            value = json.loads(match.group(2))
        except ValueError:
            value = None
        return value if isinstance(value, str) else None
    row = files.parse_line(line)
    value = row.get(field) if row else None
    return value if isinstance(value, str) else None


@attrs.define(kw_only=True, eq=False)
class RunSource:
    """One run on disk: its rows, its sample index and its tokenizer."""

    root: pathlib.Path
    #: ``rollout`` (an output directory), ``serve`` (a samples JSONL file) or ``slime``.
    kind: str
    samples_path: pathlib.Path | None
    rows: list[dict[str, Any]] = attrs.field(factory=list)
    earlier: list[dict[str, Any]] = attrs.field(factory=list)
    summary: dict[str, Any] = attrs.field(factory=dict)
    offsets: dict[str, list[int]] = attrs.field(factory=dict)
    #: Sample rows held in memory, by key (a slime dump has no line offsets).
    memory: dict[str, list[dict[str, Any]]] = attrs.field(factory=dict)
    token_text: TokenText = attrs.field(factory=TokenText)
    tokenizer_name: str | None = None
    #: Counts up each time the run's files were rewritten and read again from the start.
    generation: int = 0
    _samples_tail: files.JsonlTail | None = None
    _rollouts_tail: files.JsonlTail | None = None
    _position: dict[str, int] = attrs.field(factory=dict)
    _bare: set[str] = attrs.field(factory=set)
    _lock: threading.RLock = attrs.field(factory=threading.RLock)

    @classmethod
    def open(cls, path: str | pathlib.Path, tokenizer: str | None = None) -> RunSource:
        """Read ``path``'s rows and index its samples; load ``tokenizer`` (or the run's)."""
        path = pathlib.Path(path)
        if path.suffix == ".pt" or (
            path.is_dir() and not (path / ROLLOUTS_FILE).exists() and any(path.glob("*.pt"))
        ):
            source = cls._slime(path)
        elif path.is_dir():
            source = cls._directory(path)
        elif path.is_file():
            source = cls._serve_file(path)
        else:
            raise ViewError(f"{path}: no such directory or file")
        name = tokenizer or source.tokenizer_name
        source.tokenizer_name = name
        source.token_text = load_token_text(name)
        return source

    @classmethod
    def _directory(cls, root: pathlib.Path) -> RunSource:
        if not (root / ROLLOUTS_FILE).is_file() and not (root / SAMPLES_FILE).is_file():
            raise ViewError(
                f"{root}: not an agentrl rollout output directory (no {ROLLOUTS_FILE} or "
                f"{SAMPLES_FILE})"
            )
        summary = files.read_json(files.confined(root, SUMMARY_FILE), limit=1 << 20)
        summary = summary if isinstance(summary, dict) else {}
        source = cls(
            root=root,
            kind="rollout",
            samples_path=files.confined(root, SAMPLES_FILE),
            summary=summary,
            tokenizer_name=text(summary.get("tokenizer"), 4096),
        )
        source._samples_tail = files.JsonlTail(root, SAMPLES_FILE)
        source._rollouts_tail = files.JsonlTail(root, ROLLOUTS_FILE)
        for _, row in files.iter_jsonl(files.confined(root, FAILED_FILE)):
            source.earlier.append(rollout_summary(row))
        source.refresh()
        return source

    @classmethod
    def _slime(cls, path: pathlib.Path) -> RunSource:
        from agentrl.view.slime_dump import SlimeDumpError, load_dumps

        try:
            rows, samples = load_dumps(path)
        except SlimeDumpError as exc:
            raise ViewError(str(exc)) from None
        root = path if path.is_dir() else path.parent
        return cls(root=root, kind="slime", samples_path=None, rows=rows, memory=samples)

    @classmethod
    def _serve_file(cls, path: pathlib.Path) -> RunSource:
        source = cls(root=path.parent, kind="serve", samples_path=path)
        source._samples_tail = files.JsonlTail(path.parent, path.name)
        source.refresh()
        return source

    # -- following a run in progress ---------------------------------------
    def refresh(self) -> bool:
        """Read what was appended since the last read; True when the rows changed.

        The new rows are read before the samples (the runner writes a rollout's samples
        before its ``rollouts.jsonl`` line, so a row read has its samples indexed); a
        partly written last line waits for the next call. A
        file that was rewritten (a resumed run) is read again from its start, and
        :attr:`generation` counts up so a page knows to start over.
        """
        with self._lock:
            before = (self.generation, len(self.rows))
            tails = [t for t in (self._rollouts_tail, self._samples_tail) if t is not None]
            if any(tail.replaced() for tail in tails):
                self._start_over()
                for tail in tails:
                    tail.rewind()
            # The rows first: a row read now has its samples in the file already.
            row_lines = list(self._rollouts_tail.lines()) if self._rollouts_tail else []
            if self._samples_tail is not None:
                field = "session" if self.kind == "serve" else "key"
                for offset, line in self._samples_tail.lines():  # streamed: it may be GBs
                    key = _line_key(line, field)
                    if key is not None:
                        if key not in self.offsets and self._bare_rows():
                            self._add(_bare_row(key), bare=True)
                        self.offsets.setdefault(key, []).append(offset)
                if self._samples_tail.identity is not None:
                    self.samples_path = files.confined(
                        self._samples_tail.root, self._samples_tail.name
                    )
            for _, line in row_lines:
                row = files.parse_line(line)
                if row is not None:
                    self._add(rollout_summary(row), bare=False)
            return (self.generation, len(self.rows)) != before or bool(row_lines)

    def _bare_rows(self) -> bool:
        """Whether sample keys make the rows: a serve file, or a directory without rows."""
        return self.kind == "serve" or (
            self._rollouts_tail is not None and self._rollouts_tail.identity is None
        )

    def _add(self, row: dict[str, Any], *, bare: bool) -> None:
        key = row["key"]
        if not key:
            return
        if key in self._position:
            if key in self._bare and not bare:  # the rollout's line came after its samples
                self._bare.discard(key)
                self.rows[self._position[key]] = row
            return
        self._position[key] = len(self.rows)
        self.rows.append(row)
        if bare:
            self._bare.add(key)

    def _start_over(self) -> None:
        self.rows, self.offsets = [], {}
        self._position, self._bare = {}, set()
        self.generation += 1

    # -- the pages' data ----------------------------------------------------
    def run_data(self) -> dict[str, Any]:
        """The run page: every rollout's row and the run's numbers."""
        with self._lock:
            rows = list(self.rows)
        return {
            "kind": self.kind,
            "title": self.samples_path.name
            if self.kind == "serve" and self.samples_path is not None
            else self.root.name,
            "tokenizer": self.tokenizer_name,
            "decoded": self.token_text.decodes,
            "classes": CLASS_CODES,
            "summary": self.summary,
            "generation": self.generation,
            "rollouts": rows,
            "earlier": self.earlier,
            "overview": overview(rows, self.earlier),
        }

    def row(self, key: Any) -> dict[str, Any] | None:
        """The run's row of ``key``, or None."""
        if not isinstance(key, str):
            return None
        with self._lock:
            if self._position:
                position = self._position.get(key)
                return self.rows[position] if position is not None else None
            return next((row for row in self.rows if row["key"] == key), None)

    def samples(self, key: str) -> list[dict[str, Any]]:
        """The sample rows of ``key``, in file order."""
        if key in self.memory:
            return self.memory[key]
        if self.samples_path is None:
            return []
        with self._lock:
            offsets = list(self.offsets.get(key, []))
        found = []
        for offset in offsets:
            row = files.read_line_at(self.samples_path, offset)
            if row is not None:
                found.append(row)
        return found

    def rollout_data(self, key: Any) -> dict[str, Any] | None:
        """One rollout's page: task, diff, grade, log tail, session tree, tokens."""
        row = self.row(key)
        if row is None:
            return None
        session_file = None
        diff = log = None
        if self.kind == "rollout":
            attempt = row["attempt"] or 1
            session_file = files.read_json(files.rollout_file(self.root, "session", key, attempt))
            diff = files.read_head(files.rollout_file(self.root, "diff", key, attempt))
            log = files.read_tail(files.rollout_file(self.root, "log", key, attempt))
        session = build_session(self.samples(key), session_file)
        ids = [i for sample in session["samples"] for i in sample["tokens"]]
        return {
            "key": key,
            "row": row,
            "task": _task(session_file, row),
            "diff": diff.to_dict() if diff else None,
            "log": log.to_dict() if log else None,
            "session": session,
            "vocab": self.token_text.vocab(ids),
            "decoded": self.token_text.decodes,
        }

    def export_data(self) -> dict[str, Any]:
        """Everything, for the single-file export: the run and every rollout."""
        data = self.run_data()
        data["details"] = {row["key"]: self.rollout_data(row["key"]) for row in self.rows}
        return data


def _bare_row(key: str) -> dict[str, Any]:
    return rollout_summary({"key": key, "instance_id": key})


def _task(session: Any, row: Mapping[str, Any]) -> dict[str, Any]:
    task = session.get("task") if isinstance(session, Mapping) else None
    task = task if isinstance(task, Mapping) else {}
    return {
        "instance_id": text(task.get("instance_id"), 500) or row["instance_id"],
        "problem_statement": text(task.get("problem_statement"), MAX_PROBLEM_CHARS),
        "repo": text(task.get("repo"), 500),
        "grader": text(task.get("grader"), 100),
    }
