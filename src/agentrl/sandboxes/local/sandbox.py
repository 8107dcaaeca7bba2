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
import errno
import json
import logging
import os
import pathlib
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from agentrl.sandboxes.base import (
    EXIT_EXEC_TIMEOUT,
    Sandbox,
    SandboxError,
    SandboxGoneError,
    cap_file,
    check_result,
)
from agentrl.sandboxes.base import max_output_bytes as _resolve_max_output
from agentrl.sandboxes.local import fs, proc
from agentrl.sandboxes.local.fs import host_python_options
from agentrl.sandboxes.local.limits import Limits
from agentrl.sandboxes.local.proc import processes_in_namespace
from agentrl.sandboxes.local.scripts import BIN, CTL, INIT_SH, RUN_SH, SERVICES
from agentrl.types import ExecResult, Task

__all__ = ["LocalSandbox", "host_python_options", "processes_in_namespace"]

logger = logging.getLogger(__name__)

_USERS = ("root", "agent")
_EXIT_MISSING = 44


class LocalSandbox(Sandbox):
    """A bubblewrap sandbox on this machine.

    ``image``: None for the host's system directories (read-only), or a root filesystem
    directory / tarball. ``repo``: a directory or tarball that appears at ``workdir``;
    edits never reach it. ``services``: ``{port: unix_socket_path}``; each socket is bound
    in and relayed to ``127.0.0.1:port`` inside, which ``url_for`` returns. ``memory_mb`` /
    ``pids``: limits for the whole sandbox (None: unlimited). ``tmp_size_mb`` /
    ``home_size_mb``: tmpfs sizes. ``overlay``: "auto", "never" or "require".
    ``host_python``: with the host's root (no image), bind this machine's Python interpreter
    in and put it first on PATH (see ``host_python_options``); ``ro_binds`` and ``env``
    given here win over what it adds.
    """

    name = "local"
    reaches_middleware_over_unix_socket = True
    with_host_python = MappingProxyType({"host_python": True})

    def __init__(
        self,
        *,
        image: str | None = None,
        repo: str | None = None,
        workdir: str = "/workspace",
        services: Mapping[int, str | os.PathLike[str]] | None = None,
        env: Mapping[str, str] | None = None,
        memory_mb: int | None = 4096,
        pids: int | None = 1024,
        tmp_size_mb: int = 1024,
        home_size_mb: int = 1024,
        agent_uid: int = 1000,
        overlay: str = "auto",
        ro_binds: Mapping[str, str] | None = None,
        max_output_bytes: int | None = None,
        startup_timeout: float = 30.0,
        bwrap: str = "bwrap",
        state_dir: str | os.PathLike[str] | None = None,
        host_python: bool = False,
    ) -> None:
        if overlay not in ("auto", "never", "require"):
            raise ValueError(f"overlay must be 'auto', 'never' or 'require', got {overlay!r}")
        if not workdir.startswith("/") or workdir.rstrip("/") in ("", "/tmp", "/.agentrl"):
            raise ValueError(f"workdir must be an absolute path of its own, got {workdir!r}")
        self.image = image
        self.repo = repo
        self.workdir = workdir.rstrip("/")
        self.services = {int(p): pathlib.Path(s) for p, s in (services or {}).items()}
        self.env = dict(env or {})
        self.ro_binds = dict(ro_binds or {})
        if host_python and image is None:
            python = host_python_options()
            self.env = {**python["env"], **self.env}
            self.ro_binds = {**python["ro_binds"], **self.ro_binds}
        self.memory_mb = memory_mb
        self.pids = pids
        self.tmp_size_mb = tmp_size_mb
        self.home_size_mb = home_size_mb
        self.agent_uid = agent_uid
        self.overlay = overlay
        self.max_output = _resolve_max_output(max_output_bytes)
        self.startup_timeout = startup_timeout
        self.bwrap = bwrap
        self.state_parent = pathlib.Path(state_dir) if state_dir else None
        self.state: pathlib.Path | None = None
        self.limits: Limits | None = None
        #: Inode of the sandbox's pid namespace (processes in it belong to the sandbox).
        self.pid_namespace: int | None = None
        self.workspace_mode = ""
        self._proc: asyncio.subprocess.Process | None = None
        self._queue_fd: int | None = None
        self._sandbox_init: int | None = None
        self._done: proc.DoneChannel | None = None
        self._closed = False

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
        if self._proc is not None or self._closed:
            raise SandboxError("a LocalSandbox starts once; create a new one for a new run")
        fs.require_bwrap(self.bwrap)
        for port, sock in self.services.items():
            if not sock.exists():
                raise SandboxError(
                    f"service socket for port {port} does not exist: {sock}; start the "
                    "host service on that unix socket before the sandbox"
                )
        try:
            await asyncio.to_thread(self._prepare)
            await self._launch()
            await self._wait_ready()
        except BaseException:
            await self.aclose()
            raise

    def _prepare(self) -> None:
        image_root = fs.prepare_image(self.image)
        if self.state_parent:
            self.state_parent.mkdir(parents=True, exist_ok=True)
        parent = self.state_parent or pathlib.Path(tempfile.gettempdir())
        proc.sweep_stale(parent.glob(f"{proc.STATE_PREFIX}*"), shutil.rmtree)
        self.state = pathlib.Path(
            tempfile.mkdtemp(prefix=f"{proc.STATE_PREFIX}{os.getpid()}-", dir=parent)
        )
        self._image_root = image_root
        for sub in ("ctl/req", "ctl/xfer", "bin"):
            (self.state / sub).mkdir(parents=True)
        os.mkfifo(self.state / "ctl" / "queue", 0o600)
        self._done = proc.DoneChannel(self.state / "ctl" / "done")
        (self.state / "bin" / "init.sh").write_text(INIT_SH)
        (self.state / "bin" / "run.sh").write_text(RUN_SH)
        mask = self.state / "masked"
        mask.touch(mode=0)
        mask.chmod(0)
        if os.geteuid() == 0:
            # Owned by an id the sandbox does not map, even its root cannot override the mode.
            os.chown(mask, 65534, 65534)
        self._passwd, self._group = fs.account_files(image_root, self.state, self.agent_uid)
        self._workspace, self._overlay_dirs = fs.prepare_workspace(
            self.repo, self.state, self.overlay
        )
        self.workspace_mode = "overlay" if self._overlay_dirs else "copy"
        self.limits = Limits(self.state.name, memory_mb=self.memory_mb, pids=self.pids)
        for parent in self.limits.parents:
            proc.sweep_stale(parent.glob(f"{proc.STATE_PREFIX}*"), os.rmdir)

    def _bwrap_args(self, info_fd: int) -> list[str]:
        assert self.state is not None
        mb = 1024 * 1024
        args = [
            self.bwrap,
            "--unshare-all",
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--uid",
            str(self.agent_uid),
            "--gid",
            str(self.agent_uid),
            "--hostname",
            "agentrl",
            "--clearenv",
            "--setenv",
            "PATH",
            proc.DEFAULT_PATH,
            "--setenv",
            "AGENTRL_SERVICE_PORTS",
            " ".join(str(p) for p in sorted(self.services)),
            "--info-fd",
            str(info_fd),
            *fs.root_args(
                self._image_root,
                self.state / "masked",
                {"passwd": self._passwd, "group": self._group},
            ),
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "--size",
            str(self.tmp_size_mb * mb),
            "--tmpfs",
            "/tmp",
            "--size",
            str(self.home_size_mb * mb),
            "--tmpfs",
            "/root",
            "--dir",
            "/home",
            "--size",
            str(self.home_size_mb * mb),
            "--tmpfs",
            "/home/agent",
            "--bind",
            str(self._workspace),
            self.workdir,
            "--bind",
            str(self.state / "ctl"),
            CTL,
            "--ro-bind",
            str(self.state / "bin"),
            BIN,
        ]
        for dest, src in self.ro_binds.items():
            args += ["--ro-bind", src, dest]
        for port, sock in self.services.items():
            args += ["--bind", str(sock), f"{SERVICES}/{port}.sock"]
        # The root itself is bubblewrap's tmpfs: make it read-only once everything is mounted.
        return [*args, "--remount-ro", "/", "--chdir", "/", "sh", f"{BIN}/init.sh"]

    async def _launch(self) -> None:
        assert self.state is not None and self.limits is not None
        log, info = _open_outputs(self.state)
        argv = self._bwrap_args(info.fileno())
        if self._overlay_dirs:
            d = self._overlay_dirs
            mount = (
                'mount -t overlay overlay -o "lowerdir=$1,upperdir=$2,workdir=$3" "$4" || exit 98; '
                'shift 4; exec "$@"'
            )
            argv = [
                *fs.overlay_wrapper(),
                "sh",
                "-c",
                mount,
                "sh",
                str(d["lower"]),
                str(d["upper"]),
                str(d["work"]),
                str(self._workspace),
                *argv,
            ]
        argv = self.limits.rlimit_args() + argv
        join = 'for f in $AGENTRL_CGROUPS; do echo $$ > "$f" || exit 97; done; exec "$@"'
        argv = ["sh", "-c", join, "sh", *argv]
        env = dict(os.environ, AGENTRL_CGROUPS=" ".join(self.limits.cgroup_procs))
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
                start_new_session=True,
                pass_fds=(info.fileno(),),
            )
        finally:
            log.close()
            info.close()
        logger.debug(
            "local sandbox %s: pid %s, limits %s", self.state, self._proc.pid, self.limits.mode
        )

    async def _wait_ready(self) -> None:
        assert self.state is not None and self._proc is not None
        ready = self.state / "ctl" / "ready"
        deadline = time.monotonic() + self.startup_timeout
        assert self._done is not None
        self._done.attach()
        while not ready.exists():
            if self._proc.returncode is not None:
                raise SandboxError(f"the local sandbox failed to start: {self._log_tail()}")
            if time.monotonic() > deadline:
                raise SandboxError(
                    f"the local sandbox did not start within {self.startup_timeout}s: "
                    f"{self._log_tail()}"
                )
            await self._done.wait("ready", 0.05)
        self._done.forget("ready")
        status = ready.read_text().strip()
        if status != "ready":
            raise SandboxError(f"the local sandbox failed to start: {status}")
        with contextlib.suppress(OSError, ValueError):
            info = json.loads((self.state / "info.json").read_text())
            self.pid_namespace = info["pid-namespace"]
            self._sandbox_init = info["child-pid"]
        self._queue_fd = await self._open_queue(deadline)

    async def _open_queue(self, deadline: float) -> int:
        """Open the request FIFO for writing; ENXIO means its reader is not open yet."""
        assert self.state is not None and self._proc is not None
        while True:
            try:
                return os.open(self.state / "ctl" / "queue", os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                if exc.errno != errno.ENXIO or self._proc.returncode is not None:
                    raise SandboxError(
                        f"the local sandbox's request pipe cannot be opened ({exc}): "
                        f"{self._log_tail()}"
                    ) from exc
                if time.monotonic() > deadline:
                    raise SandboxError(
                        "the local sandbox reported ready but never opened its request pipe"
                    ) from exc
            await asyncio.sleep(0.01)

    def _log_tail(self) -> str:
        code = self._proc.returncode if self._proc else None
        try:
            text = (self.state / "bwrap.log").read_text(errors="replace").strip()  # type: ignore[operator]
        except OSError:
            text = ""
        reasons = {97: "could not join the sandbox's cgroup", 98: "could not mount the overlay"}
        return (
            f"exit code {code}"
            + (f" ({reasons[code]})" if code in reasons else "")
            + (f": {text[-1500:]}" if text else "")
        )

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
            if self.state is not None:
                await asyncio.to_thread(shutil.rmtree, self.state, True)

    async def _stop(self) -> None:
        if self._queue_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._queue_fd)
            self._queue_fd = None
        if self._done is not None:
            self._done.close()
        child = self._proc
        if child is not None and child.returncode is None:
            # Killing the sandbox's pid 1 takes every process in it down; bubblewrap's outer
            # process then reaps it and exits, so nothing is left orphaned or a zombie.
            if self._sandbox_init is not None:
                with contextlib.suppress(OSError):
                    if os.stat(f"/proc/{self._sandbox_init}/ns/pid").st_ino == self.pid_namespace:
                        os.kill(self._sandbox_init, signal.SIGKILL)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(child.wait(), 2)
            if child.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(child.pid, signal.SIGKILL)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(child.wait(), 10)
        await asyncio.to_thread(self._reap_leftovers)

    def _reap_leftovers(self) -> None:
        survivors = proc.kill_namespace(self.pid_namespace)
        if self.limits is not None:
            survivors += self.limits.kill_all()
            self.limits.remove(timeout=2.0)
        if survivors:
            logger.error("local sandbox: processes survived teardown: %s", survivors)

    # -- exec ------------------------------------------------------------------------------
    def _check_alive(self) -> None:
        if self._closed:
            raise SandboxGoneError("the local sandbox is closed")
        if self._proc is None or self._queue_fd is None:
            raise SandboxError("the local sandbox is not started; use `async with` or start()")
        if self._proc.returncode is not None:
            raise SandboxGoneError(f"the local sandbox exited: {self._log_tail()}")

    def _send(self, line: str) -> None:
        assert self._queue_fd is not None
        try:
            os.write(self._queue_fd, (line + "\n").encode())
        except OSError as exc:
            if exc.errno in (errno.EPIPE, errno.EAGAIN):
                raise SandboxGoneError(
                    f"the local sandbox stopped reading requests: {exc}"
                ) from exc
            raise SandboxError(f"could not send a request to the local sandbox: {exc}") from exc

    async def exec(
        self,
        cmd: str,
        *,
        user: str = "root",
        env: Mapping[str, str] | None = None,
        timeout: float = 120,
        check: bool = False,
        idempotent: bool = True,
        workdir: str | None = None,
    ) -> ExecResult:
        self._check_alive()
        if user not in _USERS:
            raise SandboxError(f"unknown user {user!r}; the local sandbox has {list(_USERS)}")
        assert self.state is not None
        rid = uuid.uuid4().hex
        req = self.state / "ctl" / "req" / rid
        env_script = proc.env_script(user, {**self.env, **(env or {})}, workdir or self.workdir)
        keep = False
        try:
            await asyncio.to_thread(proc.write_request, req, cmd, env_script, user)
            self._send(f"run {rid}")
            try:
                code = await self._wait_rc(req, timeout)
            except asyncio.CancelledError:
                # Kill it; its request directory stays for the spawner to find the pgid in.
                with contextlib.suppress(SandboxError):
                    self._send(f"kill {rid}")
                keep = True
                raise
            stderr_note = ""
            if code is None:
                self._send(f"kill {rid}")
                await self._wait_rc(req, 10)
                code = EXIT_EXEC_TIMEOUT
                stderr_note = f"\n[agentrl: command timed out after {timeout:g}s and was killed]\n"
            stdout = await asyncio.to_thread(cap_file, req / "out", self.max_output)
            stderr = await asyncio.to_thread(cap_file, req / "err", self.max_output)
        finally:
            if not keep:
                await asyncio.to_thread(shutil.rmtree, req, True)
        result = ExecResult(exit_code=code, stdout=stdout, stderr=stderr + stderr_note)
        return check_result(cmd, result, check)

    async def _wait_rc(self, req: pathlib.Path, timeout: float) -> int | None:
        """The command's exit code, or None after ``timeout``; woken by the done FIFO."""
        rc_file = req / "rc"
        deadline = time.monotonic() + timeout
        assert self._done is not None
        try:
            while True:
                try:
                    text = rc_file.read_text()
                except FileNotFoundError:
                    text = ""
                if text.endswith("\n") and text.strip().lstrip("-").isdigit():
                    return int(text)
                if self._proc is None or self._proc.returncode is not None:
                    raise SandboxGoneError(
                        f"the local sandbox died while a command was running: {self._log_tail()}"
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                # The notification is the fast path; the short timeout notices a dead sandbox.
                await self._done.wait(req.name, min(0.1, remaining))
        finally:
            self._done.forget(req.name)

    # -- files -----------------------------------------------------------------------------
    async def write_file(
        self, path: str, content: str | bytes | pathlib.Path, *, user: str = "root"
    ) -> None:
        self._check_alive()
        assert self.state is not None
        xfer = self.state / "ctl" / "xfer" / uuid.uuid4().hex
        try:
            await asyncio.to_thread(proc.stage, content, xfer)
            q = shlex.quote(path)
            result = await self.exec(
                f'mkdir -p "$(dirname {q})" && cat {CTL}/xfer/{xfer.name} > {q}', user=user
            )
        finally:
            xfer.unlink(missing_ok=True)
        if not result.ok:
            raise SandboxError(f"could not write {path} as {user}: {result.stderr.strip()}")

    async def read_file(self, path: str, *, user: str = "root", text: bool = True) -> str | bytes:
        self._check_alive()
        assert self.state is not None
        xfer = self.state / "ctl" / "xfer" / uuid.uuid4().hex
        try:
            q = shlex.quote(path)
            result = await self.exec(
                f"[ -e {q} ] || exit {_EXIT_MISSING}; cat {q} > {CTL}/xfer/{xfer.name}", user=user
            )
            if result.exit_code == _EXIT_MISSING:
                raise FileNotFoundError(f"no such file in the sandbox: {path}")
            if not result.ok:
                raise SandboxError(f"could not read {path} as {user}: {result.stderr.strip()}")
            data = await asyncio.to_thread(xfer.read_bytes)
        finally:
            xfer.unlink(missing_ok=True)
        return data.decode("utf-8", errors="replace") if text else data

    def url_for(self, host: str, port: int) -> str:
        if port not in self.services:
            raise SandboxError(
                f"no service is bound for port {port} (bound: {sorted(self.services)}); "
                f"create the sandbox with services={{{port}: '/path/to/service.sock'}}"
            )
        return f"http://127.0.0.1:{port}"


def _open_outputs(state: pathlib.Path) -> tuple[Any, Any]:
    """The files bubblewrap's output and its --info-fd JSON go to."""
    return open(state / "bwrap.log", "wb"), open(state / "info.json", "wb")
