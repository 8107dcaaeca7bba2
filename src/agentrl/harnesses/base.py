"""The harness contract: put an agent CLI in a sandbox, point it at a session, run it.

A harness installs its CLI (from host-side npm tarballs uploaded into the sandbox, or from
an install the sandbox can already see: :mod:`agentrl.harnesses.install`), writes the
CLI's own configuration so that every LLM call goes to one middleware session, and
launches the CLI detached as the unprivileged agent user under a time budget. It never
talks to the model itself. It also says how the CLI, run by hand on the host, is pointed
at a middleware session (:class:`ClientSetup`, printed by ``agentrl serve``).

Where the CLI comes from is the harness's ``install_kind``:

* ``"npm"`` (the default): the npm package ``npm_package``; ``agentrl install-clis``
  installs its pin on the host and the sandbox runs that install, bound in read-only
  (or ``tarballs=`` are installed inside the sandbox);
* ``"python"``: the PyPI package ``python_package``; ``agentrl install-clis`` installs its
  pin with pip into a self-contained directory beside a launcher that runs
  ``python3 -m python_module`` with the sandbox's own ``python3`` (which must be the
  minor version pip installed for), bound in read-only like an npm install;
* ``"image"``: the sandbox's image provides ``binary`` on its ``PATH``; nothing is
  installed on the host, and ``min_version`` (when set) is checked against the output
  of ``binary *version_args`` in the sandbox.

Everything a harness writes lives under its ``state_dir`` (outside the task's workdir), so
the agent's diff never contains harness files.
"""

from __future__ import annotations

import abc
import logging
import os
import pathlib
import shlex
import shutil
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import attrs

from agentrl.harnesses.errors import HarnessError
from agentrl.harnesses.install import host_install, install_cli
from agentrl.harnesses.kinds import check_install_kind, install_hint
from agentrl.harnesses.npm import jittered_backoff
from agentrl.harnesses.options import parse_extra_args, parse_extra_env
from agentrl.plugin_options import check_option_keys, keyword_parameters
from agentrl.sandboxes.base import (
    EXIT_TIME_BUDGET_EXCEEDED,
    Sandbox,
    SandboxError,
    cap_output,
)
from agentrl.sandboxes.exec import exec_and_wait

__all__ = [
    "DEFAULT_STATE_DIR",
    "EXIT_TIME_BUDGET_EXCEEDED",
    "ClientSetup",
    "Harness",
    "HarnessContext",
    "HarnessError",
    "give_to_user",
    "jittered_backoff",
    "parse_extra_args",
    "parse_extra_env",
]

logger = logging.getLogger(__name__)

#: Where a harness keeps its CLI launcher, HOME, prompt and logs inside the sandbox.
DEFAULT_STATE_DIR = "/tmp/agentrl-harness"
#: The most of the agent's own log kept with a rollout result.
MAX_AGENT_LOG_BYTES = 4 << 20


#: The agent's ``~/.profile``: login shells (Codex runs ``sh -lc``) source /etc/profile,
#: which resets ``PATH``; restore the one the CLI was launched with (the task's toolchain).
_PROFILE = """\
if [ -n "${AGENTRL_PATH:-}" ]; then PATH="$AGENTRL_PATH"; export PATH; fi
"""


async def give_to_user(sandbox: Sandbox, user: str, paths: Sequence[str]) -> None:
    """Give ``paths`` (recursively) to ``user``; raise ``HarnessError`` if it can't write them.

    Every directory must end up writable by ``user`` (files keep their modes: git's
    objects are read-only on purpose).

    ``chown`` is tried first; a sandbox whose root is a user namespace mapped onto the
    agent's own uid (the ``local`` backend) refuses it, but there root's files already
    belong to the agent, so what counts is the check that ``user`` can write every path.
    """
    if user == "root" or not paths:
        return
    quoted = " ".join(shlex.quote(p) for p in paths)
    await sandbox.exec(f"chown -R {shlex.quote(user)} {quoted} 2>/dev/null", user="root")
    check = await sandbox.exec(
        f'for p in {quoted}; do [ -w "$p" ] || {{ echo "$p"; exit 1; }}; done; '
        f"bad=$(find {quoted} -type d ! -writable -print 2>/dev/null | head -n 5); "
        '[ -z "$bad" ] || { echo "$bad"; exit 1; }',
        user=user,
        timeout=300,
    )
    if check.exit_code != 0:
        raise HarnessError(
            f"user {user!r} cannot write {check.stdout.strip()!r} in the sandbox and chown "
            f"to it failed; run the agent as a user that owns the workspace, or as root"
        )


@attrs.frozen(kw_only=True)
class HarnessContext:
    """Where one run's CLI sends its LLM calls, and where and as whom it works.

    ``base_url`` is the middleware root as reached from inside the sandbox (no ``/v1``);
    ``api_key`` is the session token the middleware issued for this rollout.
    """

    base_url: str = attrs.field()
    api_key: str
    workdir: str
    session_id: str = ""
    user: str = "agent"
    model: str | None = None

    @base_url.validator
    def _check_url(self, attribute: attrs.Attribute, value: str) -> None:
        if not value.startswith(("http://", "https://")):
            raise ValueError(
                f"HarnessContext.base_url: expected an http(s) URL, got {value!r}; "
                "pass the middleware URL as seen from inside the sandbox (Sandbox.url_for)"
            )


@attrs.frozen(kw_only=True)
class ClientSetup:
    """How a person points an agent CLI on the host at a middleware session, by hand.

    ``title`` names the client (and, for a config file, where the lines go); ``lines``
    are what to set, paste and run, in order.
    """

    title: str
    lines: tuple[str, ...] = attrs.field(converter=tuple)


@attrs.define(kw_only=True)
class Harness(abc.ABC):
    """One agent CLI: how to install it, configure it for a session, and run it.

    The install sources are options of every harness: ``tarballs`` (host npm tarballs,
    installed with ``npm install -g``, ``--offline`` unless ``npm_offline=False``, retried
    ``install_attempts`` times on transient npm failures), else ``cli_path`` (an install
    the sandbox can see), else the binary on the sandbox's ``PATH``; ``node_tarball`` is
    unpacked first when the sandbox has no ``node``. How each is installed is
    :mod:`agentrl.harnesses.install`.

    :meth:`client_setup` says how the same CLI, run by hand on the host, is pointed at a
    middleware session (what ``agentrl serve`` prints).
    """

    name: ClassVar[str]
    #: The adapter protocol (wire API) the CLI speaks.
    protocol: ClassVar[str]
    #: The CLI executable's name.
    binary: ClassVar[str]
    #: Where the CLI comes from: ``"npm"``, ``"python"`` or ``"image"`` (module docstring).
    install_kind: ClassVar[str] = "npm"
    #: The npm package that provides it (``install_kind = "npm"``).
    npm_package: ClassVar[str] = ""
    #: The PyPI distribution that provides it, and the module ``python3 -m`` runs
    #: (``install_kind = "python"``).
    python_package: ClassVar[str] = ""
    python_module: ClassVar[str] = ""
    #: Arguments that make the CLI print its version (the install probe runs them).
    version_args: ClassVar[tuple[str, ...]] = ("--version",)
    #: The oldest version the harness works with, checked in the sandbox; None: any.
    min_version: ClassVar[str | None] = None
    #: The option that takes the prompt (``-t``); None: the prompt is the last argument.
    prompt_option: ClassVar[str | None] = None
    #: Environment variables read for extra CLI arguments / environment, first set wins.
    extra_args_vars: ClassVar[tuple[str, ...]] = ()
    extra_env_vars: ClassVar[tuple[str, ...]] = ()
    #: Workdir-relative paths the CLI may create that are never part of the agent's diff.
    workspace_excludes: ClassVar[tuple[str, ...]] = ()
    #: The CLI reads the prompt from stdin rather than as its last argument.
    prompt_on_stdin: ClassVar[bool] = False

    cli_path: str | None = None
    tarballs: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    node_tarball: str | None = None
    model: str | None = None
    extra_args: tuple[str, ...] | None = None
    extra_env: dict[str, str] | None = None
    state_dir: str = DEFAULT_STATE_DIR
    install_attempts: int = 4
    install_backoff: float = 2.0
    npm_offline: bool = True
    environ: Mapping[str, str] | None = attrs.field(default=None, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.extra_args is None:
            self.extra_args = parse_extra_args(self.environ, self.extra_args_vars)
        else:
            self.extra_args = tuple(self.extra_args)
        if self.extra_env is None:
            self.extra_env = parse_extra_env(self.environ, self.extra_env_vars)
        check_install_kind(self)
        for path in (*self.tarballs, *([self.node_tarball] if self.node_tarball else [])):
            if not pathlib.Path(path).is_file():
                raise HarnessError(
                    f"{self.name}: tarball {path!r} does not exist on this host; "
                    f"build one with `npm pack {self.npm_package}` or drop the tarball option"
                )
        if self.install_attempts < 1:
            raise HarnessError(f"install_attempts must be at least 1, got {self.install_attempts}")

    @classmethod
    def option_names(cls) -> frozenset[str] | None:
        """The keyword arguments the harness takes (its fields); None when any key may be valid."""
        return keyword_parameters(cls)

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        """Raise ``OptionsError`` (listing the valid keys) for a key this harness does not take."""
        check_option_keys(f"the {cls.name!r} harness", options, cls.option_names())

    def check_cli(self, search_path: str | None) -> None:
        """Raise ``HarnessError`` when the CLI is sure to be missing from a sandbox.

        ``search_path`` is the sandbox's ``PATH`` when its directories are this machine's
        (``Sandbox.host_search_path``), else None (nothing can be told). Tarballs and
        ``cli_path`` are install sources of their own, so they pass.
        """
        if self.tarballs or self.cli_path or search_path is None:
            return
        if shutil.which(self.binary, path=search_path) is None:
            raise HarnessError(
                f"{self.name}: no {self.binary} CLI installed: the sandbox would look for it "
                f"on PATH={search_path}, where this machine has none. {install_hint(self)}"
            )

    @classmethod
    def host_install(cls, install_dir: str | os.PathLike[str]) -> tuple[dict[str, str], str]:
        """Read-only binds and ``cli_path`` for a host install a sandbox should run as is.

        See :func:`agentrl.harnesses.install.host_install`: ``install_dir`` holds
        ``bin/<binary>`` (what ``agentrl install-clis`` writes) or is the CLI's npm package
        directory; the binds go to the sandbox, ``cli_path`` to the harness.
        """
        return host_install(cls, install_dir)

    @classmethod
    def client_setup(cls, base_url: str, token: str) -> ClientSetup | None:
        """How to point this CLI, run by hand on the host, at a middleware session.

        ``base_url`` is the middleware root (no ``/v1``) and ``token`` the session's token.
        ``agentrl serve`` prints it, with a session of its own for every harness that gives
        one; None (the default) when the harness cannot say.
        """
        return None

    # -- paths inside the sandbox ---------------------------------------------------------
    @property
    def launcher(self) -> str:
        """A stable path to the installed CLI inside the sandbox (a symlink set by install)."""
        return f"{self.state_dir}/bin/{self.binary}"

    @property
    def home(self) -> str:
        return f"{self.state_dir}/home"

    @property
    def log_path(self) -> str:
        return f"{self.state_dir}/agent.log"

    @property
    def stderr_path(self) -> str:
        return f"{self.state_dir}/agent.stderr"

    @property
    def prompt_path(self) -> str:
        return f"{self.state_dir}/prompt.txt"

    def path_prefix(self) -> str:
        """Directories put in front of the sandbox's own ``PATH`` (CLI, npm, Node)."""
        return f"{self.state_dir}/bin:{self.state_dir}/npm/bin:{self.state_dir}/node/bin"

    def with_path(self, cmd: str) -> str:
        """``cmd`` run with the harness directories in front of the sandbox's ``PATH``."""
        return f'PATH={shlex.quote(self.path_prefix())}:"$PATH"; export PATH; {cmd}'

    # -- install ---------------------------------------------------------------------------
    async def install(self, sandbox: Sandbox) -> str:
        """Make the CLI runnable in ``sandbox``; returns the real path of its executable.

        From the first install source that applies (tarballs, ``cli_path``, the sandbox's
        ``PATH``): see :func:`agentrl.harnesses.install.install_cli`.
        """
        return await install_cli(self, sandbox)

    # -- configure / run -------------------------------------------------------------------
    async def configure(self, sandbox: Sandbox, ctx: HarnessContext) -> None:
        """Write the CLI's configuration for ``ctx`` and hand the harness dirs to the agent."""
        files = {f"{self.home}/.profile": _PROFILE, **self.config_files(ctx)}
        for path, content in files.items():
            await sandbox.write_file(path, content)
        await self._chown_state(sandbox, ctx.user)

    async def _chown_state(self, sandbox: Sandbox, user: str) -> None:
        paths = [self.home, f"{self.state_dir}/run", *self.owned_dirs()]
        files = [self.log_path, self.stderr_path, self.prompt_path]
        await self._root(
            sandbox,
            f"mkdir -p {' '.join(map(shlex.quote, paths))} && "
            f"touch {' '.join(map(shlex.quote, files))}",
        )
        await give_to_user(sandbox, user, [*paths, *files])

    def owned_dirs(self) -> tuple[str, ...]:
        """Directories (besides HOME) the CLI writes to while it runs."""
        return ()

    @abc.abstractmethod
    def config_files(self, ctx: HarnessContext) -> dict[str, str]:
        """Absolute sandbox path -> content of every config file the CLI needs."""

    @abc.abstractmethod
    def command(self, ctx: HarnessContext) -> list[str]:
        """The CLI's argv (after the launcher), the prompt read from ``prompt_path`` last."""

    def environment(self, ctx: HarnessContext, time_budget: float) -> dict[str, str]:
        """The CLI's environment: base variables, the harness's own, then ``extra_env``.

        ``PATH`` is not set here: the launch line puts the harness directories in front
        of the sandbox's own ``PATH``, so the agent's tools find the task's toolchain.
        """
        env = {
            "HOME": self.home,
            "TERM": "dumb",
            "LANG": "C.UTF-8",
            "NO_COLOR": "1",
        }
        env.update(self.cli_environment(ctx, time_budget))
        env.update(self.extra_env or {})
        return env

    @abc.abstractmethod
    def cli_environment(self, ctx: HarnessContext, time_budget: float) -> dict[str, str]:
        """Variables that point the CLI at the session."""

    def shell_command(self, ctx: HarnessContext) -> str:
        """The detached shell line: cd to the workdir, run the CLI, log its output."""
        argv = [self.launcher, *self.command(ctx), *(self.extra_args or ())]
        if self.prompt_option:
            argv.append(self.prompt_option)
        prompt = shlex.quote(self.prompt_path)
        if self.prompt_on_stdin:
            prompt_arg, stdin = "", prompt
        else:
            prompt_arg, stdin = f'"$(cat {prompt})" ', "/dev/null"
        return self.with_path(
            'AGENTRL_PATH="$PATH"; export AGENTRL_PATH; '
            f"cd {shlex.quote(ctx.workdir)} && exec {shlex.join(argv)} {prompt_arg}"
            f"> {shlex.quote(self.log_path)} 2> {shlex.quote(self.stderr_path)} < {stdin}"
        )

    async def run(
        self, sandbox: Sandbox, ctx: HarnessContext, prompt: str, time_budget: float
    ) -> int:
        """Run the CLI on ``prompt`` as ``ctx.user``; its exit code, or -1 past the budget."""
        await sandbox.write_file(self.prompt_path, prompt, user=ctx.user)
        result = await exec_and_wait(
            sandbox,
            self.shell_command(ctx),
            time_budget=time_budget,
            user=ctx.user,
            env=self.environment(ctx, time_budget),
            workdir=ctx.workdir,
            want_output=False,
        )
        if result.exit_code == EXIT_TIME_BUDGET_EXCEEDED:
            logger.info("%s: time budget of %.0fs exceeded; CLI killed", self.name, time_budget)
        elif result.exit_code != 0:
            logger.info("%s: CLI exited with code %d", self.name, result.exit_code)
        return result.exit_code

    async def read_log(self, sandbox: Sandbox) -> str:
        """The CLI's own output (stream-json / --json lines), then its stderr if any."""
        parts = []
        for path, label in ((self.log_path, None), (self.stderr_path, "stderr")):
            try:
                data = await sandbox.read_file(path, text=False)
            except (SandboxError, OSError) as exc:
                logger.debug("%s: could not read %s: %s", self.name, path, exc)
                continue
            text = cap_output(data, MAX_AGENT_LOG_BYTES)
            if text.strip():
                parts.append(text if label is None else f"[{label}]\n{text}")
        return "\n".join(parts)

    async def _root(self, sandbox: Sandbox, cmd: str, *, timeout: float = 120) -> None:
        result = await sandbox.exec(cmd, user="root", timeout=timeout)
        if result.exit_code != 0:
            raise HarnessError(
                f"{self.name}: setup command failed in the sandbox (exit {result.exit_code}): "
                f"{cmd[:200]!r}: {(result.stderr or result.stdout).strip()[-800:]}"
            )

    def describe(self) -> dict[str, Any]:
        """A JSON-able summary of this harness's settings (no secrets)."""
        return {
            "name": self.name,
            "protocol": self.protocol,
            "cli_path": self.cli_path,
            "tarballs": list(self.tarballs),
            "model": self.model,
            "extra_args": list(self.extra_args or ()),
            "extra_env": sorted(self.extra_env or {}),
        }
