"""The exec protocol of the ``local`` sandbox: the host end of ``/.agentrl/ctl``.

The in-sandbox ``init.sh`` (see ``scripts``) reads one line per request from the ``queue``
FIFO: ``run ID`` starts the command laid out in ``req/ID`` (``cmd.sh``, ``env.sh``,
``user``), which writes ``out``, ``err``, ``pgid`` and at last ``rc`` (atomically, by
rename); ``kill ID`` kills its process group. Each finished request (and ``ready``, at
start) is announced on the ``done`` FIFO, so the host waits on a notification rather than
polling. Files travel through ``xfer``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import pathlib
import shutil
import time
import uuid

from agentrl.sandboxes.base import EXIT_EXEC_TIMEOUT, SandboxError, SandboxGoneError, cap_file
from agentrl.sandboxes.local import proc
from agentrl.sandboxes.local.bwrap import BwrapProcess
from agentrl.sandboxes.local.scripts import CTL, INIT_SH, RUN_SH
from agentrl.types import ExecResult

__all__ = ["ControlChannel"]


class ControlChannel:
    """Requests to, and completions from, one sandbox's ``init.sh``.

    Created (with its directories, FIFOs and the in-sandbox scripts) before bubblewrap
    starts; ``wait_ready`` and ``open_queue`` connect it to the started ``BwrapProcess``.
    """

    def __init__(self, state: pathlib.Path) -> None:
        self.ctl = state / "ctl"
        for sub in ("ctl/req", "ctl/xfer", "bin"):
            (state / sub).mkdir(parents=True)
        os.mkfifo(self.ctl / "queue", 0o600)
        self._done = proc.DoneChannel(self.ctl / "done")
        (state / "bin" / "init.sh").write_text(INIT_SH)
        (state / "bin" / "run.sh").write_text(RUN_SH)
        self._queue_fd: int | None = None
        self._sandbox: BwrapProcess | None = None

    @property
    def is_open(self) -> bool:
        """Whether requests can be sent (the request FIFO is open)."""
        return self._queue_fd is not None

    # -- start -----------------------------------------------------------------------------
    async def wait_ready(self, sandbox: BwrapProcess, deadline: float, timeout: float) -> None:
        """Wait for ``init.sh`` to report ready (``timeout``: the allowance, for the message)."""
        self._sandbox = sandbox
        ready = self.ctl / "ready"
        self._done.attach()
        while not ready.exists():
            if sandbox.exited:
                raise SandboxError(f"the local sandbox failed to start: {sandbox.log_tail()}")
            if time.monotonic() > deadline:
                raise SandboxError(
                    f"the local sandbox did not start within {timeout}s: {sandbox.log_tail()}"
                )
            await self._done.wait("ready", 0.05)
        self._done.forget("ready")
        status = ready.read_text().strip()
        if status != "ready":
            raise SandboxError(f"the local sandbox failed to start: {status}")

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
        self, cmd: str, *, env_script: str, user: str, timeout: float, max_output: int
    ) -> ExecResult:
        """Run ``cmd`` as ``user``; past ``timeout`` kill it and return ``EXIT_EXEC_TIMEOUT``."""
        rid = uuid.uuid4().hex
        req = self.ctl / "req" / rid
        keep = False
        try:
            await asyncio.to_thread(proc.write_request, req, cmd, env_script, user)
            self.send(f"run {rid}")
            try:
                code = await self._wait_rc(req, timeout)
            except asyncio.CancelledError:
                # Kill it; its request directory stays for the spawner to find the pgid in.
                with contextlib.suppress(SandboxError):
                    self.send(f"kill {rid}")
                keep = True
                raise
            stderr_note = ""
            if code is None:
                self.send(f"kill {rid}")
                await self._wait_rc(req, 10)
                code = EXIT_EXEC_TIMEOUT
                stderr_note = f"\n[agentrl: command timed out after {timeout:g}s and was killed]\n"
            stdout = await asyncio.to_thread(cap_file, req / "out", max_output)
            stderr = await asyncio.to_thread(cap_file, req / "err", max_output)
        finally:
            if not keep:
                await asyncio.to_thread(shutil.rmtree, req, True)
        return ExecResult(exit_code=code, stdout=stdout, stderr=stderr + stderr_note)

    async def _wait_rc(self, req: pathlib.Path, timeout: float) -> int | None:
        """The command's exit code, or None after ``timeout``; woken by the done FIFO."""
        rc_file = req / "rc"
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    text = rc_file.read_text()
                except FileNotFoundError:
                    text = ""
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
                await self._done.wait(req.name, min(0.1, remaining))
        finally:
            self._done.forget(req.name)

    # -- files -----------------------------------------------------------------------------
    def transfer_path(self) -> tuple[pathlib.Path, str]:
        """A fresh file name in ``xfer``: its host path and the same file's path inside."""
        name = uuid.uuid4().hex
        return self.ctl / "xfer" / name, f"{CTL}/xfer/{name}"
