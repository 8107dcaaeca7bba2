"""Host-side process plumbing for the ``local`` sandbox: notifications, cleanup, staging."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pathlib
import shlex
import shutil
import signal
import time
from collections.abc import Callable, Iterable, Mapping

from agentrl.sandboxes.base import SandboxError

logger = logging.getLogger(__name__)

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: State directories and cgroups are named ``agentrl-local-<owner pid>-<random>``.
STATE_PREFIX = "agentrl-local-"


class DoneChannel:
    """The FIFO the sandbox writes one name per line to ("ready", a request id) when done.

    The host holds it open read-write for the sandbox's life, so a writer inside never
    blocks, and reads it from the event loop; waiters get an ``asyncio.Event`` per name.
    Any process in the sandbox can write to it, so reading is bounded: at most
    ``READ_CHUNK`` bytes per wake-up, a line over ``MAX_LINE`` bytes (or an endless one) is
    dropped, and after ``FLOOD_BYTES`` bytes of lines naming nothing awaited within one
    second, reading stops for ``FLOOD_PAUSE`` seconds. A notification lost that way only
    costs latency: every waiter re-checks its state at least every 0.1 s.
    """

    READ_CHUNK = 16384
    MAX_LINE = 256
    FLOOD_BYTES = 65536
    FLOOD_PAUSE = 1.0

    def __init__(self, path: pathlib.Path) -> None:
        os.mkfifo(path, 0o600)
        self.fd: int | None = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        self._events: dict[str, asyncio.Event] = {}
        #: What an awaited name's line carried after a space (at most ``MAX_LINE`` bytes).
        self._values: dict[str, str] = {}
        self._partial = b""
        self._skipping = False
        self._window = (0.0, 0)  # (its start, bytes of unknown names in it)
        self._resume: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def attach(self) -> None:
        """Start reading on the running event loop."""
        assert self.fd is not None
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.fd, self._readable)

    def event(self, name: str) -> asyncio.Event:
        """The event set when ``name`` is announced (create it before asking for ``name``)."""
        return self._events.setdefault(name, asyncio.Event())

    def forget(self, name: str) -> None:
        self._events.pop(name, None)
        self._values.pop(name, None)

    def value(self, name: str) -> str | None:
        """What the announcement of ``name`` carried after it (``ID RC``: the exit code)."""
        return self._values.get(name)

    async def wait(self, name: str, timeout: float) -> None:
        """Wait until ``name`` is announced or ``timeout`` passes (callers re-check state)."""
        event = self.event(name)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)
        event.clear()

    def _readable(self) -> None:
        assert self.fd is not None
        try:
            data = os.read(self.fd, self.READ_CHUNK)
        except OSError:
            return
        *lines, rest = (self._partial + data).split(b"\n")
        unknown = 0
        for line in lines:
            if self._skipping:  # the end of a line that was too long
                self._skipping = False
                unknown += len(line) + 1
                continue
            event = None
            if len(line) <= self.MAX_LINE:
                name, _, value = line.strip().decode("ascii", errors="replace").partition(" ")
                event = self._events.get(name)
            if event is None:
                unknown += len(line) + 1
            else:
                if value:
                    self._values[name] = value
                event.set()
        if len(rest) > self.MAX_LINE:
            unknown += len(rest)
            rest, self._skipping = b"", True
        self._partial = rest
        self._count_unknown(unknown)

    def _count_unknown(self, unknown: int) -> None:
        """Stop reading for ``FLOOD_PAUSE`` s after ``FLOOD_BYTES`` unknown bytes in 1 s."""
        now = time.monotonic()
        start, count = self._window
        if now - start > 1.0:
            start, count = now, 0
        self._window = (start, count + unknown)
        if count + unknown > self.FLOOD_BYTES and self._loop is not None and self.fd is not None:
            logger.warning("local sandbox: its completion FIFO is flooded; pausing reads")
            self._loop.remove_reader(self.fd)
            self._resume = self._loop.call_later(self.FLOOD_PAUSE, self._unpause)

    def _unpause(self) -> None:
        self._resume = None
        self._window = (time.monotonic(), 0)
        if self._loop is not None and self.fd is not None:
            self._loop.add_reader(self.fd, self._readable)

    def close(self) -> None:
        if self.fd is None:
            return
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self.fd)
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.fd = None


def processes_in_namespace(pid_namespace: int) -> list[int]:
    """Host pids of the live (not zombie) processes in the pid namespace ``pid_namespace``."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError):
            if os.stat(f"/proc/{entry.name}/ns/pid").st_ino != pid_namespace:
                continue
            with open(f"/proc/{entry.name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            if state not in ("Z", "X"):
                found.append(int(entry.name))
    return found


def kill_until_gone(list_pids: Callable[[], list[int]], timeout: float = 5.0) -> list[int]:
    """SIGKILL every pid ``list_pids`` returns until it returns none; return any survivors."""
    deadline = time.monotonic() + timeout
    while True:
        pids = list_pids()
        if not pids or time.monotonic() > deadline:
            return pids
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)


def kill_namespace(pid_namespace: int | None, timeout: float = 5.0) -> list[int]:
    """SIGKILL every process in the pid namespace until none is left; return survivors."""
    if pid_namespace is None:
        return []
    return kill_until_gone(lambda: processes_in_namespace(pid_namespace), timeout)


def sweep_stale(paths: Iterable[pathlib.Path], remove: Callable[[pathlib.Path], object]) -> None:
    """Remove what sandboxes of dead processes left behind (their owner was killed)."""
    for path in paths:
        owner = path.name[len(STATE_PREFIX) :].split("-", 1)[0]
        if not owner.isdigit() or int(owner) == os.getpid():
            continue
        try:
            os.kill(int(owner), 0)
            continue
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        with contextlib.suppress(OSError):
            remove(path)
            logger.info("removed %s left by dead process %s", path, owner)


def _create(path: pathlib.Path) -> int:
    """A new file for the sandbox to read (never an existing one, never through a link)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    os.fchmod(fd, 0o644)
    return fd


def _write_new(path: pathlib.Path, data: bytes) -> None:
    fd = _create(path)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


#: The longest command passed to the shell as an argument (``bash -c CMD``; Linux takes at
#: most 128 KiB in one argument); a longer one is a file the shell reads (``cmd.sh``).
MAX_INLINE_COMMAND = 65536


def write_request(req: pathlib.Path, cmd: str, env_script: str, user: str) -> None:
    """Lay out one exec request for the in-sandbox supervisor (in the host-only ``ctl/req``).

    ``env.sh`` ends by setting the positional parameters to the command (``set -- CMD``,
    run as ``bash -c "$1"``), or to nothing when it is long (or holds a NUL): then the
    shell reads it from ``cmd.sh``.
    """
    req.mkdir(mode=0o755)
    data = cmd.encode()
    if len(data) > MAX_INLINE_COMMAND or b"\0" in data:
        _write_new(req / "cmd.sh", data + b"\n")
        argv = "set --\n"
    else:
        argv = f"set -- {shlex.quote(cmd)}\n"
    _write_new(req / "env.sh", (env_script + argv).encode())
    _write_new(req / "user", (user + "\n").encode())


def stage(content: str | bytes | pathlib.Path, target: pathlib.Path) -> None:
    """Put ``content`` at ``target`` (a new file in the host-only ``ctl/in``); a host
    ``Path`` is copied in chunks, never loaded."""
    if isinstance(content, pathlib.Path):
        if not content.is_file():
            raise FileNotFoundError(f"cannot upload {content}: it is not a file on the host")
        with open(content, "rb") as src, os.fdopen(_create(target), "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    else:
        _write_new(target, content.encode() if isinstance(content, str) else content)


def env_script(user: str, env: Mapping[str, str], workdir: str) -> str:
    """The sh script that sets one exec's environment (defaults, then ``env``) and workdir."""
    home = "/root" if user == "root" else "/home/agent"
    merged = {
        "PATH": DEFAULT_PATH,
        "HOME": home,
        "USER": user,
        "LOGNAME": user,
        "LANG": "C.UTF-8",
        "TMPDIR": "/tmp",
        **env,
        "AGENTRL_WORKDIR": workdir,
    }
    lines = []
    for key, value in merged.items():
        if not key.isidentifier():
            raise SandboxError(f"environment variable name {key!r} is not valid in a shell")
        lines.append(f"export {key}={shlex.quote(str(value))}")
    return "\n".join(lines) + "\n"
