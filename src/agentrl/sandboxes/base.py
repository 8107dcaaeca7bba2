"""The sandbox contract every backend implements, plus helpers built only on that contract.

``exec_and_wait`` runs a long command detached and polls an exit-code marker, so it works on
any backend and survives a severed exec connection. ``cap_output`` is the one place exec
output is decoded and truncated, so every backend truncates the same visible way.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import os
import pathlib
import re
import shlex
import time
import uuid
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar

import attrs

from agentrl import settings
from agentrl.plugin_options import check_option_keys, keyword_parameters
from agentrl.types import ExecResult, Task

__all__ = [
    "DEFAULT_MAX_OUTPUT_BYTES",
    "EXIT_EXEC_TIMEOUT",
    "EXIT_TIME_BUDGET_EXCEEDED",
    "ExecFailedError",
    "ExecRequest",
    "Sandbox",
    "SandboxError",
    "SandboxGoneError",
    "cap_file",
    "cap_output",
    "cap_output_shell",
    "check_result",
    "exec_and_wait",
    "max_output_bytes",
]

logger = logging.getLogger(__name__)

#: ``exec_and_wait`` result code when the time budget ran out (the command was killed).
EXIT_TIME_BUDGET_EXCEEDED = -1
#: ``Sandbox.exec`` result code when ``timeout`` ran out (the command was killed), as timeout(1).
EXIT_EXEC_TIMEOUT = 124
#: Default cap on the bytes kept from one stream (stdout or stderr) of one exec.
DEFAULT_MAX_OUTPUT_BYTES = 1 << 20
_TRUNCATION_MARKER = "\n[agentrl: {n} bytes of output truncated]\n"


class SandboxError(Exception):
    """The sandbox could not start, run a command, or move a file."""


class SandboxGoneError(SandboxError):
    """The sandbox no longer exists (killed, died or expired): retrying cannot help."""


class ExecFailedError(SandboxError):
    """A command run with ``check=True`` exited non-zero; ``result`` holds what it printed."""

    def __init__(self, cmd: str, result: ExecResult) -> None:
        self.cmd = cmd
        self.result = result
        tail = (result.stderr or result.stdout)[-2000:]
        super().__init__(f"command exited with code {result.exit_code}: {cmd[:200]!r}\n{tail}")


def check_result(cmd: str, result: ExecResult, check: bool) -> ExecResult:
    """Return ``result``, or raise ``ExecFailedError`` when ``check`` and it failed."""
    if check and result.exit_code != 0:
        raise ExecFailedError(cmd, result)
    return result


def max_output_bytes(value: int | None = None) -> int:
    """The output cap: ``value`` if given, else ``AGENTRL_SANDBOX_MAX_OUTPUT_BYTES``, else 1 MiB."""
    if value is None:
        try:
            value = settings.get("AGENTRL_SANDBOX_MAX_OUTPUT_BYTES")
        except settings.SettingsError as exc:
            raise SandboxError(str(exc)) from None
    if value < 64:
        raise SandboxError(f"max_output_bytes must be at least 64, got {value}")
    return value


def cap_output(data: bytes | str, limit: int | None = None) -> str:
    """Decode ``data`` (invalid UTF-8 becomes U+FFFD) and keep at most ``limit`` bytes of it.

    A longer output keeps its first and last halves around a visible marker that says how
    many bytes were dropped: the head shows how a command started, the tail how it ended.
    """
    limit = max_output_bytes(limit)
    raw = data.encode("utf-8", errors="surrogateescape") if isinstance(data, str) else data
    if len(raw) <= limit:
        return raw.decode("utf-8", errors="replace")
    half = limit // 2
    return _truncated(raw[:half], raw[-half:], len(raw) - 2 * half)


def cap_file(path: str | os.PathLike[str], limit: int | None = None) -> str:
    """Read a (possibly huge) file capped exactly like ``cap_output``; missing reads as ""."""
    limit = max_output_bytes(limit)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size <= limit:
                return f.read().decode("utf-8", errors="replace")
            half = limit // 2
            head = f.read(half)
            f.seek(size - half)
            tail = f.read(half)
    except FileNotFoundError:
        return ""
    return _truncated(head, tail, size - 2 * half)


def _truncated(head: bytes, tail: bytes, dropped: int) -> str:
    """The kept head and tail of an output around the marker counting what was dropped."""
    return (
        head.decode("utf-8", errors="replace")
        + _TRUNCATION_MARKER.format(n=dropped)
        + tail.decode("utf-8", errors="replace")
    )


def cap_output_shell(path: str, limit: int) -> str:
    """A POSIX sh snippet that prints file ``path`` capped exactly like ``cap_output``."""
    half = limit // 2
    marker = _TRUNCATION_MARKER.replace("{n}", "%s").replace("\n", "\\n")
    p = shlex.quote(path)
    return (
        f'if [ -f {p} ]; then n=$(wc -c < {p}); if [ "$n" -le {limit} ]; then cat {p}; '
        f"else head -c {half} {p}; printf '{marker}' $((n - {2 * half})); tail -c {half} {p}; "
        "fi; fi"
    )


@attrs.frozen(kw_only=True)
class ExecRequest:
    """One ``Sandbox.exec`` call as ``run_exec`` receives it (``exec`` itself applies ``check``)."""

    cmd: str
    user: str = "root"
    env: Mapping[str, str] | None = None
    timeout: float = 120
    idempotent: bool = True
    workdir: str | None = None


class Sandbox(abc.ABC):
    """An isolated machine for one agent run or one grading run.

    Use as an async context manager: the sandbox starts on enter and is destroyed on exit,
    whatever happened inside.
    """

    name: ClassVar[str]
    #: Constructor parameters ``from_task`` fills from the task, so never options.
    task_parameters: ClassVar[frozenset[str]] = frozenset({"image", "repo", "workdir"})
    #: True for a backend with no network of its own: the agent reaches the middleware only
    #: through a unix socket bound in (``services``), so the stack always serves on one.
    reaches_middleware_over_unix_socket: ClassVar[bool] = False
    #: The ``from_task`` options that bind this machine's Python (with pytest) into sandboxes
    #: of image-less tasks (``--host-python``); empty when the backend cannot.
    with_host_python: ClassVar[Mapping[str, Any]] = MappingProxyType({})

    @classmethod
    @abc.abstractmethod
    def from_task(cls, task: Task, **options: Any) -> Sandbox:
        """A sandbox (not yet started) for ``task``'s image / repository and workdir."""

    @classmethod
    def option_names(cls) -> frozenset[str] | None:
        """The keys ``from_task(task, **options)`` accepts; None when any key may be valid.

        By default the constructor's keyword parameters, less ``task_parameters`` (None
        when it takes ``**kwargs``). A backend whose options go elsewhere overrides this.
        """
        return keyword_parameters(cls, exclude=cls.task_parameters)

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        """Raise ``OptionsError`` (listing the valid keys) for a key this backend does not take."""
        check_option_keys(f"the {cls.name!r} sandbox", options, cls.option_names())

    @classmethod
    def check_task(cls, task: Task, **options: Any) -> None:
        """Raise ``SandboxError`` when ``task`` cannot run with ``options``, known without booting.

        Called once per task before the first rollout, so that a configuration that would
        fail every boot (a missing tool, an image that cannot be routed) is one error, not
        an ``infra_error`` per rollout. The default checks nothing.
        """
        return None

    @classmethod
    def host_search_path(cls, task: Task, **options: Any) -> str | None:
        """The ``PATH`` a command in ``task``'s sandbox searches, when it is this machine's own.

        A backend whose sandboxes see this host's directories at the same paths (the
        ``local`` sandbox without an image) returns it, so that a harness can tell on the
        host whether its CLI will be found. None (the default): not knowable here.
        """
        return None

    @abc.abstractmethod
    async def start(self) -> None:
        """Boot the sandbox."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Destroy the sandbox and everything running in it. Never raises."""

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
        """Run a shell command and wait for it.

        ``workdir`` None runs it in the backend's default directory (``local``: the sandbox's
        workdir; ``e2b``: the user's home), so a caller that needs a directory passes it.
        Output is capped with ``cap_output``. When ``timeout`` runs out the command is
        killed and the result has ``exit_code == EXIT_EXEC_TIMEOUT``. ``check=True`` raises
        ``ExecFailedError`` on a non-zero exit. A call with ``idempotent=False`` is never
        re-sent after a transient failure. A backend implements ``run_exec`` (or overrides
        this method whole).
        """
        request = ExecRequest(
            cmd=cmd, user=user, env=env, timeout=timeout, idempotent=idempotent, workdir=workdir
        )
        return check_result(cmd, await self.run_exec(request), check)

    @abc.abstractmethod
    async def run_exec(self, request: ExecRequest) -> ExecResult:
        """Run ``request`` and wait for it, by the rules of ``exec`` (which checks the result)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "exec" in cls.__dict__ and getattr(cls.run_exec, "__isabstractmethod__", False):
            # A backend that overrides ``exec`` whole needs no ``run_exec`` of its own.
            cls.run_exec = _run_through_exec  # type: ignore[method-assign]

    @abc.abstractmethod
    async def write_file(
        self, path: str, content: str | bytes | pathlib.Path, *, user: str = "root"
    ) -> None:
        """Write a file (creating parent directories) as ``user``.

        A host ``Path`` is streamed, not read into memory; a missing one raises
        ``FileNotFoundError``. A write the sandbox refuses raises ``SandboxError``.
        """

    @abc.abstractmethod
    async def read_file(self, path: str, *, user: str = "root", text: bool = True) -> str | bytes:
        """Read a file as ``user``: text (invalid UTF-8 replaced) or bytes.

        A missing file raises ``FileNotFoundError``; one ``user`` may not read raises
        ``SandboxError``.
        """

    @abc.abstractmethod
    def url_for(self, host: str, port: int) -> str:
        """The base URL an agent inside reaches the host service ``host:port`` at."""

    async def __aenter__(self) -> Sandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


async def _run_through_exec(self: Sandbox, request: ExecRequest) -> ExecResult:
    """``run_exec`` of a backend that overrides ``exec`` itself."""
    return await self.exec(**attrs.asdict(request, recurse=False))


# -- exec_and_wait ----------------------------------------------------------------------------

_MARKER_RE = re.compile(r"^(-?\d+)\n$")
#: Exit code of a launch that found its tag already started (the launch was re-sent).
_EXIT_ALREADY_LAUNCHED = 75
_STATE_ROOT = "/tmp/.agentrl-exec"


def _launch_script(state: str, cmd: str) -> str:
    """Start ``cmd`` detached in its own session; refuse to start twice for one tag."""
    q = shlex.quote(state)
    runner = (
        'd="$1"; echo $$ > "$d/pgid.tmp" && mv "$d/pgid.tmp" "$d/pgid"; '
        "s=sh; command -v bash > /dev/null 2>&1 && s=bash; "
        '$s "$d/cmd.sh" > "$d/out" 2> "$d/err" < /dev/null; rc=$?; '
        'echo "$rc" > "$d/rc.tmp" && mv "$d/rc.tmp" "$d/rc"'
    )
    return (
        f"mkdir -p {_STATE_ROOT} 2>/dev/null; chmod 1777 {_STATE_ROOT} 2>/dev/null\n"
        f"if ! mkdir {q}; then [ -d {q} ] || exit 1; "
        f"echo 'agentrl: this launch already ran' >&2; exit {_EXIT_ALREADY_LAUNCHED}; fi\n"
        f"printf '%s\\n' {shlex.quote(cmd)} > {q}/cmd.sh || exit 1\n"
        f"setsid sh -c {shlex.quote(runner)} agentrl-exec {q} "
        "< /dev/null > /dev/null 2>&1 &\n"
    )


def _kill_script(state: str) -> str:
    """Kill the detached command's process group (TERM, then KILL), waiting for its pgid."""
    q = shlex.quote(state)
    return (
        f"i=0; while [ ! -s {q}/pgid ] && [ $i -lt 20 ]; do sleep 0.1; i=$((i+1)); done\n"
        f'g=$(cat {q}/pgid 2>/dev/null); [ -n "$g" ] || exit 0\n'
        'kill -TERM "-$g" 2>/dev/null; i=0\n'
        'while kill -0 "-$g" 2>/dev/null && [ $i -lt 10 ]; do sleep 0.1; i=$((i+1)); done\n'
        'kill -KILL "-$g" 2>/dev/null; exit 0\n'
    )


def _parse_marker(text: str) -> int | None:
    """The exit code in a complete marker, or None for an empty or partial one."""
    match = _MARKER_RE.match(text)
    return int(match.group(1)) if match else None


async def exec_and_wait(
    sandbox: Sandbox,
    cmd: str,
    *,
    time_budget: float,
    user: str = "root",
    env: Mapping[str, str] | None = None,
    workdir: str | None = None,
    want_output: bool = True,
    poll_interval: float = 1.0,
    max_output: int | None = None,
    max_poll_failures: int = 5,
) -> ExecResult:
    """Run ``cmd`` detached under ``time_budget`` seconds and wait for its exit code.

    The command runs in its own session (``setsid``) with output to files and its exit code
    written atomically (tmp + mv) to a marker file under a unique per-call tag, so concurrent
    calls never collide. The launch is sent once (``idempotent=False``); if it fails in
    flight, the tag directory tells whether it ran, and a re-sent launch refuses to start
    twice. Polls are idempotent execs: a failed poll is retried (up to
    ``max_poll_failures`` in a row) without touching the command. When the budget runs out
    the process group is killed and the result's exit code is ``EXIT_TIME_BUDGET_EXCEEDED``.
    ``SandboxGoneError`` is raised at once.
    """
    limit = max_output_bytes(max_output)
    tag = f"{time.time_ns():x}-{uuid.uuid4().hex[:16]}"
    state = f"{_STATE_ROOT}/{tag}"
    deadline = time.monotonic() + time_budget

    await _launch(sandbox, state, cmd, user=user, env=env, workdir=workdir)
    try:
        exit_code = await _poll(sandbox, state, deadline, poll_interval, max_poll_failures, user)
    except asyncio.CancelledError:
        # The caller gave up on the command: do not leave it running.
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(
                asyncio.shield(_best_effort(sandbox, "kill", _kill_script(state), user=user)), 10
            )
        raise

    stderr_note = ""
    if exit_code is None:
        logger.info("exec_and_wait %s: time budget of %.1fs exceeded; killing", tag, time_budget)
        await _best_effort(sandbox, "kill", _kill_script(state), user=user)
        # A command that finished on its own just before the kill keeps its exit code.
        last = await _best_effort(sandbox, "last poll", _read_marker(state), user=user)
        exit_code = _parse_marker(last.stdout) if last is not None else None
        if exit_code is None:
            exit_code = EXIT_TIME_BUDGET_EXCEEDED
            stderr_note = f"\n[agentrl: time budget of {time_budget:g}s exceeded; command killed]\n"

    stdout = stderr = ""
    if want_output:
        out = await _best_effort(
            sandbox,
            "output read",
            cap_output_shell(f"{state}/out", limit)
            + "; "
            + cap_output_shell(f"{state}/err", limit)
            + " >&2",
            user=user,
        )
        if out is not None:
            stdout, stderr = out.stdout, out.stderr
    await _best_effort(sandbox, "cleanup", f"rm -rf {shlex.quote(state)}", user=user)
    return ExecResult(exit_code=exit_code, stdout=stdout, stderr=stderr + stderr_note)


def _read_marker(state: str) -> str:
    return f"cat {shlex.quote(state)}/rc 2>/dev/null; true"


async def _poll(
    sandbox: Sandbox,
    state: str,
    deadline: float,
    poll_interval: float,
    max_failures: int,
    user: str,
) -> int | None:
    """Poll the marker until it holds an exit code (returned) or the deadline (None)."""
    delay = min(0.05, poll_interval)
    failures = 0
    while True:
        try:
            probe = await sandbox.exec(
                _read_marker(state), user=user, timeout=max(5.0, min(30.0, poll_interval * 10))
            )
            failures = 0
            exit_code = _parse_marker(probe.stdout)
            if exit_code is not None:
                return exit_code
        except SandboxGoneError:
            raise
        except (SandboxError, OSError, TimeoutError) as exc:
            failures += 1
            logger.warning("exec_and_wait %s: poll failed (%d in a row): %s", state, failures, exc)
            if failures >= max_failures:
                raise SandboxError(
                    f"could not poll a detached command {max_failures} times in a row "
                    f"(last error: {exc}); the command may still be running in the sandbox"
                ) from exc
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        await asyncio.sleep(min(delay, remaining))
        delay = min(delay * 2, poll_interval)


async def _launch(
    sandbox: Sandbox,
    state: str,
    cmd: str,
    *,
    user: str,
    env: Mapping[str, str] | None,
    workdir: str | None,
) -> None:
    """Send the launch once; after an in-flight failure, re-send only if it never ran."""
    script = _launch_script(state, cmd)
    for attempt in (1, 2):
        try:
            result = await sandbox.exec(
                script, user=user, env=env, workdir=workdir, timeout=60, idempotent=False
            )
        except SandboxGoneError:
            raise
        except (SandboxError, OSError, TimeoutError) as exc:
            if attempt == 2:
                raise
            logger.warning("exec_and_wait launch failed in flight (%s); checking the tag", exc)
            if await _state_exists(sandbox, state, user):
                return  # it ran: the marker will tell the rest
            continue
        if result.exit_code in (0, _EXIT_ALREADY_LAUNCHED):
            return
        raise SandboxError(
            f"could not launch a detached command (exit {result.exit_code}): "
            f"{(result.stderr or result.stdout).strip()[-500:]}; "
            f"is /tmp writable by user {user!r} in the sandbox?"
        )


async def _state_exists(sandbox: Sandbox, state: str, user: str, attempts: int = 5) -> bool:
    """Whether a launch created its state directory, asking again while the link is down."""
    for attempt in range(attempts):
        try:
            probe = await sandbox.exec(f"test -d {shlex.quote(state)}", user=user, timeout=30)
            return probe.exit_code == 0
        except SandboxGoneError:
            raise
        except (SandboxError, OSError, TimeoutError) as exc:
            if attempt == attempts - 1:
                raise SandboxError(
                    f"a detached launch failed in flight and the sandbox could not be asked "
                    f"whether it ran ({exc}); the command may be running"
                ) from exc
            await asyncio.sleep(0.2 * 2**attempt)
    return False


async def _best_effort(sandbox: Sandbox, what: str, script: str, *, user: str) -> ExecResult | None:
    """Run a cleanup-style exec; log and swallow failures other than a gone sandbox."""
    try:
        return await sandbox.exec(script, user=user, timeout=60)
    except SandboxGoneError:
        raise
    except (SandboxError, OSError, TimeoutError) as exc:
        logger.warning("exec_and_wait: the %s failed: %s", what, exc)
        return None
