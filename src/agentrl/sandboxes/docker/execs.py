"""One command in a container: a Docker exec, its output capped while it streams.

The exec's own process is a small ``sh`` wrapper that outlives the command: it starts
the command under ``setsid`` (so the command leads its own process group; its first line
of stdout is that group's id, for the host's fallback kill), waits for it and then kills
whatever of the group is left, so nothing the command started in the background outlives
its exec. A watcher the wrapper forks before the command starts reads the exec's stdin:
a line asks it to TERM the group, end of input to KILL it. That is how a timeout or a
cancel ends the command (and a host that went away: its connection closing ends the
input), with ``kill`` alone, a shell builtin, so a command that exhausted the container's
``pids`` limit (a fork bomb: no new process, not even a new exec, can start) is still
killed, and the next exec runs. Output is kept as a head and a rolling tail
(``Capped``): however much a command prints, the host holds at most the cap. What the
container sends is only ever bytes to cap and decode.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pathlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

from agentrl.sandboxes.base import EXIT_EXEC_TIMEOUT, SandboxError, truncated
from agentrl.sandboxes.docker.client import sandbox_error
from agentrl.types import ExecResult

__all__ = [
    "Capped",
    "bytes_chunks",
    "file_chunks",
    "kill_group",
    "no_input",
    "run_command",
    "stdin_command",
]

logger = logging.getLogger(__name__)

#: Runs ``$1`` in a new session (``$0`` is ``_INNER``) and kills what is left of that
#: session's group when it ends, or when stdin says so (a line: TERM; its end: KILL).
#: The watcher is forked before the command runs: killing needs no new process.
_WRAPPER = (
    'if command -v setsid >/dev/null 2>&1; then setsid sh -c "$0" "$1" </dev/null & '
    'else sh -c "$0" "$1" </dev/null & fi\n'
    "g=$!; exec 3<&0\n"
    '(read -r _ <&3 && kill -TERM -"$g"; read -r _ <&3; '
    'kill -KILL -"$g" || kill -KILL "$g") >/dev/null 2>&1 &\n'
    "w=$!; exec 3<&-\n"
    'wait "$g"; rc=$?\n'
    'kill -KILL -"$g" 2>/dev/null; kill -KILL "$w" 2>/dev/null; exit "$rc"'
)
_INNER = 'echo "$$"; s=sh; command -v bash >/dev/null 2>&1 && s=bash; exec "$s" -c "$0"'
#: Seconds a command has to end after its TERM, then after its KILL, before the host
#: falls back to a kill exec of its own.
_GRACE = 1.0
_EXIT_POLLS = 50
_CHUNK = 1 << 20


class Capped:
    """At most ``limit`` bytes of one stream: the head and a rolling tail, and the total."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.half = limit // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.limit - len(self.head)
        if room > 0:
            self.head += data[:room]
        self.tail += data[-self.half :] if self.half else b""
        if len(self.tail) > self.half:
            del self.tail[: len(self.tail) - self.half]

    @property
    def overflowed(self) -> bool:
        return self.total > self.limit

    def raw(self) -> bytes:
        """Everything kept, for a stream that did not overflow."""
        return bytes(self.head)

    def text(self) -> str:
        """Decoded like ``cap_output``: whole, or head and tail around the marker."""
        if not self.overflowed:
            return self.head.decode("utf-8", errors="replace")
        return truncated(
            bytes(self.head[: self.half]), bytes(self.tail), self.total - 2 * self.half
        )


def _argv(cmd: str) -> list[str]:
    return ["sh", "-c", _WRAPPER, _INNER, cmd]


def _env_list(env: Mapping[str, str]) -> list[str]:
    return [f"{key}={value}" for key, value in env.items()]


async def _create(
    container: Any,
    argv: list[str],
    *,
    user: str,
    env: Mapping[str, str],
    workdir: str | None,
    stdin: bool = False,
) -> Any:
    from aiodocker.exceptions import DockerError

    try:
        return await container.exec(
            argv, user=user, environment=_env_list(env), workdir=workdir, stdin=stdin
        )
    except DockerError as exc:
        raise sandbox_error(exc, "exec") from exc


async def _messages(stream: Any) -> AsyncIterator[Any]:
    while True:
        message = await stream.read_out()
        if message is None:
            return
        yield message


async def _exit_code(execution: Any) -> int:
    """The exec's exit code once the daemon has it."""
    from aiodocker.exceptions import DockerError

    for _ in range(_EXIT_POLLS):
        try:
            info = await execution.inspect()
        except DockerError as exc:
            raise sandbox_error(exc, "exec inspect") from exc
        if not info.get("Running") and info.get("ExitCode") is not None:
            return int(info["ExitCode"])
        await asyncio.sleep(0.02)
    raise SandboxError("the docker daemon did not report the exit code of an exec")


class _Collector:
    """Splits the wrapper's process-group line off stdout and caps both streams."""

    def __init__(self, limit: int) -> None:
        self.stdout = Capped(limit)
        self.stderr = Capped(limit)
        self.pgid: int | None = None
        self._first: bytearray | None = bytearray()

    def feed(self, message: Any) -> None:
        data = bytes(message.data)
        if message.stream == 2:
            self.stderr.feed(data)
            return
        if self._first is not None:
            self._first += data
            newline = self._first.find(b"\n")
            if newline < 0 and len(self._first) < 64:
                return
            first, self._first = bytes(self._first), None
            line = first[:newline].strip() if newline >= 0 else b""
            if line.isdigit():
                self.pgid = int(line)
                data = first[newline + 1 :]
            else:
                data = first
        self.stdout.feed(data)


async def kill_group(container: Any, pgid: int | None) -> None:
    """Kill process group ``pgid`` in the container (TERM, then KILL). Never raises."""
    if not pgid or pgid <= 1:
        return
    script = (
        f"kill -TERM -{pgid} 2>/dev/null; i=0; "
        f"while kill -0 -{pgid} 2>/dev/null && [ $i -lt 10 ]; do sleep 0.1; i=$((i+1)); done; "
        f"kill -KILL -{pgid} 2>/dev/null; exit 0"
    )
    with contextlib.suppress(Exception):
        execution = await container.exec(["sh", "-c", script], user="0:0")
        async with execution.start(detach=False) as stream:
            async for _ in _messages(stream):
                pass


async def run_command(
    container: Any,
    cmd: str,
    *,
    user: str,
    env: Mapping[str, str],
    workdir: str | None,
    timeout: float,
    limit: int,
    timeout_code: int = EXIT_EXEC_TIMEOUT,
) -> ExecResult:
    """Run ``cmd`` and wait for it under ``timeout``; at its end its whole process group is
    killed, and a timeout (exit ``timeout_code``) or a cancel kills it first."""
    execution = await _create(
        container, _argv(cmd), user=user, env=env, workdir=workdir, stdin=True
    )
    collector = _Collector(limit)
    opened: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    async def pump() -> None:
        async with execution.start(detach=False) as stream:
            opened.set_result(stream)
            async for message in _messages(stream):
                collector.feed(message)

    task = asyncio.ensure_future(pump())
    try:
        done, _ = await asyncio.wait({task}, timeout=max(0.0, timeout))
    except asyncio.CancelledError:
        await asyncio.shield(_stop(container, task, opened, collector))
        raise
    if not done:
        await _stop(container, task, opened, collector)
        return ExecResult(
            exit_code=timeout_code,
            stdout=collector.stdout.text(),
            stderr=collector.stderr.text() + f"\n[agentrl: timed out after {timeout:g}s]\n",
        )
    exc = task.exception()
    if exc is not None:
        raise sandbox_error(exc, "exec stream") from exc
    return ExecResult(
        exit_code=await _exit_code(execution),
        stdout=collector.stdout.text(),
        stderr=collector.stderr.text(),
    )


async def _stop(
    container: Any, task: asyncio.Future[None], opened: asyncio.Future[Any], collector: _Collector
) -> None:
    """End a running command: TERM its group through the wrapper's watcher, KILL it after
    ``_GRACE``; a kill exec of the host's own only if the wrapper did not end. Never raises."""
    stream = opened.result() if opened.done() and not opened.cancelled() else None
    if stream is not None:
        for step in (_ask_term, _write_eof):
            with contextlib.suppress(Exception):
                step(stream)
            with contextlib.suppress(Exception):
                await asyncio.wait({task}, timeout=_GRACE)
            if task.done():
                break
    if not task.done():
        logger.warning("a docker exec did not end when told; killing its group with a new exec")
        await kill_group(container, collector.pgid)
        task.cancel()
    with contextlib.suppress(BaseException):
        await task


def _ask_term(stream: Any) -> None:
    """One line on the exec's stdin: the wrapper's watcher TERMs the command's group."""
    response = getattr(stream, "_resp", None)
    transport = response.connection.transport if response and response.connection else None
    if transport is not None:
        transport.write(b"term\n")


async def stdin_command(
    container: Any,
    argv: list[str],
    chunks: AsyncIterator[bytes],
    *,
    user: str,
    limit: int,
    timeout: float,
) -> tuple[int, Capped, Capped]:
    """Run ``argv`` with ``chunks`` on its stdin; (exit code, stdout, stderr)."""
    execution = await _create(container, argv, user=user, env={}, workdir=None, stdin=True)
    out, err = Capped(limit), Capped(limit)

    async def run() -> int:
        async with execution.start(detach=False) as stream:
            async for chunk in chunks:
                await stream.write_in(chunk)
            _write_eof(stream)
            async for message in _messages(stream):
                (err if message.stream == 2 else out).feed(bytes(message.data))
        return await _exit_code(execution)

    try:
        code = await asyncio.wait_for(run(), timeout)
    except asyncio.TimeoutError:
        raise SandboxError(f"a docker exec with input took longer than {timeout:g}s") from None
    return code, out, err


def _write_eof(stream: Any) -> None:
    """Half-close the exec's stdin, keeping its output open (aiodocker closes both)."""
    response = getattr(stream, "_resp", None)
    transport = response.connection.transport if response and response.connection else None
    if transport is not None and transport.can_write_eof():
        transport.write_eof()


async def file_chunks(path: pathlib.Path) -> AsyncIterator[bytes]:
    """The bytes of host file ``path``, in 1 MiB chunks read off the event loop."""
    f = await asyncio.to_thread(path.open, "rb")
    try:
        while True:
            chunk = await asyncio.to_thread(f.read, _CHUNK)
            if not chunk:
                return
            yield chunk
    finally:
        f.close()


async def bytes_chunks(data: bytes) -> AsyncIterator[bytes]:
    """``data`` in 1 MiB chunks."""
    for offset in range(0, len(data), _CHUNK):
        yield data[offset : offset + _CHUNK]


async def no_input() -> AsyncIterator[bytes]:
    """No input at all."""
    return
    yield b""
