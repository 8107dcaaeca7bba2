"""File primitives for the host's side of a directory the sandbox can write.

Everything is relative to a directory file descriptor the host opened itself, one name at
a time (never a path with a slash), and opened with ``O_NOFOLLOW|O_NONBLOCK|O_NOCTTY``:
a symbolic link is never followed, a FIFO never blocks, and only a regular file is read,
never more than a cap. A device node cannot appear there: the sandbox has no
``CAP_MKNOD``, and a hard link to one of its ``/dev`` nodes crosses mounts (``EXDEV``);
hard links can only name files the sandbox could write anyway. Removal never follows a
link either, and gives up (leaving the rest to the teardown, which removes the whole
area) after a bounded amount of work.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import time

from agentrl.sandboxes.base import cap_fd

__all__ = [
    "NotRegularFile",
    "open_dir_at",
    "open_regular_at",
    "read_bytes_at",
    "read_capped_at",
    "read_small_at",
    "remove_at",
    "remove_tree_at",
    "valid_name",
]

_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_NAME = re.compile(r"[0-9A-Za-z_-][0-9A-Za-z_.-]{0,127}")
#: How much work one ``remove_tree_at`` does before it leaves the rest to the teardown.
MAX_REMOVE_ENTRIES = 10_000
MAX_REMOVE_SECONDS = 1.0
MAX_REMOVE_DEPTH = 64


class NotRegularFile(OSError):
    """The name is there but is not a regular file (a link, a FIFO, a directory, ...)."""


def valid_name(name: str) -> bool:
    """A single plain path component the host itself chose (letters, digits, ``_.-``)."""
    return bool(_NAME.fullmatch(name)) and name not in (".", "..")


def _check(name: str) -> None:
    if not valid_name(name):
        raise ValueError(f"not a plain file name: {name!r}")


def open_dir_at(dir_fd: int, name: str) -> int:
    """Open the directory ``name`` in ``dir_fd``; a link or any non-directory raises."""
    _check(name)
    return os.open(name, _OPEN | os.O_DIRECTORY, dir_fd=dir_fd)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a regular file"


def open_regular_at(dir_fd: int, name: str) -> int | None:
    """A read-only descriptor on the regular file ``name`` in ``dir_fd``; None if missing.

    Raises ``NotRegularFile`` for anything else: a symbolic link (``ELOOP``: never
    followed), a FIFO (opened non-blocking, so it never waits for a writer), a directory.
    """
    _check(name)
    try:
        fd = os.open(name, _OPEN, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotRegularFile(errno.ELOOP, "a symbolic link", name) from None
        if exc.errno == errno.ENXIO:  # a unix socket
            raise NotRegularFile(errno.ENXIO, "a socket", name) from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotRegularFile(errno.EINVAL, _kind(mode), name)
    return fd


def read_small_at(dir_fd: int, name: str, limit: int = 64) -> bytes | None:
    """At most ``limit`` bytes of the regular file ``name``; None if missing or not regular."""
    try:
        fd = open_regular_at(dir_fd, name)
    except NotRegularFile:
        return None
    if fd is None:
        return None
    try:
        return os.pread(fd, limit, 0)
    finally:
        os.close(fd)


def read_capped_at(dir_fd: int, name: str, limit: int, *, what: str) -> str:
    """The file ``name`` decoded and capped like ``cap_output``; missing reads as "".

    Anything but a regular file reads as a visible marker, e.g.
    ``[agentrl: stdout was not a regular file]``.
    """
    try:
        fd = open_regular_at(dir_fd, name)
    except NotRegularFile as exc:
        return f"[agentrl: {what} was not a regular file ({exc.strerror})]\n"
    if fd is None:
        return ""
    try:
        return cap_fd(fd, limit)
    finally:
        os.close(fd)


def read_bytes_at(dir_fd: int, name: str, limit: int) -> bytes | None:
    """The whole regular file ``name``, or None if missing; raises ``OverflowError`` when it
    holds more than ``limit`` bytes, ``NotRegularFile`` when it is not a regular file."""
    fd = open_regular_at(dir_fd, name)
    if fd is None:
        return None
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise OverflowError(size)
        parts, offset = [], 0
        while offset <= limit:
            chunk = os.pread(fd, min(limit + 1 - offset, 1 << 20), offset)
            if not chunk:
                break
            parts.append(chunk)
            offset += len(chunk)
        if offset > limit:  # it grew while being read
            raise OverflowError(offset)
        return b"".join(parts)
    finally:
        os.close(fd)


def remove_at(dir_fd: int, name: str) -> bool:
    """Remove ``name`` in ``dir_fd`` whatever it is (a link itself, never its target);
    a directory through ``remove_tree_at``. False when some of it was left behind."""
    _check(name)
    try:
        os.unlink(name, dir_fd=dir_fd)
        return True
    except FileNotFoundError:
        return True
    except IsADirectoryError:
        return remove_tree_at(dir_fd, name)
    except OSError:
        return False


def remove_tree_at(
    dir_fd: int,
    name: str,
    *,
    max_entries: int = MAX_REMOVE_ENTRIES,
    max_seconds: float = MAX_REMOVE_SECONDS,
    max_depth: int = MAX_REMOVE_DEPTH,
) -> bool:
    """Remove the directory ``name`` in ``dir_fd`` and all in it, following no link.

    Bounded: after ``max_entries`` entries, ``max_seconds`` or ``max_depth`` levels it
    stops and returns False, leaving the rest (the whole area is removed at teardown).
    """
    deadline = time.monotonic() + max_seconds
    budget = max_entries
    try:
        root = open_dir_at(dir_fd, name)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    # Each frame: (its fd, its name, its parent's fd, subdirectories still to remove).
    frames: list[tuple[int, str, int, list[str] | None]] = [(root, name, dir_fd, None)]
    try:
        while frames:
            fd, own, parent, pending = frames[-1]
            if pending is None:
                pending = []
                with os.scandir(fd) as entries:
                    for entry in entries:
                        budget -= 1
                        if budget < 0 or time.monotonic() > deadline:
                            return False
                        if entry.is_dir(follow_symlinks=False):
                            pending.append(entry.name)
                        else:
                            with contextlib.suppress(FileNotFoundError):
                                os.unlink(entry.name, dir_fd=fd)
                frames[-1] = (fd, own, parent, pending)
            if pending:
                if len(frames) >= max_depth:
                    return False
                sub = pending.pop()
                try:
                    frames.append((open_dir_at(fd, sub), sub, fd, None))
                except FileNotFoundError:
                    pass
                except OSError:  # replaced by a file or a link meanwhile
                    with contextlib.suppress(OSError):
                        os.unlink(sub, dir_fd=fd)
                continue
            frames.pop()
            os.close(fd)
            os.rmdir(own, dir_fd=parent)
        return True
    except OSError:
        return False
    finally:
        for fd, *_ in frames:
            os.close(fd)
