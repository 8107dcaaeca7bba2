"""Bounded, confined reads of an output directory that a hostile policy's session wrote.

Nothing here follows a path a row names: a rollout's files are found from its key by the
runner's own naming rule (``diffs/STEM.diff``, ``agent_logs/STEM.log``,
``sessions/STEM.json``), and a name that would leave its folder (a ``/``, a ``..``, a
symlink out) is refused. Every read is capped: the head of a diff, the tail of a log.
"""

from __future__ import annotations

import logging
import os
import pathlib
import re
from collections.abc import Iterator
from typing import Any

import attrs

from agentrl import jsonio
from agentrl.rollout.runner import (
    DIFF_SUFFIX,
    DIFFS_DIR,
    LOG_SUFFIX,
    LOGS_DIR,
    SESSION_SUFFIX,
    SESSIONS_DIR,
)

__all__ = [
    "MAX_DIFF_BYTES",
    "MAX_LINE_BYTES",
    "MAX_LOG_TAIL_BYTES",
    "Capped",
    "JsonlTail",
    "confined",
    "iter_jsonl",
    "parse_line",
    "read_head",
    "read_json",
    "read_line_at",
    "read_tail",
    "rollout_file",
    "rollout_stem",
]

logger = logging.getLogger(__name__)

MAX_DIFF_BYTES = 512 * 1024
MAX_LOG_TAIL_BYTES = 64 * 1024
MAX_TEXT_BYTES = 64 * 1024
MAX_SESSION_BYTES = 32 * 1024 * 1024
#: A JSONL line longer than this is skipped (a 128k-token sample is about 2 MB).
MAX_LINE_BYTES = 256 * 1024 * 1024

_STEM = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,254}")
_KINDS = {
    "diff": (DIFFS_DIR, DIFF_SUFFIX),
    "log": (LOGS_DIR, LOG_SUFFIX),
    "session": (SESSIONS_DIR, SESSION_SUFFIX),
}


@attrs.frozen(kw_only=True)
class Capped:
    """Text read under a cap: what was read, the file's size, and whether some was left out."""

    text: str
    size: int
    truncated: bool

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "size": self.size, "truncated": self.truncated}


def rollout_stem(key: Any, attempt: Any = 1) -> str | None:
    """The runner's file stem of a rollout (``KEY`` with ``#`` as ``__``, ``.attempt-N``
    after the first attempt), or None when the key could name anything but a plain file."""
    if not isinstance(key, str):
        return None
    stem = key.replace("#", "__")
    if isinstance(attempt, int) and not isinstance(attempt, bool) and attempt > 1:
        stem += f".attempt-{attempt}"
    if not _STEM.fullmatch(stem) or ".." in stem:
        return None
    return stem


def confined(root: pathlib.Path, relative: str) -> pathlib.Path | None:
    """``root / relative`` when it is a regular file inside ``root`` (symlinks resolved)."""
    try:
        base = root.resolve(strict=True)
        path = (base / relative).resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    if not path.is_relative_to(base) or not path.is_file():
        return None
    return path


def rollout_file(root: pathlib.Path, kind: str, key: Any, attempt: Any = 1) -> pathlib.Path | None:
    """The ``kind`` file (``diff``, ``log``, ``session``) of a rollout, if there is one."""
    stem = rollout_stem(key, attempt)
    if stem is None:
        return None
    folder, suffix = _KINDS[kind]
    path = confined(root, f"{folder}/{stem}{suffix}")
    if path is None or path.parent != (root.resolve() / folder):
        return None
    return path


def _decode(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def read_head(path: pathlib.Path | None, limit: int = MAX_DIFF_BYTES) -> Capped | None:
    """The first ``limit`` bytes of ``path`` as text (None when there is no file)."""
    if path is None:
        return None
    try:
        with path.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            data = fh.read(limit)
    except OSError:
        return None
    return Capped(text=_decode(data), size=size, truncated=size > len(data))


def read_tail(path: pathlib.Path | None, limit: int = MAX_LOG_TAIL_BYTES) -> Capped | None:
    """The last ``limit`` bytes of ``path`` as text (None when there is no file)."""
    if path is None:
        return None
    try:
        with path.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            fh.seek(max(0, size - limit))
            data = fh.read(limit)
    except OSError:
        return None
    return Capped(text=_decode(data), size=size, truncated=size > len(data))


def read_json(path: pathlib.Path | None, limit: int = MAX_SESSION_BYTES) -> Any:
    """The JSON value in ``path``, or None when it is missing, too big or not JSON."""
    if path is None:
        return None
    try:
        if path.stat().st_size > limit:
            logger.warning("%s: over %d bytes; not read", path, limit)
            return None
        return jsonio.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None


def iter_jsonl(path: pathlib.Path | None) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(byte offset, row)`` for every readable JSON object line of ``path``.

    Torn lines, non-objects and lines over :data:`MAX_LINE_BYTES` are skipped.
    """
    if path is None or not path.is_file():
        return
    with path.open("rb") as fh:
        offset = 0
        while True:
            line = fh.readline(MAX_LINE_BYTES + 1)
            if not line:
                return
            start, offset = offset, offset + len(line)
            if len(line) > MAX_LINE_BYTES:
                while line and not line.endswith(b"\n"):  # skip the rest of the long line
                    line = fh.readline(MAX_LINE_BYTES)
                    offset += len(line)
                continue
            row = parse_line(line)
            if row is not None:
                yield start, row


def parse_line(line: bytes) -> dict[str, Any] | None:
    """One JSONL line as a dict, or None."""
    try:
        row = jsonio.loads(line)
    except (ValueError, RecursionError):
        return None
    return row if isinstance(row, dict) else None


def read_line_at(path: pathlib.Path, offset: int) -> dict[str, Any] | None:
    """The JSON object on the line starting at byte ``offset`` of ``path``."""
    with path.open("rb") as fh:
        fh.seek(offset)
        return parse_line(fh.readline(MAX_LINE_BYTES))


@attrs.define
class JsonlTail:
    """The complete lines appended to ``root / name`` since the last :meth:`lines`.

    A run in progress appends to its JSONL files: :meth:`lines` streams the lines finished
    since the last call and leaves a partly written last line for the next. When the file
    was replaced (a resumed run rewrites it), got shorter or went away, :meth:`replaced`
    says so and :meth:`rewind` starts over. The file is found again on each call (confined
    to ``root``), so it may appear later.
    """

    root: pathlib.Path
    name: str
    offset: int = 0
    #: ``(st_dev, st_ino)`` of the file the lines came from; None before the first read.
    identity: tuple[int, int] | None = None
    _moved: bool = False

    def replaced(self) -> bool:
        """Whether the file is no longer the one the lines so far came from."""
        if self._moved:
            return True
        if self.identity is None:
            return False
        path = confined(self.root, self.name)
        if path is None:
            return True
        try:
            stat = path.stat()
        except OSError:
            return False
        return (stat.st_dev, stat.st_ino) != self.identity or stat.st_size < self.offset

    def rewind(self) -> None:
        """Read the file from its start next time."""
        self.offset, self.identity, self._moved = 0, None, False

    def lines(self) -> Iterator[tuple[int, bytes]]:
        """``(byte offset, line)`` for each complete line after the last one read."""
        path = confined(self.root, self.name)
        if path is None:
            return
        try:
            fh = path.open("rb")
        except OSError:
            return
        with fh:
            stat = os.fstat(fh.fileno())
            identity = (stat.st_dev, stat.st_ino)
            if self.identity is not None and identity != self.identity:
                self._moved = True  # replaced since replaced() looked: the next call starts over
                return
            self.identity = identity
            fh.seek(self.offset)
            while True:
                line = fh.readline(MAX_LINE_BYTES + 1)
                if line.endswith(b"\n"):
                    start, self.offset = self.offset, self.offset + len(line)
                    yield start, line
                elif len(line) <= MAX_LINE_BYTES:
                    return  # the end of the file, or a line still being written
                else:
                    while line and not line.endswith(b"\n"):  # skip the rest of a long line
                        line = fh.readline(MAX_LINE_BYTES)
                    if not line:
                        return
                    self.offset = fh.tell()
