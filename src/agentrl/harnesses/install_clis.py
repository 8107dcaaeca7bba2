"""The agent CLIs on this host: :func:`install_clis` installs the pinned versions (the
command ``agentrl install-clis``), and :func:`find_cli_dir` finds an install for the local
sandbox to bind.

An install directory (``--dest``) looks like this; the ``.installed`` stamp is written once
npm (or pip) has finished, so a second run skips every pin already there::

    DEST/bin/claude            -> DEST/claude-2.1.332/node_modules/.bin/claude
    DEST/bin/claude-2.1.197    -> DEST/claude-2.1.197/node_modules/.bin/claude
    DEST/bin/codex             -> DEST/codex-0.171.0/node_modules/.bin/codex
    DEST/bin/qwen              -> DEST/qwen-0.24.4/node_modules/.bin/qwen
    DEST/bin/opencode          -> DEST/opencode-1.18.33/node_modules/.bin/opencode
    DEST/bin/<python cli>      -> ../<binary>-<version>/bin/<binary>   (see agentrl.harnesses.pip)
    DEST/<binary>-<version>/.installed

A pin is an npm package (``kind="npm"``) or a Python package (``kind="python"``, installed
with pip by the Python that runs agentrl); a harness whose CLI comes from the image
(``install_kind = "image"``) has no pin.

Claude Code 2.1.332 is a native binary that runs on Node 20 although its package declares
``engines.node >= 22``; 2.1.197 is the newest declaring ``node >= 18`` (what a plain npm
install picks on Node 20). Qwen Code 0.24.4 (the newest 0.24.x) also declares
``engines.node >= 22``; its headless mode runs on Node 20 (only the optional OpenTUI
interface uses Node 22 APIs). opencode's bin is a native binary that its package's
postinstall links from the platform package (``opencode-linux-x64``); it needs no Node at
run time. ``CLAUDE_CODE_VERSION``, ``CLAUDE_CODE_NODE18_VERSION``, ``CODEX_VERSION``,
``QWEN_CODE_VERSION``, ``OPENCODE_VERSION`` and ``MINI_SWE_AGENT_VERSION`` override the
pins.
"""

from __future__ import annotations

import logging
import os
import pathlib
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence

import attrs

from agentrl import settings
from agentrl.harnesses.claude_code import ClaudeCodeHarness
from agentrl.harnesses.codex import CodexHarness
from agentrl.harnesses.errors import HarnessError
from agentrl.harnesses.mini_swe_agent import MiniSweAgentHarness
from agentrl.harnesses.npm import is_transient_npm, npm_package_dir
from agentrl.harnesses.opencode import OpencodeHarness
from agentrl.harnesses.pip import pip_install
from agentrl.harnesses.qwen_code import QwenCodeHarness
from agentrl.retry import RetryPolicy
from agentrl.tokenizers import default_cache_dir

logger = logging.getLogger(__name__)

__all__ = [
    "GROUPS",
    "PINS",
    "CliPin",
    "PinnedCli",
    "cli_dir_candidates",
    "cli_dir_from_path",
    "default_dest",
    "find_cli_dir",
    "install_clis",
    "pinned_clis",
]

#: The file that marks a finished install of one pin.
STAMP = ".installed"
_NPM_FLAGS = (
    "--no-save",
    "--no-audit",
    "--no-fund",
    "--no-package-lock",
    # claude-code and qwen-code declare node >= 22 but run on Node 20 (see above).
    "--engine-strict=false",
    "--loglevel=error",
)
_VERSION = re.compile(r"\b(\d+\.\d+\.\d+(?:-[0-9A-Za-z.]+)?)")


@attrs.frozen(kw_only=True)
class CliPin:
    """One pinned CLI: its package, executable, default version and override variable."""

    group: str
    package: str
    binary: str
    version_var: str
    default_version: str
    #: Linked as ``bin/<binary>-<version>`` (a second version beside the main one).
    versioned_link: bool = False
    #: ``npm`` or ``python`` (pip); ``module`` is what a Python CLI's launcher runs.
    kind: str = "npm"
    module: str = ""

    def resolve(self, environ: Mapping[str, str] | None = None) -> PinnedCli:
        version = settings.get(self.version_var, environ) or self.default_version
        link = f"{self.binary}-{version}" if self.versioned_link else self.binary
        return PinnedCli(
            package=self.package,
            version=version,
            binary=self.binary,
            link=link,
            kind=self.kind,
            module=self.module,
        )


@attrs.frozen(kw_only=True)
class PinnedCli:
    """One CLI version to install: where it goes under DEST and what ``bin/`` link names it."""

    package: str
    version: str
    binary: str
    link: str
    kind: str = "npm"
    module: str = ""

    @property
    def spec(self) -> str:
        return f"{self.package}{'==' if self.kind == 'python' else '@'}{self.version}"

    def prefix(self, dest: pathlib.Path) -> pathlib.Path:
        return dest / f"{self.binary}-{self.version}"

    def executable(self, dest: pathlib.Path) -> pathlib.Path:
        if self.kind == "python":
            return self.prefix(dest) / "bin" / self.binary
        return self.prefix(dest) / "node_modules" / ".bin" / self.binary


# The package and executable names are the harnesses' own.
PINS: tuple[CliPin, ...] = (
    CliPin(
        group="claude",
        package=ClaudeCodeHarness.npm_package,
        binary=ClaudeCodeHarness.binary,
        version_var="CLAUDE_CODE_VERSION",
        default_version="2.1.332",
    ),
    CliPin(
        group="claude",
        package=ClaudeCodeHarness.npm_package,
        binary=ClaudeCodeHarness.binary,
        version_var="CLAUDE_CODE_NODE18_VERSION",
        default_version="2.1.197",
        versioned_link=True,
    ),
    CliPin(
        group="codex",
        package=CodexHarness.npm_package,
        binary=CodexHarness.binary,
        version_var="CODEX_VERSION",
        default_version="0.171.0",
    ),
    CliPin(
        group="qwen",
        package=QwenCodeHarness.npm_package,
        binary=QwenCodeHarness.binary,
        version_var="QWEN_CODE_VERSION",
        default_version="0.24.4",
    ),
    CliPin(
        group="opencode",
        package=OpencodeHarness.npm_package,
        binary=OpencodeHarness.binary,
        version_var="OPENCODE_VERSION",
        default_version="1.18.33",
    ),
    CliPin(
        group="mini",
        package=MiniSweAgentHarness.python_package,
        binary=MiniSweAgentHarness.binary,
        version_var="MINI_SWE_AGENT_VERSION",
        default_version="2.4.6",
        kind="python",
        module=MiniSweAgentHarness.python_module,
    ),
)
GROUPS = tuple(dict.fromkeys(pin.group for pin in PINS))


def pinned_clis(
    only: Sequence[str] = (), environ: Mapping[str, str] | None = None
) -> list[PinnedCli]:
    """The CLI versions to install (all groups unless ``only`` names some), overrides applied."""
    return [pin.resolve(environ) for pin in PINS if not only or pin.group in only]


def _main_pin(binary: str, environ: Mapping[str, str] | None = None) -> PinnedCli | None:
    for pin in PINS:
        if pin.binary == binary and not pin.versioned_link:
            return pin.resolve(environ)
    return None


# -- install -------------------------------------------------------------------------------
def default_dest() -> pathlib.Path:
    """``$AGENTRL_CLI_DIR``, else ``clis/`` under agentrl's cache (``~/.cache/agentrl``)."""
    configured = settings.get("AGENTRL_CLI_DIR")
    return configured if configured is not None else default_cache_dir() / "clis"


def _installed(cli: PinnedCli, dest: pathlib.Path) -> bool:
    exe = cli.executable(dest)
    return (cli.prefix(dest) / STAMP).is_file() and os.access(exe, os.X_OK)


def _link(link: pathlib.Path, target: pathlib.Path) -> None:
    """Point ``link`` at ``target``, touching nothing when it already does."""
    if link.is_symlink() and os.readlink(link) == str(target):
        return
    if link.exists() and not link.is_symlink():
        raise HarnessError(
            f"{link} exists and is not a symlink; move it away, then rerun agentrl install-clis"
        )
    staging = link.with_name(f".{link.name}.{os.getpid()}")
    staging.unlink(missing_ok=True)
    os.symlink(target, staging)
    os.replace(staging, link)


def _npm_install(npm: str, cli: PinnedCli, dest: pathlib.Path, attempts: int) -> None:
    prefix = cli.prefix(dest)
    argv = [npm, "install", "--prefix", str(prefix), *_NPM_FLAGS, cli.spec]
    for attempt in range(1, attempts + 1):
        shutil.rmtree(prefix, ignore_errors=True)
        prefix.mkdir(parents=True)
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        except OSError as exc:
            raise HarnessError(f"could not run {npm}: {exc}; check your Node.js install") from exc
        if proc.returncode == 0:
            break
        output = (proc.stderr + "\n" + proc.stdout).strip()
        transient = is_transient_npm(output)
        if not transient or attempt == attempts:
            raise HarnessError(
                f"`npm install {cli.spec}` failed (exit {proc.returncode}, attempt "
                f"{attempt}/{attempts}): {output[-1500:] or 'no output'}; check the version "
                "and your access to the npm registry, then rerun agentrl install-clis"
            )
        delay = RetryPolicy(attempts=attempts).delay(attempt)
        logger.warning("npm install %s failed transiently, retrying in %.1fs", cli.spec, delay)
        time.sleep(delay)
    if not os.access(cli.executable(dest), os.X_OK):
        raise HarnessError(
            f"npm installed {cli.spec} but {cli.executable(dest)} is missing; is "
            f"{cli.package} the package that provides `{cli.binary}`?"
        )
    (prefix / STAMP).touch()


def install_clis(
    dest: str | os.PathLike[str],
    clis: Sequence[PinnedCli],
    *,
    report: Callable[[str], None] = logger.info,
    attempts: int = 3,
) -> list[pathlib.Path]:
    """Install each of ``clis`` into ``dest`` with npm or pip, skipping those already installed.

    Returns the ``bin/`` links. npm is needed only when an npm pin is missing; a transient
    failure (network, registry 429/5xx) is retried with jittered backoff.
    """
    root = pathlib.Path(dest).expanduser().resolve()
    (root / "bin").mkdir(parents=True, exist_ok=True)
    npm: str | None = None
    links = []
    for cli in clis:
        if _installed(cli, root):
            report(f"{cli.spec} already installed in {cli.prefix(root)}")
        elif cli.kind == "python":
            report(f"installing {cli.spec} into {cli.prefix(root)} (pip)")
            started = time.monotonic()
            pip_install(
                package=cli.package,
                version=cli.version,
                binary=cli.binary,
                module=cli.module,
                prefix=cli.prefix(root),
                attempts=attempts,
            )
            (cli.prefix(root) / STAMP).touch()
            report(f"installed {cli.spec} in {time.monotonic() - started:.0f}s")
        else:
            npm = npm or shutil.which("npm")
            if npm is None:
                raise HarnessError(
                    f"npm is not on PATH, and {cli.spec} must be installed with it; "
                    "install Node.js >= 20 with npm, then rerun agentrl install-clis"
                )
            report(f"installing {cli.spec} into {cli.prefix(root)} (npm)")
            started = time.monotonic()
            _npm_install(npm, cli, root, attempts)
            report(f"installed {cli.spec} in {time.monotonic() - started:.0f}s")
        link = root / "bin" / cli.link
        target = cli.executable(root)
        if cli.kind == "python":
            # Relative: the link keeps pointing inside DEST wherever DEST is bound or moved.
            target = pathlib.Path(os.path.relpath(target, link.parent))
        _link(link, target)
        links.append(link)
    return links


# -- find ----------------------------------------------------------------------------------
def _checkout_cli_dir() -> pathlib.Path | None:
    """``.cache/clis`` of the source checkout agentrl runs from, if it runs from one."""
    checkout = pathlib.Path(__file__).resolve().parents[3]
    return checkout / ".cache" / "clis" if (checkout / "pyproject.toml").is_file() else None


def cli_dir_candidates() -> list[pathlib.Path]:
    """Where an install directory is looked for, in order.

    ``$AGENTRL_CLI_DIR``, ``.cache/clis`` in the current directory, the source checkout's
    ``.cache/clis``, then ``agentrl install-clis``'s default under agentrl's cache.
    """
    configured = settings.get("AGENTRL_CLI_DIR")
    candidates = [configured] if configured is not None else []
    candidates.append(pathlib.Path(".cache/clis"))
    checkout = _checkout_cli_dir()
    if checkout is not None:
        candidates.append(checkout)
    candidates.append(default_cache_dir() / "clis")
    return candidates


def find_cli_dir(binary: str | None = None, kind: str = "npm") -> pathlib.Path | None:
    """A host install of the agent CLIs the local sandbox can bind, or None.

    The first of :func:`cli_dir_candidates` that holds ``bin/<binary>`` (any ``bin/``
    when ``binary`` is None). Failing that, a named ``binary`` of an npm CLI (``kind``) is
    looked for on ``PATH`` (:func:`cli_dir_from_path`), which raises ``HarnessError`` when
    the one found cannot be used. A CLI the image provides (``kind="image"``) has no host
    install: None.
    """
    if kind == "image":
        return None
    for candidate in cli_dir_candidates():
        if (candidate / "bin" / (binary or "")).exists():
            return candidate.resolve()
    return cli_dir_from_path(binary) if binary and kind == "npm" else None


def _cli_version(executable: str) -> str | None:
    try:
        proc = subprocess.run(
            [executable, "--version"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HarnessError(
            f"`{executable} --version` could not run ({exc}); reinstall it, or install the "
            "pinned version with `agentrl install-clis`"
        ) from None
    if proc.returncode != 0:
        output = (proc.stderr or proc.stdout).strip()[-300:]
        raise HarnessError(
            f"`{executable} --version` failed (exit {proc.returncode}: {output or 'no output'}); "
            "reinstall it, or install the pinned version with `agentrl install-clis`"
        )
    match = _VERSION.search(proc.stdout)
    return match.group(1) if match else None


def cli_dir_from_path(binary: str) -> pathlib.Path | None:
    """The npm package directory of the ``binary`` on ``PATH``, or None when there is none.

    A CLI installed with ``npm install -g`` is a symlink into
    ``PREFIX/lib/node_modules/<package>/``; that directory holds everything the CLI needs
    and is what the sandbox binds (``Harness.host_install`` accepts it). The CLI must run
    (``binary --version``); a version other than the pinned one gets a warning.
    """
    found = shutil.which(binary)
    if found is None:
        return None
    pin = _main_pin(binary)
    version = _cli_version(found)
    if pin is not None and version != pin.version:
        logger.warning(
            "%s (on PATH) is version %s; agentrl is tested with %s (`agentrl install-clis` "
            "installs it)",
            found,
            version or "unknown",
            pin.version,
        )
    package = pin.package if pin is not None else binary
    resolved = pathlib.Path(found).resolve()
    package_dir = npm_package_dir(resolved, package)
    if package_dir is None:
        raise HarnessError(
            f"{found} (on PATH) is {resolved}, which is not inside an installed {package} npm "
            "package, so agentrl cannot bind it into the sandbox; run `agentrl install-clis` "
            f"(or set AGENTRL_CLI_DIR to a directory holding bin/{binary})"
        )
    logger.info("using %s %s from PATH (%s)", binary, version, package_dir)
    return package_dir
