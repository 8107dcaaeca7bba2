"""The exec protocol of the ``local`` sandbox: the host end of ``/.agentrl/ctl`` and ``out``.

The control area is split by who writes it. ``state/ctl``, bound read-only at
``/.agentrl/ctl``, is written only by the host: the ``queue`` and ``done`` FIFOs, each
request's ``req/ID/{env.sh,user}`` (``cmd.sh`` too for a long command) and ``in/NAME``
(a ``write_file`` upload). ``state/out``, bound writable at ``/.agentrl/out``, is
everything the sandbox writes: ``ID.out``, ``ID.err``, ``ID.pgid``, ``ID.kill``, ``ID.rc``
(last; read only once a newline ends it), ``ready``
and ``NAME.xfer`` (a ``read_file`` download). The host reaches ``out`` only through one
directory descriptor (``open_output_dir``) and the ``safe`` primitives: nothing in it is
followed, blocked on or read past a cap, and every such file operation runs off the event
loop.

The in-sandbox ``init.sh`` (see ``scripts``) reads one line per request from ``queue``:
``run ID`` starts the command laid out in ``req/ID``; ``kill ID`` kills its process group.
Each finished request (and ``ready``, at start) is announced on ``done``, so the host waits
on a notification rather than polling (and re-checks every 0.1 s, which bounds the latency
when the sandbox floods or steals notifications).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import pathlib
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from typing import TypeVar

from agentrl.sandboxes.base import EXIT_EXEC_TIMEOUT, SandboxError, SandboxGoneError
from agentrl.sandboxes.local import proc, safe
from agentrl.sandboxes.local.bwrap import BwrapProcess
from agentrl.sandboxes.local.scripts import CTL, INIT_SH, OUT
from agentrl.types import ExecResult

__all__ = ["ControlChannel"]

_T = TypeVar("_T")

#: The files one exec's command leaves in ``out`` (``ID`` + suffix).
_OUTPUTS = (".out", ".err", ".pgid", ".kill", ".rc")


class ControlChannel:
    """Requests to, and completions from, one sandbox's ``init.sh``.

    Created (with its directories, FIFOs and the in-sandbox scripts) before bubblewrap
    starts; ``wait_ready`` and ``open_queue`` connect it to the started ``BwrapProcess``.
    """

    def __init__(self, state: pathlib.Path) -> None:
        self.state = state
        self.ctl = state / "ctl"
        for sub in ("ctl/req", "ctl/in", "out", "bin"):
            (state / sub).mkdir(parents=True)
        os.mkfifo(self.ctl / "queue", 0o600)
        self._done = proc.DoneChannel(self.ctl / "done")
        (state / "bin" / "init.sh").write_text(INIT_SH)
        self._queue_fd: int | None = None
        self._out_fd: int | None = None
        # The out descriptor is closed only once no thread uses it (never reused under one).
        self._out_lock = threading.Lock()
        self._out_users = 0
        self._out_closing = False
        self._sandbox: BwrapProcess | None = None

    def open_output_dir(self, sandbox: BwrapProcess) -> int | None:
        """A descriptor on the sandbox-written ``out`` area, the host's only way into it; None
        until the launcher has mounted it.

        The area is a tmpfs the launcher mounts in its own mount namespace, so the host
        opens it through ``/proc/<launcher>/root`` (``BwrapProcess.open_area``), once: the
        descriptor then pins that tmpfs for the sandbox's life whatever happens to paths.
        """
        area = self.state / "out"
        try:
            fd = sandbox.open_area(area)
        except OSError:
            return None  # the launcher is gone: the caller reports how it exited
        if os.path.samestat(os.fstat(fd), os.stat(area)):
            os.close(fd)  # not mounted yet: this is the host's own empty directory
            return None
        return fd

    def _at_out(self, fn: Callable[..., _T], *args: object) -> _T:
        """``fn(out_fd, *args)``, in a worker thread, holding the descriptor open meanwhile."""
        with self._out_lock:
            fd = self._out_fd
            if fd is None or self._out_closing:
                raise SandboxGoneError("the local sandbox is closed")
            self._out_users += 1
        try:
            return fn(fd, *args)
        finally:
            with self._out_lock:
                self._out_users -= 1
                self._close_out_if_unused()

    def _close_out_if_unused(self) -> None:
        if self._out_closing and not self._out_users and self._out_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._out_fd)
            self._out_fd = None

    async def _off_loop(self, fn: Callable[..., _T], *args: object) -> _T:
        return await asyncio.to_thread(self._at_out, fn, *args)

    @property
    def is_open(self) -> bool:
        """Whether requests can be sent (the request FIFO is open)."""
        return self._queue_fd is not None

    # -- start -----------------------------------------------------------------------------
    async def wait_ready(self, sandbox: BwrapProcess, deadline: float, timeout: float) -> None:
        """Wait for ``init.sh`` to report ready (``timeout``: the allowance, for the message)."""
        self._sandbox = sandbox
        self._done.attach()
        self._done.event("ready")
        while (status := await self._ready_status(sandbox)) is None:
            if sandbox.exited:
                raise SandboxError(f"the local sandbox failed to start: {sandbox.log_tail()}")
            if time.monotonic() > deadline:
                raise SandboxError(
                    f"the local sandbox did not start within {timeout}s: {sandbox.log_tail()}"
                )
            await self._done.wait("ready", 0.05)
        self._done.forget("ready")
        if status != "ready":
            raise SandboxError(f"the local sandbox failed to start: {status}")

    async def _ready_status(self, sandbox: BwrapProcess) -> str | None:
        if self._out_fd is None:
            self._out_fd = await asyncio.to_thread(self.open_output_dir, sandbox)
            if self._out_fd is None:
                return None
        return await self._off_loop(_read_ready)

    async def open_queue(self, deadline: float) -> None:
        """Open the request FIFO for writing; ENXIO means its reader is not open yet."""
        assert self._sandbox is not None
        while True:
            try:
                self._queue_fd = os.open(self.ctl / "queue", os.O_WRONLY | os.O_NONBLOCK)
                return
            except OSError as exc:
                if exc.errno != errno.ENXIO or self._sandbox.exited:
                    raise SandboxError(
                        f"the local sandbox's request pipe cannot be opened ({exc}): "
                        f"{self._sandbox.log_tail()}"
                    ) from exc
                if time.monotonic() > deadline:
                    raise SandboxError(
                        "the local sandbox reported ready but never opened its request pipe"
                    ) from exc
            await asyncio.sleep(0.01)

    def close(self) -> None:
        """Stop sending and listening (``init.sh`` then sees the end of its queue)."""
        if self._queue_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._queue_fd)
            self._queue_fd = None
        self._done.close()
        with self._out_lock:
            self._out_closing = True
            self._close_out_if_unused()

    # -- requests --------------------------------------------------------------------------
    def send(self, line: str) -> None:
        """Send one request line (``run ID`` or ``kill ID``)."""
        assert self._queue_fd is not None
        try:
            os.write(self._queue_fd, (line + "\n").encode())
        except OSError as exc:
            if exc.errno in (errno.EPIPE, errno.EAGAIN):
                raise SandboxGoneError(
                    f"the local sandbox stopped reading requests: {exc}"
                ) from exc
            raise SandboxError(f"could not send a request to the local sandbox: {exc}") from exc

    async def run(
        self,
        cmd: str,
        *,
        env_script: str,
        user: str,
        timeout: float,
        max_output: int | None,
        timeout_code: int = EXIT_EXEC_TIMEOUT,
    ) -> ExecResult:
        """Run ``cmd`` as ``user``; past ``timeout`` kill it and return ``timeout_code``
        (``EXIT_EXEC_TIMEOUT``, with a note on stderr; another code comes without one).
        ``max_output`` None keeps no output."""
        rid = uuid.uuid4().hex
        req = self.ctl / "req" / rid
        keep = False
        output: tuple[str, str] | None = None
        try:
            await asyncio.to_thread(proc.write_request, req, cmd, env_script, user)
            self._done.event(rid)  # before the request: its notification cannot be missed
            self.send(f"run {rid}")
            try:
                code = await self._wait_rc(rid, timeout)
            except asyncio.CancelledError:
                # Kill it; its files stay for the spawner to find the pgid in.
                with contextlib.suppress(SandboxError):
                    self.send(f"kill {rid}")
                keep = True
                raise
            stderr_note = ""
            if code is None:
                self.send(f"kill {rid}")
                await self._wait_rc(rid, 10)
                code = timeout_code
                if code == EXIT_EXEC_TIMEOUT:
                    stderr_note = (
                        f"\n[agentrl: command timed out after {timeout:g}s and was killed]\n"
                    )
            output = await self._off_loop(_finish, req, rid, max_output)
        finally:
            if not keep and output is None:
                with contextlib.suppress(SandboxError):
                    await self._off_loop(_finish, req, rid, None)
        stdout, stderr = output
        return ExecResult(exit_code=code, stdout=stdout, stderr=stderr + stderr_note)

    async def _wait_rc(self, rid: str, timeout: float) -> int | None:
        """The command's exit code, or None after ``timeout``; woken by the done FIFO,
        whose line (``ID RC``) carries the code, else read from ``ID.rc``.

        ``ID.rc`` is read only when it is a regular file, at most 64 bytes, off the loop: a
        FIFO or a link there (or anything malformed) is "not finished yet".
        """
        deadline = time.monotonic() + timeout
        try:
            while True:
                announced = self._done.value(rid)
                if announced is not None and announced.lstrip("-").isdigit():
                    return int(announced)
                data = await self._off_loop(safe.read_small_at, f"{rid}.rc")
                text = (data or b"").decode("ascii", errors="replace")
                if text.endswith("\n") and text.strip().lstrip("-").isdigit():
                    return int(text)
                if self._sandbox is None or self._sandbox.exited:
                    tail = self._sandbox.log_tail() if self._sandbox else "not started"
                    raise SandboxGoneError(
                        f"the local sandbox died while a command was running: {tail}"
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                # The notification is the fast path; the short timeout notices a dead sandbox.
                await self._done.wait(rid, min(0.1, remaining))
        finally:
            self._done.forget(rid)

    # -- files -----------------------------------------------------------------------------
    def upload_path(self) -> tuple[pathlib.Path, str]:
        """A fresh file name in the host-only ``ctl/in``: its host path and its path inside."""
        name = uuid.uuid4().hex
        return self.ctl / "in" / name, f"{CTL}/in/{name}"

    def download_name(self) -> tuple[str, str]:
        """A fresh file name in ``out`` for the sandbox to write: the name and its path inside."""
        name = f"{uuid.uuid4().hex}.xfer"
        return name, f"{OUT}/{name}"

    async def read_download(self, name: str, limit: int, *, text: bool) -> str | bytes:
        """The file the sandbox wrote at ``name`` in ``out`` (then removed): text capped at
        ``limit`` with the truncation marker; bytes over ``limit`` raise ``SandboxError``."""
        return await self._off_loop(_read_download, name, limit, text)

    async def discard_download(self, name: str) -> None:
        """Remove whatever the sandbox left at ``name`` in ``out``."""
        await self._off_loop(safe.remove_at, name)


def _finish(out_fd: int, req: pathlib.Path, rid: str, max_output: int | None) -> tuple[str, str]:
    """Read a request's capped output (unless ``max_output`` is None), then remove it."""
    out = ("", "")
    if max_output is not None:
        out = (
            safe.read_capped_at(out_fd, f"{rid}.out", max_output, what="stdout"),
            safe.read_capped_at(out_fd, f"{rid}.err", max_output, what="stderr"),
        )
    for suffix in _OUTPUTS:
        safe.remove_at(out_fd, rid + suffix)
    shutil.rmtree(req, ignore_errors=True)  # host-only: the sandbox cannot write there
    return out


def _read_ready(out_fd: int) -> str | None:
    """What ``init.sh`` reported at start ("ready" or an error), None before it did."""
    data = safe.read_small_at(out_fd, "ready", 4096)
    return data.decode(errors="replace").strip() if data is not None else None


def _read_download(out_fd: int, name: str, limit: int, text: bool) -> str | bytes:
    """The file the sandbox wrote at ``name`` (then removed): text capped at ``limit``
    with the truncation marker; bytes over ``limit`` raise ``SandboxError``."""
    try:
        if text:
            return safe.read_capped_at(out_fd, name, limit, what="the file")
        data = safe.read_bytes_at(out_fd, name, limit)
        if data is None:
            raise SandboxError("the file read from the sandbox vanished before it was read")
        return data
    except OverflowError as exc:
        raise SandboxError(
            f"the file is {exc.args[0]} bytes, over read_file's cap of {limit} bytes "
            "(read it as text for its head and tail)"
        ) from None
    except safe.NotRegularFile as exc:
        raise SandboxError(
            f"the file read from the sandbox was replaced by {exc.strerror}"
        ) from None
    finally:
        safe.remove_at(out_fd, name)
