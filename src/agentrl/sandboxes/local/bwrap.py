"""The bubblewrap side of the ``local`` sandbox: what is mounted where, and the process.

``prepare_mounts`` lays out the host files the sandbox's root is built from (the image, a
masking file, passwd/group, the workspace); ``sandbox_args`` is bubblewrap's command line
over them; ``launch`` starts it inside the sandbox's cgroups (after an overlay mount in a
private mount namespace, when the workspace is an overlay) and returns a ``BwrapProcess``,
which reports how it exited and kills it.
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
from typing import IO

import attrs

from agentrl.sandboxes.local import fs, proc
from agentrl.sandboxes.local.limits import Limits
from agentrl.sandboxes.local.options import LocalOptions
from agentrl.sandboxes.local.scripts import BIN, CTL, OUT, SERVICES

__all__ = ["BwrapProcess", "Mounts", "launch", "prepare_mounts", "sandbox_args"]

logger = logging.getLogger(__name__)

#: Exit codes of the launcher's own steps, before bubblewrap runs.
_LAUNCHER_EXITS = {97: "could not join the sandbox's cgroup", 98: "could not mount the overlay"}


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
    #: The host directory bound at the workdir (the overlay's mount point when there is one).
    workspace: pathlib.Path
    #: ``lower``, ``upper`` and ``work`` directories of the workspace's overlay, if any.
    overlay_dirs: dict[str, pathlib.Path] | None

    @property
    def workspace_mode(self) -> str:
        """``"overlay"`` or ``"copy"``: how the workspace keeps edits from the repository."""
        return "overlay" if self.overlay_dirs else "copy"


def prepare_mounts(options: LocalOptions, state: pathlib.Path) -> Mounts:
    """Extract or find the image, and write the masking file, accounts and workspace."""
    image_root = fs.prepare_image(options.image)
    mask = state / "masked"
    mask.touch(mode=0)
    mask.chmod(0)
    if os.geteuid() == 0:
        # Owned by an id the sandbox does not map, even its root cannot override the mode.
        os.chown(mask, 65534, 65534)
    passwd, group = fs.account_files(image_root, state, options.agent_uid)
    workspace, overlay_dirs = fs.prepare_workspace(options.repo, state, options.overlay)
    return Mounts(
        state=state,
        image_root=image_root,
        masked=mask,
        passwd=passwd,
        group=group,
        workspace=workspace,
        overlay_dirs=overlay_dirs,
    )


def sandbox_args(
    options: LocalOptions, mounts: Mounts, ro_binds: dict[str, str], info_fd: int
) -> list[str]:
    """bubblewrap's command line: namespaces, the read-only root, tmpfs homes and binds."""
    mb = 1024 * 1024
    state = mounts.state
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
        *fs.root_args(
            mounts.image_root, mounts.masked, {"passwd": mounts.passwd, "group": mounts.group}
        ),
        "--dev",
        "/dev",
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
        args += ["--ro-bind", src, dest]
    for port, sock in options.services.items():
        args += ["--bind", str(sock), f"{SERVICES}/{port}.sock"]
    # The root itself is bubblewrap's tmpfs: make it read-only once everything is mounted.
    return [*args, "--remount-ro", "/", "--chdir", "/", "sh", f"{BIN}/init.sh"]


def launcher_argv(argv: list[str], mounts: Mounts, limits: Limits) -> list[str]:
    """``argv`` behind the overlay mount (if any), the rlimits and the cgroup join."""
    if mounts.overlay_dirs:
        d = mounts.overlay_dirs
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
            str(mounts.workspace),
            *argv,
        ]
    argv = limits.rlimit_args() + argv
    join = 'for f in $AGENTRL_CGROUPS; do echo $$ > "$f" || exit 97; done; exec "$@"'
    return ["sh", "-c", join, "sh", *argv]


async def launch(
    options: LocalOptions, mounts: Mounts, ro_binds: dict[str, str], limits: Limits
) -> BwrapProcess:
    """Start bubblewrap in a session of its own, its output and --info-fd JSON to files."""
    log, info = _open_outputs(mounts.state)
    argv = launcher_argv(sandbox_args(options, mounts, ro_binds, info.fileno()), mounts, limits)
    env = dict(os.environ, AGENTRL_CGROUPS=" ".join(limits.cgroup_procs))
    try:
        child = await asyncio.create_subprocess_exec(
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
    logger.debug("local sandbox %s: pid %s, limits %s", mounts.state, child.pid, limits.mode)
    return BwrapProcess(child=child, state=mounts.state)


def _open_outputs(state: pathlib.Path) -> tuple[IO[bytes], IO[bytes]]:
    """The files bubblewrap's output and its --info-fd JSON go to."""
    return open(state / "bwrap.log", "wb"), open(state / "info.json", "wb")


@attrs.define
class BwrapProcess:
    """A running bubblewrap instance: its launcher process and the sandbox's pid 1."""

    child: asyncio.subprocess.Process
    state: pathlib.Path
    #: Inode of the sandbox's pid namespace (processes in it belong to the sandbox).
    pid_namespace: int | None = None
    #: Host pid of the sandbox's pid 1 (``init.sh``).
    sandbox_init: int | None = None

    @property
    def pid(self) -> int:
        return self.child.pid

    @property
    def exited(self) -> bool:
        return self.child.returncode is not None

    def read_info(self) -> None:
        """Learn the pid namespace and pid 1 from bubblewrap's --info-fd JSON."""
        with contextlib.suppress(OSError, ValueError):
            info = json.loads((self.state / "info.json").read_text())
            self.pid_namespace = info["pid-namespace"]
            self.sandbox_init = info["child-pid"]

    def log_tail(self) -> str:
        """How it exited so far, with the end of bubblewrap's output, for an error message."""
        code = self.child.returncode
        try:
            text = (self.state / "bwrap.log").read_text(errors="replace").strip()
        except OSError:
            text = ""
        return (
            f"exit code {code}"
            + (f" ({_LAUNCHER_EXITS[code]})" if code in _LAUNCHER_EXITS else "")
            + (f": {text[-1500:]}" if text else "")
        )

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
