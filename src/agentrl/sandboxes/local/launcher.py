"""How the ``local`` sandbox's bubblewrap is started, before any of the sandbox runs.

The launcher is a short ``sh`` chain, all in the sandbox's own process (one pid, by
``exec``): join the sandbox's cgroups → enter a private mount namespace (``unshare``; a user
namespace too on a host that is not root) → mount the sandbox's size-limited areas there →
drop to an unprivileged host uid (on a root host) → ``exec`` bubblewrap. The areas:

- **output** (``state/out``): a tmpfs of ``output_size_mb`` owned by the sandbox's uid, bound
  writable at ``/.agentrl/out``. It exists only in the launcher's mount namespace: the host
  reads it through ``/proc/<pid>/root`` with one directory descriptor, never by path, and
  it vanishes with the sandbox.
- **workspace** (``state/workspace``): overlayfs over the repository with its upper layer on
  a tmpfs of ``workspace_size_mb``, or a tmpfs holding a copy of the repository plus
  ``workspace_size_mb``. On a root host every file in it is handed (``chown -hR``, never
  following a link) to the sandbox's host uid; with ``metacopy=on`` that copies metadata
  only.
- **staged binds** (root host only): the unprivileged uid may not reach what bubblewrap
  binds (the state directory under a private temp directory, an image under
  ``/root/.cache``, a ``ro_binds`` directory, a service socket), so the launcher binds each
  of them under ``/run/agentrl-local/<sandbox>`` (root-owned, traversable, see
  ``stage_base``) first, and bubblewrap, already unprivileged, binds those instead.

A full area makes writes inside fail with ``ENOSPC``; the host never sees the pages, which
are charged to the sandbox's memory cgroup like any tmpfs page it writes.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shlex
import stat
import tempfile

import attrs

from agentrl.sandboxes.local.proc import DEFAULT_PATH

__all__ = [
    "LAUNCHER_EXITS",
    "HostIds",
    "Workspace",
    "grant_socket",
    "host_ids",
    "launcher_argv",
    "private_mount_namespace",
    "stage_base",
]

#: Exit codes of the launcher's own steps, before bubblewrap runs.
LAUNCHER_EXITS = {
    96: "could not prepare the workspace",
    97: "could not join the sandbox's cgroup",
    98: "could not mount the sandbox's areas",
}
#: Inodes the output and workspace tmpfs areas may hold (their pages count as memory).
OUTPUT_INODES = 65536
WORKSPACE_INODES = 262144
#: The first id of the range used when the host has no subordinate ids for root.
_FALLBACK_ID_BASE = 100000


@attrs.frozen
class HostIds:
    """The host uid and gid a root host runs its sandboxes as (never 0)."""

    uid: int
    gid: int


def _subordinate_start(path: str, name: str = "root") -> int | None:
    try:
        lines = pathlib.Path(path).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.strip().split(":")
        if len(fields) == 3 and fields[0] in (name, "0") and fields[1].isdigit():
            return int(fields[1])
    return None


def host_ids(host_uid: int | None, agent_uid: int) -> HostIds | None:
    """What the sandbox's ids map to on a root host; None on a host that is not root.

    ``host_uid`` when given, else root's first subordinate id (``/etc/subuid``, or 100000)
    plus ``agent_uid``. The gid is the same number.
    """
    if os.geteuid() != 0:
        return None
    if host_uid is None:
        base = _subordinate_start("/etc/subuid")
        host_uid = (base if base is not None else _FALLBACK_ID_BASE) + agent_uid
    if host_uid <= 0:
        raise ValueError(f"host_uid must be an unprivileged id (> 0), got {host_uid}")
    return HostIds(host_uid, host_uid)


@attrs.frozen(kw_only=True)
class Workspace:
    """How the workspace area is made: ``mode`` is ``"overlay"`` or ``"copy"``."""

    mode: str
    #: The repository tree (the overlay's lower layer, or what is copied); None: empty.
    source: pathlib.Path | None
    #: Size of the tmpfs (the overlay's upper layer, or the copy and its growth).
    size_mb: int
    metacopy: bool = False
    #: Inodes the tmpfs may hold.
    inodes: int = WORKSPACE_INODES


def stage_base() -> pathlib.Path:
    """Where a root host stages what its unprivileged sandboxes bind: a root-owned directory
    every id may traverse (``/run/agentrl-local``, or under the temp directory)."""
    parent = pathlib.Path("/run") if os.path.isdir("/run") else pathlib.Path(tempfile.gettempdir())
    base = parent / "agentrl-local"
    with contextlib.suppress(FileExistsError):
        base.mkdir(mode=0o711)
    st = os.lstat(base)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise OSError(f"{base} is not a root-owned directory only root can write; remove it")
    base.chmod(0o711)
    return base


def grant_socket(sock: pathlib.Path, ids: HostIds) -> None:
    """Let the sandbox's host gid connect to the unix socket ``sock`` (group read-write)."""
    st = os.stat(sock)
    if not stat.S_ISSOCK(st.st_mode):
        return
    if st.st_gid != ids.gid:
        os.chown(sock, -1, ids.gid)
    if st.st_mode & 0o060 != 0o060:
        os.chmod(sock, stat.S_IMODE(st.st_mode) | 0o060)


def _mount_script(
    state: pathlib.Path,
    *,
    output_size_mb: int,
    workspace: Workspace,
    ids: HostIds | None,
    staged: dict[str, str],
) -> str:
    q = shlex.quote
    owner = f",uid={ids.uid},gid={ids.gid}" if ids else ""
    out, ws, data = state / "out", state / "workspace", state / "ws-data"
    lines = [
        'fail() { echo "agentrl: $2" >&2; exit "$1"; }',
        f"mount -t tmpfs -o size={output_size_mb}m,nr_inodes={OUTPUT_INODES},mode=0700{owner} "
        f"tmpfs {q(str(out))} || fail 98 'could not mount the output area'",
    ]
    tmpfs = f"size={workspace.size_mb}m,nr_inodes={workspace.inodes},mode=0755"
    if workspace.mode == "overlay":
        assert workspace.source is not None
        extra = ",metacopy=on" if workspace.metacopy else ""
        lines += [
            f"mount -t tmpfs -o {tmpfs} tmpfs {q(str(data))} "
            "|| fail 98 'could not mount the workspace area'",
            f"mkdir {q(str(data / 'upper'))} {q(str(data / 'work'))} || fail 96 'no upper layer'",
            f"mount -t overlay overlay -o {q(f'lowerdir={workspace.source},upperdir={data}/upper,workdir={data}/work{extra}')} "
            f"{q(str(ws))} || fail 98 'could not mount the overlay'",
        ]
    else:
        lines.append(
            f"mount -t tmpfs -o {tmpfs} tmpfs {q(str(ws))} "
            "|| fail 98 'could not mount the workspace area'"
        )
        if workspace.source is not None:
            lines.append(
                f"cp -R --preserve=mode,timestamps,links {q(str(workspace.source) + '/.')} "
                f"{q(str(ws))} || fail 96 'could not copy the repository'"
            )
    if ids:
        # -h: a link in the repository is re-owned itself, its target never touched.
        lines.append(
            f"chown -hR {ids.uid}:{ids.gid} {q(str(ws))} || fail 96 'could not hand over the workspace'"
        )
    for target, source in staged.items():
        # --rbind: the state directory's own areas (output, workspace) come along.
        lines.append(
            f"mount --rbind {q(source)} {q(target)} || fail 98 {q('could not stage ' + source)}"
        )
    lines.append('exec "$@"')
    return "\n".join(lines)


def private_mount_namespace() -> list[str]:
    """The command prefix that gives a process a mount namespace of its own (and, on a host
    that is not root, a user namespace in which it may mount)."""
    prefix = ["unshare", "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        prefix[1:1] = ["--user", "--map-root-user"]
    return [*prefix, "--"]


def launcher_argv(
    bwrap_argv: list[str],
    *,
    state: pathlib.Path,
    cgroup_procs: list[str],
    rlimit_args: list[str],
    output_size_mb: int,
    workspace: Workspace,
    ids: HostIds | None,
    staged: dict[str, str],
) -> list[str]:
    """The whole command line that ends in ``bwrap_argv`` (see the module docstring)."""
    drop: list[str] = []
    if ids:
        drop = ["setpriv", f"--reuid={ids.uid}", f"--regid={ids.gid}", "--clear-groups", "--"]
    mounts = _mount_script(
        state, output_size_mb=output_size_mb, workspace=workspace, ids=ids, staged=staged
    )
    join = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 97; shift; done; shift; exec "$@"'
    return [
        "sh",
        "-c",
        join,
        "sh",
        *cgroup_procs,
        "--",
        *private_mount_namespace(),
        "sh",
        "-c",
        mounts,
        "sh",
        "env",
        "-i",
        f"PATH={DEFAULT_PATH}",
        *rlimit_args,
        *drop,
        *bwrap_argv,
    ]
