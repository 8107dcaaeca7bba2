"""``exec_and_wait``: a long command in any sandbox, under a time budget; cancelling it
kills the command's process group.

A backend that can wait for a process (``Sandbox.run_long``: the ``local`` sandbox) runs
it in one exec and waits. Otherwise the command runs detached, its exit code read from a
marker file by polling, so a severed exec stream (E2B) or a restarted connection never
loses the result."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import shlex
import time
import uuid
from collections.abc import Mapping

from agentrl.sandboxes.base import (
    EXIT_TIME_BUDGET_EXCEEDED,
    ExecRequest,
    Sandbox,
    SandboxError,
    SandboxGoneError,
    cap_output_shell,
    max_output_bytes,
)
from agentrl.types import ExecResult

__all__ = ["exec_and_wait"]

logger = logging.getLogger(__name__)

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
    """Run ``cmd`` under ``time_budget`` seconds and wait for its exit code.

    A backend whose ``run_long`` waits runs it in that one call. Otherwise the command runs
    in its own session (``setsid``) with output to files and its exit code written
    atomically (tmp + mv) to a marker file under a unique per-call tag, so concurrent calls
    never collide. The launch is sent once (``idempotent=False``); if it fails in flight,
    the tag directory tells whether it ran, and a re-sent launch refuses to start twice.
    Polls (and the kill, output read and cleanup) run in ``/``, which the command cannot
    make unenterable as it can the default directory. Polls are idempotent execs: a failed
    poll is retried (up to ``max_poll_failures`` in a row) without touching the command.
    When the budget runs out the process group is killed and the result's exit code is
    ``EXIT_TIME_BUDGET_EXCEEDED``. ``SandboxGoneError`` is raised at once.
    """
    limit = max_output_bytes(max_output)
    request = ExecRequest(
        cmd=cmd, user=user, env=env, timeout=time_budget, idempotent=False, workdir=workdir
    )
    waited = await sandbox.run_long(request, want_output=want_output, max_output=limit)
    if waited is not None:
        if waited.exit_code != EXIT_TIME_BUDGET_EXCEEDED:
            return waited
        logger.info("exec_and_wait: time budget of %.1fs exceeded; killed", time_budget)
        note = _budget_note(time_budget)
        return ExecResult(
            exit_code=waited.exit_code, stdout=waited.stdout, stderr=waited.stderr + note
        )
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
            stderr_note = _budget_note(time_budget)

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


def _budget_note(time_budget: float) -> str:
    return f"\n[agentrl: time budget of {time_budget:g}s exceeded; command killed]\n"


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
                _read_marker(state),
                user=user,
                timeout=max(5.0, min(30.0, poll_interval * 10)),
                workdir="/",
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
            probe = await sandbox.exec(
                f"test -d {shlex.quote(state)}", user=user, timeout=30, workdir="/"
            )
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
        return await sandbox.exec(script, user=user, timeout=60, workdir="/")
    except SandboxGoneError:
        raise
    except (SandboxError, OSError, TimeoutError) as exc:
        logger.warning("exec_and_wait: the %s failed: %s", what, exc)
        return None
