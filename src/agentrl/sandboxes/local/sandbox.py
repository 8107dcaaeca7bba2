"""The ``local`` sandbox: bubblewrap on this machine, the embedded default.

One long-lived bubblewrap instance per sandbox (so files, background processes and the
service relays persist between execs); every exec is a request file the in-sandbox
``init.sh`` picks up from a FIFO (see ``scripts``). Isolation: all namespaces
unshared (no network), a new session, no capabilities, a read-only root (the host's system
directories or an image), a private workspace (overlayfs over the task's repository, or a
copy), private tmpfs ``/tmp`` and homes, host secrets masked, memory and process limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pathlib
import shlex
import shutil
import subprocess
import tempfile
import time
from types import MappingProxyType
from typing import Any

from agentrl.sandboxes.base import (
    EXIT_EXEC_TIMEOUT,
    EXIT_TIME_BUDGET_EXCEEDED,
    READ_FILE_MAX_BYTES,
    ExecRequest,
    Sandbox,
    SandboxError,
    SandboxGoneError,
)
from agentrl.sandboxes.base import max_output_bytes as _resolve_max_output
from agentrl.sandboxes.local import bwrap, fs, launcher, proc
from agentrl.sandboxes.local.exec import ControlChannel
from agentrl.sandboxes.local.fs import host_python_options
from agentrl.sandboxes.local.limits import Limits
from agentrl.sandboxes.local.options import LocalOptions
from agentrl.sandboxes.local.proc import processes_in_namespace
from agentrl.types import ExecResult, Task

__all__ = ["LocalOptions", "LocalSandbox", "host_python_options", "processes_in_namespace"]

logger = logging.getLogger(__name__)

_USERS = ("root", "agent")
_EXIT_MISSING = 44


class LocalSandbox(Sandbox):
    """A bubblewrap sandbox on this machine, configured by ``LocalOptions``' keywords.

    It composes the parts of its package: ``bwrap`` (the mounts, bubblewrap's command line
    and process), ``exec`` (the request protocol with the in-sandbox ``init.sh``) and
    ``limits``; this class is the lifecycle. ``url_for`` returns ``127.0.0.1:port`` for a
    port bound through ``services``. ``env`` (each exec's environment) may be changed
    between execs.
    """

    name = "local"
    reaches_middleware_over_unix_socket = True
    prewarm_grading = True
    with_host_python = MappingProxyType({"host_python": True})

    def __init__(self, **options: Any) -> None:
        self.options = LocalOptions.from_keywords(options)
        self.env, self.ro_binds = self.options.sandbox_env_and_binds()
        self.max_output = _resolve_max_output(self.options.max_output_bytes)
        self.read_file_max_bytes = max(READ_FILE_MAX_BYTES, self.max_output)
        self.state: pathlib.Path | None = None
        self.limits: Limits | None = None
        self.workspace_mode = ""
        self._channel: ControlChannel | None = None
        self._process: bwrap.BwrapProcess | None = None
        self._mounts: bwrap.Mounts | None = None
        self._closed = False

    @property
    def image(self) -> str | None:
        return self.options.image

    @property
    def repo(self) -> str | None:
        return self.options.repo

    @property
    def workdir(self) -> str:
        return self.options.workdir

    @property
    def services(self) -> dict[int, pathlib.Path]:
        return self.options.services

    @property
    def agent_uid(self) -> int:
        return self.options.agent_uid

    @property
    def pid_namespace(self) -> int | None:
        """Inode of the sandbox's pid namespace (processes in it belong to the sandbox)."""
        return self._process.pid_namespace if self._process else None

    @classmethod
    def option_names(cls) -> frozenset[str]:
        """Every ``LocalOptions`` field but those ``from_task`` fills from the task."""
        return LocalOptions.names() - cls.task_parameters

    @classmethod
    def from_task(cls, task: Task, **options: Any) -> LocalSandbox:
        """A sandbox with ``task.image`` as root and ``task.repo`` at ``task.workdir``."""
        return cls(image=task.image, repo=task.repo, workdir=task.workdir, **options)

    @classmethod
    def check_task(cls, task: Task, **options: Any) -> None:
        """bubblewrap is installed, and the task's image and repository exist here."""
        fs.require_bwrap(options.get("bwrap", "bwrap"))
        fs.check_sources(task.image, task.repo)

    @classmethod
    def host_search_path(cls, task: Task, **options: Any) -> str | None:
        """Without an image, the sandbox's ``PATH`` when it holds only host directories."""
        sandbox = cls.from_task(task, **options)
        return fs.host_search_path(sandbox.image, sandbox.env, sandbox.ro_binds)

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        if self._process is not None or self._closed:
            raise SandboxError("a LocalSandbox starts once; create a new one for a new run")
        fs.require_bwrap(self.options.bwrap)
        for port, sock in self.services.items():
            if not sock.exists():
                raise SandboxError(
                    f"service socket for port {port} does not exist: {sock}; start the "
                    "host service on that unix socket before the sandbox"
                )
        try:
            mounts = await asyncio.to_thread(self._prepare)
            assert self.limits is not None and self._channel is not None
            self._process = await bwrap.launch(self.options, mounts, self.ro_binds, self.limits)
            timeout = self.options.startup_timeout
            deadline = time.monotonic() + timeout
            await self._channel.wait_ready(self._process, deadline, timeout)
            self._process.read_info()
            await self._channel.open_queue(deadline)
        except BaseException:
            await self.aclose()
            raise

    def _prepare(self) -> bwrap.Mounts:
        """Create the state directory, the mounts' sources, the control channel and limits."""
        state_dir = self.options.state_dir
        if state_dir:
            state_dir.mkdir(parents=True, exist_ok=True)
        parent = state_dir or pathlib.Path(tempfile.gettempdir())
        proc.sweep_stale(parent.glob(f"{proc.STATE_PREFIX}*"), shutil.rmtree)
        self.state = pathlib.Path(
            tempfile.mkdtemp(prefix=f"{proc.STATE_PREFIX}{os.getpid()}-", dir=parent)
        )
        self._channel = ControlChannel(self.state)
        if os.geteuid() == 0:
            proc.sweep_stale(launcher.stage_base().glob(f"{proc.STATE_PREFIX}*"), shutil.rmtree)
        mounts = bwrap.prepare_mounts(self.options, self.state, self.ro_binds)
        self._mounts = mounts
        if mounts.ids is not None:
            # The sandbox's host uid reads requests from one FIFO and announces on the other.
            for fifo in ("queue", "done"):
                os.chown(self.state / "ctl" / fifo, mounts.ids.uid, mounts.ids.gid)
        self.workspace_mode = mounts.workspace_mode
        self.limits = Limits(
            self.state.name, memory_mb=self.options.memory_mb, pids=self.options.pids
        )
        for cgroup_parent in self.limits.parents:
            proc.sweep_stale(cgroup_parent.glob(f"{proc.STATE_PREFIX}*"), os.rmdir)
        return mounts

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Shielded: a caller cancelled while leaving the context must not leak the sandbox.
        await asyncio.shield(self._teardown())

    async def _teardown(self) -> None:
        """Kill everything in the sandbox, then remove its state (never before: the
        workspace is bound in, and a process still alive could write into it)."""
        try:
            await self._stop()
        except Exception:
            logger.exception("local sandbox teardown failed")
        finally:
            stage = self._mounts.stage if self._mounts is not None else None
            if self.state is not None:
                await asyncio.to_thread(_remove_state, self.state)
            if stage is not None:
                await asyncio.to_thread(shutil.rmtree, stage, True)

    async def _stop(self) -> None:
        if self._channel is not None:
            self._channel.close()
        if self._process is not None:
            await self._process.kill()
            self._process.close_log()
        await asyncio.to_thread(self._reap_leftovers)

    def _reap_leftovers(self) -> None:
        survivors = proc.kill_namespace(self.pid_namespace)
        if self.limits is not None:
            survivors += self.limits.kill_all()
            self.limits.remove(timeout=2.0)
        if survivors:
            logger.error("local sandbox: processes survived teardown: %s", survivors)

    async def lost_externally(self, error: BaseException) -> bool:
        """True when this host ended the sandbox: its own teardown began, or bubblewrap's
        outer process (outside the sandbox's pid namespace, out of the agent's reach) was
        killed by a signal. A sandbox whose processes the agent killed exits on its own."""
        process = self._process
        code = process.child.returncode if process is not None else None
        return self._closed or (code is not None and code < 0)

    # -- exec ------------------------------------------------------------------------------
    def _check_alive(self) -> ControlChannel:
        """The control channel of a started sandbox that is still running, or raise."""
        if self._closed:
            raise SandboxGoneError("the local sandbox is closed")
        if self._process is None or self._channel is None or not self._channel.is_open:
            raise SandboxError("the local sandbox is not started; use `async with` or start()")
        if self._process.exited:
            raise SandboxGoneError(f"the local sandbox exited: {self._process.log_tail()}")
        return self._channel

    async def run_exec(self, request: ExecRequest) -> ExecResult:
        """One command through the control channel, as ``request.user``."""
        return await self._run(request, self.max_output, EXIT_EXEC_TIMEOUT)

    async def run_long(
        self, request: ExecRequest, *, want_output: bool, max_output: int
    ) -> ExecResult:
        """A long command is an exec like any other here: nothing can sever the channel,
        and the host waits on ``init.sh``'s notification, so there is nothing to poll."""
        limit = min(max_output, self.max_output) if want_output else None
        return await self._run(request, limit, EXIT_TIME_BUDGET_EXCEEDED)

    async def _run(
        self, request: ExecRequest, max_output: int | None, timeout_code: int
    ) -> ExecResult:
        channel = self._check_alive()
        user = request.user
        if user not in _USERS:
            raise SandboxError(f"unknown user {user!r}; the local sandbox has {list(_USERS)}")
        env = {**self.env, **(request.env or {})}
        env_script = proc.env_script(user, env, request.workdir or self.workdir)
        return await channel.run(
            request.cmd,
            env_script=env_script,
            user=user,
            timeout=request.timeout,
            max_output=max_output,
            timeout_code=timeout_code,
        )

    # -- files -----------------------------------------------------------------------------
    async def write_file(
        self, path: str, content: str | bytes | pathlib.Path, *, user: str = "root"
    ) -> None:
        """Staged in the host-only ``/.agentrl/ctl/in`` (the host never writes where the
        sandbox can), then copied into place by a command run as ``user``."""
        staged, inside = self._check_alive().upload_path()
        try:
            await asyncio.to_thread(proc.stage, content, staged)
            q = shlex.quote(path)
            result = await self.exec(f'mkdir -p "$(dirname {q})" && cat {inside} > {q}', user=user)
        finally:
            await asyncio.to_thread(staged.unlink, True)
        if not result.ok:
            raise SandboxError(f"could not write {path} as {user}: {result.stderr.strip()}")

    async def read_file(self, path: str, *, user: str = "root", text: bool = True) -> str | bytes:
        """At most ``read_file_max_bytes`` (64 MiB) come back: text keeps its head and tail
        around the truncation marker; bytes of a larger file raise ``SandboxError``."""
        channel = self._check_alive()
        name, inside = channel.download_name()
        q = shlex.quote(path)
        result = await self.exec(
            f"[ -e {q} ] || exit {_EXIT_MISSING}; cat {q} > {inside}", user=user
        )
        if result.exit_code == _EXIT_MISSING:
            raise FileNotFoundError(f"no such file in the sandbox: {path}")
        if not result.ok:
            with contextlib.suppress(SandboxError):
                await channel.discard_download(name)
            raise SandboxError(f"could not read {path} as {user}: {result.stderr.strip()}")
        try:
            return await channel.read_download(name, self.read_file_max_bytes, text=text)
        except SandboxError as exc:
            raise SandboxError(f"could not read {path}: {exc}") from None

    def url_for(self, host: str, port: int) -> str:
        if port not in self.services:
            raise SandboxError(
                f"no service is bound for port {port} (bound: {sorted(self.services)}); "
                f"create the sandbox with services={{{port}: '/path/to/service.sock'}}"
            )
        return f"http://127.0.0.1:{port}"


def _remove_state(state: pathlib.Path) -> None:
    """Remove a sandbox's state; ``rmtree`` follows no link. A tree deeper than Python's
    recursion limit (a command can make one) goes through ``rm -rf`` instead."""
    try:
        shutil.rmtree(state, ignore_errors=True)
    except RecursionError:
        subprocess.run(
            ["rm", "-rf", "--one-file-system", "--", str(state)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            check=False,
        )
    if state.exists():
        logger.error("local sandbox: could not remove all of %s", state)
