"""The sandbox contract every backend implements, plus helpers built only on that contract.

``cap_output`` is the one place exec output is decoded and truncated, so every backend
truncates the same visible way. ``exec_and_wait`` (long detached commands) is in
``agentrl.sandboxes.exec``.
"""

from __future__ import annotations

import abc
import functools
import logging
import os
import pathlib
import shlex
import socket
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from agentrl import settings
from agentrl.plugin_options import check_option_keys, keyword_parameters
from agentrl.types import ExecResult, Task

if TYPE_CHECKING:
    from agentrl.sandboxes.images import ImageReport

__all__ = [
    "DEFAULT_MAX_OUTPUT_BYTES",
    "EXIT_EXEC_TIMEOUT",
    "EXIT_TIME_BUDGET_EXCEEDED",
    "READ_FILE_MAX_BYTES",
    "ExecFailedError",
    "ExecRequest",
    "Sandbox",
    "SandboxError",
    "SandboxGoneError",
    "cap_fd",
    "cap_file",
    "cap_output",
    "cap_output_shell",
    "check_result",
    "max_output_bytes",
    "process_alive",
    "process_label",
    "truncated",
]

logger = logging.getLogger(__name__)

#: ``exec_and_wait`` result code when the time budget ran out (the command was killed).
EXIT_TIME_BUDGET_EXCEEDED = -1
#: ``Sandbox.exec`` result code when ``timeout`` ran out (the command was killed), as timeout(1).
EXIT_EXEC_TIMEOUT = 124
#: Default cap on the bytes kept from one stream (stdout or stderr) of one exec.
DEFAULT_MAX_OUTPUT_BYTES = 1 << 20
_TRUNCATION_MARKER = "\n[agentrl: {n} bytes of output truncated]\n"
#: The most ``read_file`` returns by default (a backend's ``read_file_max_bytes``).
READ_FILE_MAX_BYTES = 64 << 20


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
    return truncated(raw[:half], raw[-half:], len(raw) - 2 * half)


def cap_file(path: str | os.PathLike[str], limit: int | None = None) -> str:
    """Read a (possibly huge) file capped exactly like ``cap_output``; missing reads as ""."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return ""
    try:
        return cap_fd(fd, limit)
    finally:
        os.close(fd)


def cap_fd(fd: int, limit: int | None = None) -> str:
    """Read the open file ``fd`` capped exactly like ``cap_output``: at most ``limit`` bytes
    are read, however large the file is or grows while it is read."""
    limit = max_output_bytes(limit)
    size = os.fstat(fd).st_size
    if size <= limit:
        return _read_at(fd, 0, limit).decode("utf-8", errors="replace")
    half = limit // 2
    head = _read_at(fd, 0, half)
    tail = _read_at(fd, size - half, half)
    return truncated(head, tail, size - 2 * half)


def _read_at(fd: int, offset: int, count: int) -> bytes:
    """Up to ``count`` bytes of ``fd`` from ``offset`` (fewer at the end of the file)."""
    parts = []
    while count > 0:
        chunk = os.pread(fd, min(count, 1 << 20), offset)
        if not chunk:
            break
        parts.append(chunk)
        offset += len(chunk)
        count -= len(chunk)
    return b"".join(parts)


def truncated(head: bytes, tail: bytes, dropped: int) -> str:
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
    #: True when a started, unused sandbox costs little to hold (no per-second bill, no
    #: lifetime limit): the rollout then boots the grading sandbox while the agent runs.
    prewarm_grading: ClassVar[bool] = False

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
    def task_images(cls, task: Task, **options: Any) -> tuple[str, ...]:
        """The images ``task``'s sandbox can boot from, preferred first (a boot takes the
        first one the backend holds). () (the default): this backend holds no images."""
        return ()

    @classmethod
    async def image_report(cls, tasks: Iterable[Task], **options: Any) -> ImageReport | None:
        """Which images ``tasks`` need (``task_images``) and which the backend lacks, asked
        once for all of them. None (the default): the backend needs no image held before
        a boot (``local`` checks its image directories in ``check_task``; ``e2b`` boots
        templates on its side). Raises ``SandboxError`` when it cannot be asked."""
        return None

    @classmethod
    async def pull_image(cls, name: str, **options: Any) -> None:
        """Fetch image ``name`` from its registry into the backend; ``SandboxError`` on
        failure. By default the backend cannot, and says so."""
        raise SandboxError(f"the {cls.name!r} sandbox does not pull images")

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

    async def run_long(
        self, request: ExecRequest, *, want_output: bool, max_output: int
    ) -> ExecResult | None:
        """Run a long command (``exec_and_wait``'s) and wait for its end, in one call.

        ``request.timeout`` is the command's time budget: past it the command's process
        group is killed and the result's exit code is ``EXIT_TIME_BUDGET_EXCEEDED``;
        cancelling the call kills it too. Output is capped at ``max_output`` bytes a
        stream, and empty unless ``want_output``. None (the default): this backend cannot
        wait for a process through whatever may sever its link, so ``exec_and_wait``
        launches the command detached and polls for its exit code instead.
        """
        return None

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

    async def lost_externally(self, error: BaseException) -> bool:
        """Whether ``error``, raised once the agent ran, came from outside the sandbox.

        A rollout asks this when the sandbox fails it after the policy has acted (an exec
        or a file read failing, the sandbox gone). By default there is no such evidence:
        whatever happens inside a sandbox is taken to be the agent's doing (it can kill
        every process and delete every file), so the rollout trains with reward 0. A
        backend that can tell, from something the agent cannot forge, that it lost the
        sandbox for its own reasons (a host-side teardown, the provider reaping it)
        overrides this to say True; the rollout is then an ``infra_error``. Never raises.
        """
        return False

    @classmethod
    async def sweep(cls, **options: Any) -> list[str]:
        """Destroy what this run (its ``run_id`` option, when the backend has one) may have
        left alive; the stack calls it when it closes. Returns what it destroyed, never
        raises. By default nothing: ``aclose`` leaves nothing behind. ``e2b`` kills the
        run's sandboxes a lost create answer or a crash left running."""
        return []

    async def __aenter__(self) -> Sandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


async def _run_through_exec(self: Sandbox, request: ExecRequest) -> ExecResult:
    """``run_exec`` of a backend that overrides ``exec`` itself."""
    return await self.exec(**attrs.asdict(request, recurse=False))


# -- who owns a sandbox: labels that tell a dead owner's leftovers apart (sweeps) ----------


def _start_ticks(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot), None when it is not running."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[19] if len(fields) > 19 and fields[0] not in ("Z", "X") else None


@functools.cache
def _own_start() -> str:
    return _start_ticks(os.getpid()) or "0"


def process_label() -> str:
    """``host:pid:start`` of this process (the start tells a reused pid apart)."""
    return f"{socket.gethostname()}:{os.getpid()}:{_own_start()}"


def process_alive(label: str) -> bool | None:
    """Whether the process of a ``process_label`` runs; None when it is on another host."""
    host, _, rest = label.partition(":")
    pid, _, start = rest.partition(":")
    if host != socket.gethostname():
        return None
    if not pid.isdigit():
        return False
    ticks = _start_ticks(int(pid))
    return ticks is not None and ticks == start
