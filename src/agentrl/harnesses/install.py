"""Putting a harness's agent CLI into a sandbox: npm tarballs, a host install, or the ``PATH``.

:meth:`Harness.install <agentrl.harnesses.base.Harness.install>` is :func:`install_cli`, and
:meth:`Harness.host_install <agentrl.harnesses.base.Harness.host_install>` is
:func:`host_install`. The install sources, first that applies:

* ``tarballs``: host paths of npm tarballs (``npm pack`` output, the CLI's package plus its
  platform package), uploaded and installed with ``npm install -g`` into
  ``{state_dir}/npm`` (``--offline`` unless ``npm_offline=False``), retried with jittered
  backoff on transient npm failures;
* ``cli_path``: the CLI's executable as the sandbox sees it (e.g. a host install bound
  read-only into a local sandbox, see :func:`host_install`);
* otherwise the CLI's binary name on the sandbox's ``PATH`` (where an ``image`` harness's
  CLI always comes from).

The CLI must answer ``binary *version_args`` (``--version``) in the sandbox, with at least
the harness's ``min_version`` when it states one. ``node_tarball`` (a Node.js ``linux-x64`` tar archive on the host) is unpacked first when
the sandbox has no ``node``. Installing the pinned CLIs on the host itself is
:mod:`agentrl.harnesses.install_clis`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pathlib
import shlex
from typing import TYPE_CHECKING, ClassVar, Protocol

from agentrl.harnesses.errors import HarnessError
from agentrl.harnesses.kinds import check_min_version, install_hint, install_kind, package_of
from agentrl.harnesses.npm import npm_install_specs, package_bin, run_npm_install
from agentrl.retry import RetryPolicy

if TYPE_CHECKING:
    from agentrl.sandboxes.base import Sandbox

__all__ = ["InstallTarget", "host_install", "install_cli"]

logger = logging.getLogger(__name__)


class InstallTarget(Protocol):
    """What the installer needs of a harness (``agentrl.harnesses.base.Harness`` has it)."""

    name: ClassVar[str]
    binary: ClassVar[str]
    install_kind: ClassVar[str]
    npm_package: ClassVar[str]
    version_args: ClassVar[tuple[str, ...]]
    cli_path: str | None
    tarballs: tuple[str, ...]
    node_tarball: str | None
    npm_offline: bool
    install_attempts: int
    install_backoff: float
    state_dir: str

    @property
    def launcher(self) -> str: ...

    @property
    def home(self) -> str: ...

    def with_path(self, cmd: str) -> str: ...

    async def _root(self, sandbox: Sandbox, cmd: str, *, timeout: float = 120) -> None: ...


async def install_cli(harness: InstallTarget, sandbox: Sandbox) -> str:
    """Make ``harness``'s CLI runnable in ``sandbox``; returns the real path of its executable.

    The CLI is linked at ``harness.launcher`` and must answer ``--version`` (the harness's
    ``version_args``) there, with at least its ``min_version``.
    """
    q_state = shlex.quote(harness.state_dir)
    await harness._root(sandbox, f"mkdir -p {q_state}/bin {q_state}/home && chmod 755 {q_state}")
    if harness.node_tarball:
        await _install_node(harness, sandbox)
    if harness.tarballs:
        target = await _npm_install(harness, sandbox)
    else:
        target = await _find_preinstalled(harness, sandbox)
    launcher = shlex.quote(harness.launcher)
    await harness._root(sandbox, f"ln -sfn {shlex.quote(target)} {launcher}")
    version_args = tuple(getattr(harness, "version_args", ("--version",)))
    probe = await sandbox.exec(
        harness.with_path(shlex.join([harness.launcher, *version_args])),
        user="root",
        env={"HOME": harness.home},
        timeout=120,
    )
    if probe.exit_code != 0:
        raise HarnessError(
            f"{harness.name}: `{shlex.join([harness.binary, *version_args])}` failed in the "
            f"sandbox (exit {probe.exit_code}): {(probe.stderr or probe.stdout).strip()[-800:]}; "
            f"check that the {package_of(harness)} install matches the sandbox's OS, "
            "architecture and (for a Python package) python3 version"
        )
    check_min_version(harness, probe.stdout + probe.stderr)
    logger.info("%s: installed %s (%s)", harness.name, target, probe.stdout.strip()[:80])
    return target


async def _find_preinstalled(harness: InstallTarget, sandbox: Sandbox) -> str:
    where = harness.cli_path or f"`{harness.binary}` on the sandbox PATH"
    script = (
        f'p={shlex.quote(harness.cli_path)}; [ -x "$p" ] && readlink -f "$p"'
        if harness.cli_path
        else f'p=$(command -v {shlex.quote(harness.binary)}) && readlink -f "$p"'
    )
    found = await sandbox.exec(harness.with_path(script), user="root", timeout=30)
    path = found.stdout.strip()
    if found.exit_code != 0 or not path:
        raise HarnessError(
            f"{harness.name}: no {harness.binary} CLI found ({where} is missing or not "
            f"executable). {install_hint(harness)}"
        )
    return path


async def _install_node(harness: InstallTarget, sandbox: Sandbox) -> None:
    has_node = await sandbox.exec(harness.with_path("command -v node"), user="root", timeout=30)
    if has_node.exit_code == 0:
        return
    assert harness.node_tarball is not None
    remote = f"{harness.state_dir}/{pathlib.Path(harness.node_tarball).name}"
    await sandbox.write_file(remote, pathlib.Path(harness.node_tarball))
    node_dir = shlex.quote(f"{harness.state_dir}/node")
    await harness._root(
        sandbox,
        f"mkdir -p {node_dir} && tar -xf {shlex.quote(remote)} -C {node_dir} "
        f"--strip-components=1 && rm -f {shlex.quote(remote)}",
        timeout=300,
    )


async def _npm_install(harness: InstallTarget, sandbox: Sandbox) -> str:
    specs = await asyncio.to_thread(npm_install_specs, harness.tarballs)
    remote = []
    await harness._root(sandbox, f"mkdir -p {shlex.quote(harness.state_dir)}/pkgs")
    for tarball, alias in specs:
        path = f"{harness.state_dir}/pkgs/{pathlib.Path(tarball).name}"
        await sandbox.write_file(path, pathlib.Path(tarball))
        remote.append(f"{alias}@file:{path}" if alias else path)
    prefix = f"{harness.state_dir}/npm"
    env = {
        "HOME": f"{harness.state_dir}/npm-home",
        "npm_config_prefix": prefix,
        "npm_config_cache": f"{harness.state_dir}/npm-cache",
        "npm_config_update_notifier": "false",
        "npm_config_fund": "false",
        "npm_config_audit": "false",
        "npm_config_engine_strict": "false",
    }
    # Offline by default: the tarballs carry everything, and npm would otherwise try
    # to fetch the metadata of every optional platform package and hang without a
    # registry. An optional package npm cannot resolve offline is skipped.
    offline = " --offline" if harness.npm_offline else ""
    cmd = harness.with_path(
        f"npm install -g --no-save --loglevel=error{offline} " + " ".join(map(shlex.quote, remote))
    )
    await run_npm_install(
        lambda: sandbox.exec(cmd, user="root", env=env, timeout=900, idempotent=False),
        what=f"{harness.name}: `npm install -g` of {', '.join(harness.tarballs)}",
        policy=RetryPolicy(attempts=harness.install_attempts, base=harness.install_backoff),
    )
    return await _find_in_prefix(harness, sandbox, prefix)


async def _find_in_prefix(harness: InstallTarget, sandbox: Sandbox, prefix: str) -> str:
    path = f"{prefix}/bin/{harness.binary}"
    found = await sandbox.exec(f"readlink -f {shlex.quote(path)}", user="root", timeout=30)
    target = found.stdout.strip()
    if found.exit_code != 0 or not target:
        raise HarnessError(
            f"{harness.name}: npm installed the tarballs but {path} is missing; "
            f"are they the {harness.npm_package} package (and its platform package)?"
        )
    return target


def host_install(
    harness_cls: type[InstallTarget], install_dir: str | os.PathLike[str]
) -> tuple[dict[str, str], str]:
    """Read-only binds and ``cli_path`` for a host install a sandbox should run as is.

    ``install_dir`` holds ``bin/<binary>`` (what ``agentrl install-clis`` writes), or
    is the CLI's npm package directory (``PREFIX/lib/node_modules/<package>`` of an
    ``npm install -g``; its ``package.json`` names the executable). An ``image``
    harness has no host install (``HarnessError``). The directory
    is bound at its own resolved path, so the install's absolute symlinks keep
    working: pass the binds to the sandbox (the ``local`` backend's ``ro_binds``) and
    ``cli_path`` to the harness.
    """
    name, binary = harness_cls.name, harness_cls.binary
    kind = install_kind(harness_cls)
    if kind == "image":
        raise HarnessError(
            f"{name}: the CLI comes from the sandbox's image (install_kind 'image'), so there "
            "is no host install to bind; drop --cli-dir / install_dir"
        )
    root = pathlib.Path(install_dir).expanduser().resolve()
    link = root / "bin" / binary
    if not link.exists() and kind == "npm":
        link = package_bin(root, harness_cls.npm_package, binary) or link
    if not link.exists():
        other = (
            f", or at the {harness_cls.npm_package} npm package directory" if kind == "npm" else ""
        )
        raise HarnessError(
            f"{name}: {link} does not exist; install the {package_of(harness_cls)} with "
            f"`agentrl install-clis` (or point install_dir at an install holding bin/{binary}"
            f"{other})"
        )
    target = link.resolve()
    if not target.is_relative_to(root):
        raise HarnessError(
            f"{name}: {link} points outside {root} (to {target}); a sandbox would "
            "not see it. Install the CLI inside the directory you bind"
        )
    return {str(root): str(root)}, str(target)
