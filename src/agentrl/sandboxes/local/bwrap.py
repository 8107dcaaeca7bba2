"""The bubblewrap side of the ``local`` sandbox: what is mounted where, and the process.

``prepare_mounts`` lays out the host files the sandbox's root is built from (the image, a
masking file, passwd/group) and plans the areas the launcher mounts (workspace, output,
staged binds); ``sandbox_args`` is bubblewrap's command line over them; ``launch`` starts
it through ``launcher`` and returns a ``BwrapProcess``, which reports how it exited, opens
the launcher's areas for the host and kills it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import pathlib
import signal
import subprocess

import attrs

from agentrl.sandboxes.local import fs, launcher, proc
from agentrl.sandboxes.local.limits import Limits
from agentrl.sandboxes.local.options import LocalOptions
from agentrl.sandboxes.local.scripts import BIN, CTL, OUT, SERVICES

__all__ = ["BwrapProcess", "Mounts", "launch", "prepare_mounts", "sandbox_args"]

logger = logging.getLogger(__name__)


@attrs.frozen(kw_only=True)
class Mounts:
    """The host paths one sandbox's filesystem is made of, all under ``state``."""

    state: pathlib.Path
    #: The image's root directory; None for the host's system directories.
    image_root: pathlib.Path | None
    #: A mode-000 file bound over host secrets.
    masked: pathlib.Path
    passwd: pathlib.Path
    group: pathlib.Path
    #: The mount point bound at the workdir (the launcher mounts the workspace area on it).
    workspace: pathlib.Path
    #: How the launcher makes the workspace area.
    plan: launcher.Workspace = attrs.field(
        factory=lambda: launcher.Workspace(mode="copy", source=None, size_mb=64)
    )
    #: What the sandbox's ids are on the host (a root host), else None.
    ids: launcher.HostIds | None = None
    #: ``{staged path: source}``: sources bound under ``state/binds`` by the launcher.
    staged: dict[str, str] = attrs.field(factory=dict)

    @property
    def workspace_mode(self) -> str:
        """``"overlay"`` or ``"copy"``: how the workspace keeps edits from the repository."""
        return self.plan.mode

    @property
    def stage(self) -> pathlib.Path | None:
        """The host directory holding the staged binds' mount points, if any."""
        return pathlib.Path(next(iter(self.staged))).parent if self.staged else None

    @property
    def output(self) -> pathlib.Path:
        """The mount point of the output area (seen only in the launcher's namespace)."""
        return self.state / "out"

    def source(self, path: str | os.PathLike[str]) -> str:
        """What bubblewrap binds for the host path ``path``: its staged copy when one is."""
        text = str(path)
        # The longest source first: a source inside another is staged on its own.
        for staged, original in sorted(self.staged.items(), key=lambda kv: -len(kv[1])):
            if text == original or text.startswith(original.rstrip("/") + "/"):
                return staged + text[len(original.rstrip("/")) :]
        return text


def prepare_mounts(options: LocalOptions, state: pathlib.Path, ro_binds: dict[str, str]) -> Mounts:
    """Extract or find the image, write the masking file and accounts, plan the workspace
    and output areas, and (on a root host) stage what an unprivileged uid cannot reach
    (``ro_binds``: the sandbox's read-only binds, ``host_python``'s included)."""
    ids = launcher.host_ids(options.host_uid, options.agent_uid)
    image_root = fs.prepare_image(options.image)
    mask = state / "masked"
    mask.touch(mode=0)
    mask.chmod(0)
    if os.geteuid() == 0:
        # Owned by an id the sandbox does not map, even its root cannot override the mode.
        os.chown(mask, 65534, 65534)
    if ids is not None:
        state.chmod(0o711)
    passwd, group = fs.account_files(image_root, state, options.agent_uid)
    plan = fs.plan_workspace(
        options.repo,
        state,
        options.overlay,
        workspace_size_mb=options.workspace_size_mb,
        root_host=ids is not None,
    )
    for area in ("workspace", "out", "ws-data"):
        (state / area).mkdir(exist_ok=True)
    staged: dict[str, str] = {}
    if ids is not None:
        sources = [str(state)] + ([str(image_root)] if image_root is not None else [])
        sources += [*ro_binds.values(), *(str(s) for s in options.services.values())]
        stage = launcher.stage_base() / state.name
        stage.mkdir(mode=0o711)
        for i, source in enumerate(dict.fromkeys(sources)):
            target = stage / str(i)
            if os.path.isdir(source):
                target.mkdir()
            else:
                target.touch()
            staged[str(target)] = source
        for sock in options.services.values():
            launcher.grant_socket(sock, ids)
    return Mounts(
        state=state,
        image_root=image_root,
        masked=mask,
        passwd=passwd,
        group=group,
        workspace=state / "workspace",
        plan=plan,
        ids=ids,
        staged=staged,
    )


def sandbox_args(
    options: LocalOptions, mounts: Mounts, ro_binds: dict[str, str], info_fd: int
) -> list[str]:
    """bubblewrap's command line: namespaces, the read-only root, tmpfs homes and binds."""
    mb = 1024 * 1024
    state = mounts.state
    root = fs.root_args(
        mounts.image_root, mounts.masked, {"passwd": mounts.passwd, "group": mounts.group}
    )
    args = [
        options.bwrap,
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--uid",
        str(options.agent_uid),
        "--gid",
        str(options.agent_uid),
        "--hostname",
        "agentrl",
        "--clearenv",
        "--setenv",
        "PATH",
        proc.DEFAULT_PATH,
        "--setenv",
        "AGENTRL_SERVICE_PORTS",
        " ".join(str(p) for p in sorted(options.services)),
        "--info-fd",
        str(info_fd),
        *root,
        # /dev holds only the device nodes and is read-only; /dev/shm is a small tmpfs.
        "--dev",
        "/dev",
        "--remount-ro",
        "/dev",
        "--size",
        str(options.shm_size_mb * mb),
        "--tmpfs",
        "/dev/shm",
        "--proc",
        "/proc",
        "--size",
        str(options.tmp_size_mb * mb),
        "--tmpfs",
        "/tmp",
        "--size",
        str(options.home_size_mb * mb),
        "--tmpfs",
        "/root",
        "--dir",
        "/home",
        "--size",
        str(options.home_size_mb * mb),
        "--tmpfs",
        "/home/agent",
        "--bind",
        str(mounts.workspace),
        options.workdir,
        "--ro-bind",
        str(state / "ctl"),
        CTL,
        "--bind",
        str(state / "out"),
        OUT,
        "--ro-bind",
        str(state / "bin"),
        BIN,
    ]
    for dest, src in ro_binds.items():
        args += ["--ro-bind", mounts.source(src), dest]
    for port, sock in options.services.items():
        args += ["--bind", mounts.source(sock), f"{SERVICES}/{port}.sock"]
    # The root itself is bubblewrap's tmpfs: make it read-only once everything is mounted.
    args += ["--remount-ro", "/", "--chdir", "/", "sh", f"{BIN}/init.sh"]
    return _staged_sources(args, mounts)


def _staged_sources(args: list[str], mounts: Mounts) -> list[str]:
    """``args`` with each bind source replaced by its staged path, where there is one."""
    out = list(args)
    for i, token in enumerate(out[:-1]):
        if token in ("--ro-bind", "--bind"):
            out[i + 1] = mounts.source(out[i + 1])
    return out


async def launch(
    options: LocalOptions, mounts: Mounts, ro_binds: dict[str, str], limits: Limits
) -> BwrapProcess:
    """Start bubblewrap through the launcher (see ``launcher``) in a session of its own.

    Its output goes to a pipe the host reads only to explain a failure (bounded), its
    --info-fd JSON to a file in the state directory; its environment is ``PATH`` alone.
    """
    info = os.open(
        mounts.state / "info.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600
    )
    log_read, log_write = os.pipe2(os.O_CLOEXEC)
    os.set_blocking(log_read, False)
    argv = launcher.launcher_argv(
        sandbox_args(options, mounts, ro_binds, info),
        state=mounts.state,
        cgroup_procs=limits.cgroup_procs,
        rlimit_args=limits.rlimit_args(),
        output_size_mb=options.output_size_mb,
        workspace=mounts.plan,
        ids=mounts.ids,
        staged=mounts.staged,
    )
    try:
        child = await asyncio.create_subprocess_exec(
            *argv,
            stdin=subprocess.DEVNULL,
            stdout=log_write,
            stderr=log_write,
            env={"PATH": proc.DEFAULT_PATH},
            start_new_session=True,
            pass_fds=(info,),
        )
    except BaseException:
        os.close(log_read)
        raise
    finally:
        os.close(log_write)
        os.close(info)
    logger.debug("local sandbox %s: pid %s, limits %s", mounts.state, child.pid, limits.mode)
    return BwrapProcess(child=child, state=mounts.state, log_fd=log_read)


#: What the host keeps of bubblewrap's output, and reads of it at most per look.
_LOG_KEEP = 4096
_LOG_READ = 65536


@attrs.define
class BwrapProcess:
    """A running bubblewrap instance: its launcher process and the sandbox's pid 1."""

    child: asyncio.subprocess.Process
    state: pathlib.Path
    #: Read end of the pipe bubblewrap's output goes to (non-blocking; the host reads it
    #: only to explain a failure, at most ``_LOG_READ`` bytes a look, and keeps the tail).
    log_fd: int | None = None
    #: Inode of the sandbox's pid namespace (processes in it belong to the sandbox).
    pid_namespace: int | None = None
    #: Host pid of the sandbox's pid 1 (``init.sh``).
    sandbox_init: int | None = None
    _log: bytes = b""

    @property
    def pid(self) -> int:
        return self.child.pid

    @property
    def exited(self) -> bool:
        return self.child.returncode is not None

    def read_info(self) -> None:
        """Learn the pid namespace and pid 1 from bubblewrap's --info-fd JSON."""
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            with open(self.state / "info.json", "rb") as f:
                info = json.loads(f.read(65536))
            self.pid_namespace = int(info["pid-namespace"])
            self.sandbox_init = int(info["child-pid"])

    def open_area(self, path: pathlib.Path) -> int:
        """A directory descriptor of ``path`` as the launcher's mount namespace has it (an
        area mounted there, such as the output area)."""
        return os.open(
            f"/proc/{self.child.pid}/root{path}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
        )

    def _read_log(self) -> str:
        if self.log_fd is not None:
            with contextlib.suppress(BlockingIOError, OSError):
                self._log = (self._log + os.read(self.log_fd, _LOG_READ))[-_LOG_KEEP:]
        return self._log.decode(errors="replace").strip()

    def log_tail(self) -> str:
        """How it exited so far, with the end of bubblewrap's output, for an error message."""
        code = self.child.returncode
        text = self._read_log()
        return (
            f"exit code {code}"
            + (f" ({launcher.LAUNCHER_EXITS[code]})" if code in launcher.LAUNCHER_EXITS else "")
            + (f": {text[-1500:]}" if text else "")
        )

    def close_log(self) -> None:
        if self.log_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.log_fd)
            self.log_fd = None

    async def kill(self) -> None:
        """Kill the sandbox's pid 1 (which takes every process in it down), then the launcher."""
        child = self.child
        if child.returncode is not None:
            return
        # bubblewrap's outer process then reaps pid 1 and exits: nothing is left a zombie.
        if self.sandbox_init is not None:
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{self.sandbox_init}/ns/pid").st_ino == self.pid_namespace:
                    os.kill(self.sandbox_init, signal.SIGKILL)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(child.wait(), 2)
        if child.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGKILL)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(child.wait(), 10)
