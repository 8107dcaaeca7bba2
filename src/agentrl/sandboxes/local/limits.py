"""Resource limits for the ``local`` sandbox: cgroup v1 or v2 where writable, else rlimits."""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import subprocess
import time

from agentrl.sandboxes.local.proc import kill_until_gone

logger = logging.getLogger(__name__)

_CGROUP_ROOT = pathlib.Path("/sys/fs/cgroup")


def _own_cgroups() -> dict[str, str]:
    """controller (or "" for the v2 unified hierarchy) -> this process's cgroup path."""
    paths: dict[str, str] = {}
    try:
        lines = pathlib.Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return paths
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def _v1_dir(controller: str, own: dict[str, str]) -> pathlib.Path | None:
    mount = _CGROUP_ROOT / controller
    if controller not in own or not (mount / "cgroup.procs").exists():
        return None
    parent = mount / own[controller].lstrip("/")
    return parent if os.access(parent, os.W_OK) else None


def _v2_dir(own: dict[str, str]) -> pathlib.Path | None:
    for mount in (_CGROUP_ROOT, _CGROUP_ROOT / "unified"):
        controllers = mount / "cgroup.controllers"
        if "" in own and controllers.exists():
            parent = mount / own[""].lstrip("/")
            try:
                enabled = (parent / "cgroup.subtree_control").read_text().split()
            except OSError:
                continue
            if {"memory", "pids"} <= set(enabled) and os.access(parent, os.W_OK):
                return parent
    return None


class Limits:
    """Memory and process-count limits for one sandbox's process tree.

    ``cgroup_procs`` lists the files the launcher writes its pid into before it execs
    bubblewrap, so every process of the sandbox is born inside the cgroups. Without a
    writable cgroup, ``rlimit_args`` caps each process with ``prlimit`` instead
    (weaker: per process, and RLIMIT_NPROC does not bind a host root user).
    """

    def __init__(self, tag: str, *, memory_mb: int | None, pids: int | None) -> None:
        self.memory_mb = memory_mb
        self.pids = pids
        self.dirs: list[pathlib.Path] = []
        #: The cgroup directories the sandbox's cgroups were created in.
        self.parents: list[pathlib.Path] = []
        self.mode = "none"
        if memory_mb is None and pids is None:
            return
        own = _own_cgroups()
        try:
            v1 = {c: _v1_dir(c, own) for c in ("memory", "pids")}
            if all(v1.values()):
                self._setup_v1(tag, v1)  # type: ignore[arg-type]
                self.mode = "cgroup-v1"
            elif (v2 := _v2_dir(own)) is not None:
                self._setup_v2(v2 / tag)
                self.mode = "cgroup-v2"
            if self.dirs:
                self._check_joinable()
                return
        except OSError as exc:
            logger.info("cgroup limits unavailable (%s); using rlimits", exc)
            self.remove(timeout=0.5)  # the throwaway process may take a moment to leave
            self.dirs, self.parents = [], []
        self.mode = "rlimit"

    def _setup_v1(self, name: str, parents: dict[str, pathlib.Path]) -> None:
        for controller, parent in parents.items():
            path = parent / name
            path.mkdir()
            self.dirs.append(path)
            self.parents.append(parent)
            if controller == "memory" and self.memory_mb is not None:
                limit = str(self.memory_mb * 1024 * 1024)
                (path / "memory.limit_in_bytes").write_text(limit)
                swap = path / "memory.memsw.limit_in_bytes"
                if swap.exists():
                    with contextlib.suppress(OSError):
                        swap.write_text(limit)
            if controller == "pids" and self.pids is not None:
                (path / "pids.max").write_text(str(self.pids))

    def _setup_v2(self, path: pathlib.Path) -> None:
        path.mkdir()
        self.dirs.append(path)
        self.parents.append(path.parent)
        if self.memory_mb is not None:
            (path / "memory.max").write_text(str(self.memory_mb * 1024 * 1024))
            with contextlib.suppress(OSError):
                (path / "memory.swap.max").write_text("0")
        if self.pids is not None:
            (path / "pids.max").write_text(str(self.pids))

    def _check_joinable(self) -> None:
        """Move a throwaway process into the cgroups, as the launcher will, or raise OSError."""
        join = 'for f in "$@"; do echo $$ > "$f" || exit 1; done'
        proc = subprocess.run(
            ["sh", "-c", join, "sh", *self.cgroup_procs],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise OSError(f"cannot move a process into the cgroup: {proc.stderr.strip()}")

    @property
    def cgroup_procs(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def rlimit_args(self) -> list[str]:
        if self.mode != "rlimit":
            return []
        args = ["prlimit"]
        if self.memory_mb is not None:
            args.append(f"--data={self.memory_mb * 1024 * 1024}")
        if self.pids is not None:
            args.append(f"--nproc={self.pids}")
        return [*args, "--"]

    def pids_inside(self) -> list[int]:
        found: set[int] = set()
        for path in self.cgroup_procs:
            with contextlib.suppress(OSError, ValueError):
                found.update(int(p) for p in pathlib.Path(path).read_text().split())
        return sorted(found)

    def kill_all(self, timeout: float = 5.0) -> list[int]:
        """SIGKILL every process in the cgroups until none is left; return any survivors."""
        for d in self.dirs:
            kill_file = d / "cgroup.kill"
            if kill_file.exists():
                with contextlib.suppress(OSError):
                    kill_file.write_text("1")
        return kill_until_gone(self.pids_inside, timeout)

    def remove(self, timeout: float = 0.0) -> None:
        """Remove the cgroups, retrying busy ones (whose last process is still leaving) for up
        to ``timeout`` seconds; any left stays in ``dirs``."""
        deadline = time.monotonic() + timeout
        while True:
            left = []
            for d in reversed(self.dirs):
                try:
                    d.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    left.append(d)
            self.dirs = left[::-1]
            if not self.dirs or time.monotonic() >= deadline:
                return
            time.sleep(0.02)
