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
    """

    def __init__(self, path: pathlib.Path) -> None:
        os.mkfifo(path, 0o600)
        self.fd: int | None = os.open(path, os.O_RDWR | os.O_NONBLOCK)
        self._events: dict[str, asyncio.Event] = {}
        self._buffer = b""
        self._loop: asyncio.AbstractEventLoop | None = None

    def attach(self) -> None:
        """Start reading on the running event loop."""
        assert self.fd is not None
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.fd, self._readable)

    def event(self, name: str) -> asyncio.Event:
        return self._events.setdefault(name, asyncio.Event())

    def forget(self, name: str) -> None:
        self._events.pop(name, None)

    async def wait(self, name: str, timeout: float) -> None:
        """Wait until ``name`` is announced or ``timeout`` passes (callers re-check state)."""
        event = self.event(name)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)
        event.clear()

    def _readable(self) -> None:
        assert self.fd is not None
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            event = self._events.get(line.decode(errors="replace").strip())
            if event is not None:
                event.set()

    def close(self) -> None:
        if self.fd is None:
            return
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


def write_request(req: pathlib.Path, cmd: str, env_script: str, user: str) -> None:
    """Lay out one exec request for the in-sandbox spawner."""
    req.mkdir()
    (req / "cmd.sh").write_text(cmd + "\n")
    (req / "env.sh").write_text(env_script)
    (req / "user").write_text(user + "\n")


def stage(content: str | bytes | pathlib.Path, target: pathlib.Path) -> None:
    """Put ``content`` at ``target``; a host ``Path`` is copied in chunks, never loaded."""
    if isinstance(content, pathlib.Path):
        if not content.is_file():
            raise FileNotFoundError(f"cannot upload {content}: it is not a file on the host")
        shutil.copyfile(content, target)
    else:
        target.write_bytes(content.encode() if isinstance(content, str) else content)


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
