"""Filesystem preparation for the ``local`` sandbox: root binds, images, the workspace."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

from agentrl import settings
from agentrl.sandboxes.base import SandboxError
from agentrl.sandboxes.local.launcher import WORKSPACE_INODES, Workspace, private_mount_namespace
from agentrl.sandboxes.local.proc import DEFAULT_PATH

logger = logging.getLogger(__name__)

#: Top-level host directories a host-root sandbox sees (read-only); everything else
#: (/root, /home, /tmp, /run, /var, /mnt, /srv, …) stays out.
HOST_ROOT_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt")
#: Files under a bound root that are replaced by an unreadable empty file.
MASKED_FILES = (
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/ssh/ssh_host_rsa_key",
    "/etc/ssh/ssh_host_ecdsa_key",
    "/etc/ssh/ssh_host_ed25519_key",
    "/etc/ssh/ssh_host_dsa_key",
)
#: Top-level directories of an image that the sandbox replaces with its own.
_IMAGE_SKIP = {"proc", "dev", "sys", "tmp", "root", "home", "run", ".agentrl"}
_TARBALL_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.xz", ".txz", ".tar.bz2", ".tar.zst")

_overlay_support: dict[str, bool] = {}


def cache_dir() -> pathlib.Path:
    """Where extracted image tarballs are kept: ``AGENTRL_CACHE_DIR`` or ~/.cache/agentrl."""
    configured = settings.get("AGENTRL_CACHE_DIR")
    if configured is not None:
        return configured
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return pathlib.Path(base, "agentrl")


def host_python_options(executable: str = sys.executable) -> dict[str, Any]:
    """``ro_binds`` and ``env`` that make this machine's Python (and its pytest) usable in a
    sandbox whose root is the host's.

    Such a sandbox shows only the host's system directories; an interpreter installed
    elsewhere (pyenv, a virtualenv under /root or /home) is bound in read-only at the same
    path and its directory put first on PATH. Third-party pytest plugin autoloading is
    turned off, because an editable install's source tree is not bound in.

    The directory the interpreter was started from is resolved (``..``, linked
    directories) once, for PATH and for its bind alike; the interpreter itself is not,
    because a venv's python links to the base one: every link on the way to the real
    file is made to resolve inside as it does here (``_link_binds``).
    """
    system_dirs = tuple(f"/{name}/" for name in HOST_ROOT_DIRS)
    bin_dir = os.path.realpath(os.path.dirname(os.path.abspath(executable)))
    candidates = (sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(executable)))
    binds: dict[str, str] = {}
    for prefix in sorted({*(os.path.realpath(p) for p in candidates), bin_dir}):
        # A prefix under a system directory, or under one bound already, is visible anyway.
        if not (prefix + "/").startswith((*system_dirs, *(b + "/" for b in binds))):
            binds[prefix] = prefix
    started = os.path.join(bin_dir, os.path.basename(executable))
    for dest, src in _link_binds(started):
        if not (dest + "/").startswith((*system_dirs, *(b + "/" for b in binds))):
            binds[dest] = src
    path = f"{bin_dir}:{DEFAULT_PATH}"
    return {"ro_binds": binds, "env": {"PATH": path, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}}


def _link_binds(executable: str) -> list[tuple[str, str]]:
    """(destination, source) binds for the directory of every link ``executable`` goes
    through after the first, so that the chain resolves in the sandbox as on the host
    (``links/python -> /work/app/.venv/bin/python``, with ``.venv`` itself a link)."""
    binds: list[tuple[str, str]] = []
    path = executable
    for _ in range(40):  # the kernel's own limit on links followed
        if not os.path.islink(path):
            break
        target = os.readlink(path)
        path = os.path.normpath(os.path.join(os.path.dirname(path), target))
        directory = os.path.dirname(path)
        binds.append((directory, os.path.realpath(directory)))
    return binds


def require_bwrap(bwrap: str) -> None:
    """Raise ``SandboxError`` when the bubblewrap executable ``bwrap`` is not installed."""
    if shutil.which(bwrap) is None:
        raise SandboxError(
            f"bubblewrap ({bwrap!r}) is not installed; install it "
            "(apt-get install bubblewrap) or use another sandbox backend"
        )


def check_sources(image: str | None, repo: str | None) -> None:
    """Raise ``SandboxError`` when the task's image or repository is not on this machine."""
    for kind, value in (("image", image), ("repo", repo)):
        if value is not None:
            _check_source(kind, value)


def host_search_path(
    image: str | None, env: Mapping[str, str], ro_binds: Mapping[str, str]
) -> str | None:
    """The sandbox's ``PATH`` when every directory on it is this machine's at the same path.

    That holds on the host's root (no image) for the bound system directories and for
    binds whose source is their destination; otherwise None.
    """
    if image is not None:
        return None
    path = env.get("PATH", DEFAULT_PATH)
    visible = (
        *(f"/{name}/" for name in HOST_ROOT_DIRS),
        *(dest.rstrip("/") + "/" for src, dest in ro_binds.items() if src == dest),
    )
    if all((entry.rstrip("/") + "/").startswith(visible) for entry in path.split(":") if entry):
        return path
    return None


def _is_tarball(path: pathlib.Path) -> bool:
    return path.is_file() and path.name.endswith(_TARBALL_SUFFIXES)


def _check_source(kind: str, value: str) -> pathlib.Path:
    path = pathlib.Path(value).expanduser().resolve()
    if path.is_dir() or _is_tarball(path):
        return path
    what = "does not exist" if not path.exists() else "is neither a directory nor a tarball"
    raise SandboxError(
        f"the task's {kind} {value!r} {what}; expected a directory or a tarball "
        f"({', '.join(_TARBALL_SUFFIXES)}); fix the task's `{kind}` field"
    )


def _extract(tarball: pathlib.Path, dest: pathlib.Path, *, keep_owner: bool) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    cmd = ["tar", "-xf", str(tarball), "-C", str(dest)]
    if not keep_owner:
        cmd.insert(1, "--no-same-owner")
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SandboxError(
            f"could not extract {tarball}: {proc.stderr.strip()[-500:]}; "
            "check that it is a readable tar archive"
        )


def prepare_image(image: str | None) -> pathlib.Path | None:
    """The root directory for ``image`` (a tarball is extracted once into the cache)."""
    if image is None:
        return None
    return _tree("image", image, keep_owner=os.geteuid() == 0)


def _tree(kind: str, value: str, *, keep_owner: bool) -> pathlib.Path:
    """The directory ``value`` names, or its tarball's contents extracted once into the
    cache (``images`` or ``repos``)."""
    path = _check_source(kind, value)
    if path.is_dir():
        return path
    stat = path.stat()
    key = hashlib.sha256(f"{path}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:24]
    target = cache_dir() / f"{kind}s" / key
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{key}-", dir=target.parent))
    logger.info("extracting %s %s into %s", kind, path, target)
    try:
        _extract(path, staging, keep_owner=keep_owner)
        staging.chmod(0o755)
        os.rename(staging, target)
    except OSError:
        if not target.is_dir():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def root_args(
    image_root: pathlib.Path | None, mask_file: pathlib.Path, etc_files: dict[str, pathlib.Path]
) -> list[str]:
    """bwrap arguments that build the read-only root from the host or an image.

    ``etc_files`` (name -> host file) replace or add files in /etc; when one is missing
    from the root, /etc becomes a tmpfs holding the root's entries plus these files.
    """
    args: list[str] = []
    if image_root is None:
        base = pathlib.Path("/")
        names = [n for n in HOST_ROOT_DIRS if os.path.lexists(f"/{n}")]
    else:
        base = image_root
        names = sorted(n for n in os.listdir(image_root) if n not in _IMAGE_SKIP)
    etc = base / "etc"
    expand_etc = (
        etc.is_dir()
        and not etc.is_symlink()
        and not all((etc / name).is_file() for name in etc_files)
    )
    for name in names:
        src = base / name
        if name == "etc" and expand_etc:
            args += ["--tmpfs", "/etc"]
            for entry in sorted(os.listdir(src)):
                if entry not in etc_files:
                    args += _bind_entry(src / entry, f"/etc/{entry}")
            for entry, host_file in etc_files.items():
                args += ["--ro-bind", str(host_file), f"/etc/{entry}"]
            args += ["--remount-ro", "/etc"]
        else:
            args += _bind_entry(src, f"/{name}")
    if "etc" not in names:
        raise SandboxError(f"the image {base} has no /etc directory; is it a root filesystem?")
    if not expand_etc:
        for name, host_file in etc_files.items():
            args += ["--ro-bind", str(host_file), f"/etc/{name}"]
    for masked in MASKED_FILES:
        if os.path.lexists(str(base) + masked) and not os.path.islink(str(base) + masked):
            args += ["--ro-bind", str(mask_file), masked]
    return args


def _bind_entry(src: pathlib.Path, dest: str) -> list[str]:
    if src.is_symlink():
        return ["--symlink", os.readlink(src), dest]
    if src.is_dir() or src.is_file():
        return ["--ro-bind", str(src), dest]
    return []


def account_files(
    image_root: pathlib.Path | None, state: pathlib.Path, uid: int
) -> tuple[pathlib.Path, pathlib.Path]:
    """passwd and group files naming ``root`` (0) and ``agent`` (``uid``)."""
    base = image_root or pathlib.Path("/")
    out = []
    for name, line in (
        ("passwd", f"agent:x:{uid}:{uid}:agent:/home/agent:/bin/sh"),
        ("group", f"agent:x:{uid}:"),
    ):
        try:
            rows = (base / "etc" / name).read_text(errors="replace").splitlines()
        except OSError:
            rows = []
        kept = [r for r in rows if r.split(":")[0] != "agent" and r.split(":")[2:3] != [str(uid)]]
        if not any(r.startswith("root:") for r in kept):
            kept.insert(0, "root:x:0:0:root:/root:/bin/sh" if name == "passwd" else "root:x:0:")
        target = state / name
        target.write_text("\n".join([*kept, line]) + "\n")
        out.append(target)
    return out[0], out[1]


def overlay_supported(scratch: pathlib.Path, *, metacopy: bool = False) -> bool:
    """Whether kernel overlayfs (with ``metacopy=on``, if asked) can be mounted in a private
    mount namespace here."""
    key = f"{scratch}:{metacopy}"
    if key in _overlay_support:
        return _overlay_support[key]
    probe = pathlib.Path(tempfile.mkdtemp(prefix="overlay-probe-", dir=scratch))
    extra = ",metacopy=on" if metacopy else ""
    try:
        for sub in ("lower", "upper", "work", "merged"):
            (probe / sub).mkdir()
        (probe / "lower" / "f").write_text("x")
        script = (
            f'mount -t overlay overlay -o "lowerdir=$1/lower,upperdir=$1/upper,workdir=$1/work{extra}" '
            '"$1/merged" && echo y >> "$1/merged/f"'
        )
        proc = subprocess.run(
            [*private_mount_namespace(), "sh", "-c", script, "sh", str(probe)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        ok = proc.returncode == 0 and (probe / "upper" / "f").is_file()
        if not ok:
            logger.info("overlayfs%s not available (%s)", extra, proc.stderr.strip())
    except (OSError, subprocess.SubprocessError) as exc:
        logger.info("overlayfs probe failed (%s)", exc)
        ok = False
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    _overlay_support[key] = ok
    return ok


def plan_workspace(
    repo: str | None,
    state: pathlib.Path,
    overlay: str,
    *,
    workspace_size_mb: int,
    root_host: bool,
) -> Workspace:
    """How the launcher makes the workspace area (see ``launcher``).

    ``overlay`` is ``"auto"`` (overlayfs when it mounts here, else a copy), ``"never"`` or
    ``"require"``. A repository tarball is extracted once into the cache and used like a
    directory. On a root host the overlay needs ``metacopy=on``, so that handing the files
    to the sandbox's uid copies no data. The source is never written either way.
    """
    if repo is None:
        return Workspace(mode="copy", source=None, size_mb=workspace_size_mb)
    src = _tree("repo", repo, keep_owner=False)
    if overlay != "never" and overlay_supported(state.parent, metacopy=root_host):
        # Handing every file over copies each one's metadata up: an inode apiece.
        entries = _tree_usage(src)[1] if root_host else 0
        return Workspace(
            mode="overlay",
            source=src,
            size_mb=workspace_size_mb,
            metacopy=root_host,
            inodes=WORKSPACE_INODES + entries,
        )
    if overlay == "require":
        raise SandboxError(
            "overlay='require' but overlayfs cannot be mounted here (needs root with "
            "metacopy support, or an unprivileged-overlay kernel ≥ 5.11 with user "
            "namespaces); use overlay='auto'"
        )
    size_mb, entries = _tree_usage(src)
    return Workspace(
        mode="copy",
        source=src,
        size_mb=size_mb + workspace_size_mb,
        inodes=WORKSPACE_INODES + entries,
    )


def _tree_usage(root: pathlib.Path) -> tuple[int, int]:
    """An upper bound of what a copy of ``root`` takes on a tmpfs: MiB (pages rounded), and
    the number of entries."""
    total = entries = 0
    for dirpath, dirnames, filenames in os.walk(root):
        entries += len(dirnames) + len(filenames)
        total += 4096 * (len(dirnames) + 1)
        for name in filenames:
            with contextlib.suppress(OSError):
                size = os.lstat(os.path.join(dirpath, name)).st_size
                total += -(-size // 4096) * 4096 or 4096
    return -(-total // (1 << 20)) + 1, entries
