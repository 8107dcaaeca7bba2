"""The sandbox contract helpers: exec_and_wait (against a real local sandbox) and output capping."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest

from agentrl.sandboxes import exec as exec_module
from agentrl.sandboxes.base import (
    EXIT_TIME_BUDGET_EXCEEDED,
    ExecFailedError,
    ExecRequest,
    Sandbox,
    SandboxError,
    SandboxGoneError,
    cap_file,
    cap_output,
    cap_output_shell,
    check_result,
    max_output_bytes,
)
from agentrl.sandboxes.exec import exec_and_wait
from agentrl.sandboxes.local import LocalSandbox
from agentrl.types import ExecResult

Predicate = Callable[[str], bool]


class FlakySandbox(Sandbox):
    """A real sandbox behind a connection that can be severed, before or after a call lands.

    ``sever_before(cmd)`` drops the call before it reaches the sandbox (it never ran);
    ``sever_after(cmd)`` lets it run and then loses the reply, as a reset stream would;
    ``partial_marker`` replies to that many marker polls with a torn, newline-less marker.
    Each predicate is consulted once per call and may count calls to fail only a few.
    """

    name = "flaky"

    def __init__(self, inner: Sandbox) -> None:
        self.inner = inner
        self.sever_before: Predicate = lambda cmd: False
        self.sever_after: Predicate = lambda cmd: False
        self.partial_marker = 0
        self.gone = False
        self.calls: list[str] = []

    @classmethod
    def from_task(cls, task, **options):
        raise NotImplementedError

    async def start(self) -> None:
        await self.inner.start()

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def run_exec(self, request: ExecRequest) -> ExecResult:
        cmd = request.cmd
        self.calls.append(cmd)
        if self.gone:
            raise SandboxGoneError("the sandbox was killed")
        if self.sever_before(cmd):
            raise SandboxError("stream reset before the request was sent")
        if self.partial_marker and cmd.startswith("cat ") and "/rc " in cmd:
            self.partial_marker -= 1
            return ExecResult(exit_code=0, stdout="1")
        result = await self.inner.run_exec(request)
        if self.sever_after(cmd):
            raise SandboxError("stream reset after the request ran")
        return result

    async def write_file(self, path, content, *, user="root"):
        await self.inner.write_file(path, content, user=user)

    async def read_file(self, path, *, user="root", text=True):
        return await self.inner.read_file(path, user=user, text=text)

    def url_for(self, host: str, port: int) -> str:
        return self.inner.url_for(host, port)


def first_n(n: int, needle: str) -> Predicate:
    """A predicate true for the first ``n`` commands containing ``needle``."""
    left = [n]

    def pred(cmd: str) -> bool:
        if needle in cmd and left[0] > 0:
            left[0] -= 1
            return True
        return False

    return pred


@pytest.fixture
async def local(tmp_path):
    """A started local sandbox."""
    async with LocalSandbox(state_dir=tmp_path / "state") as sb:
        yield sb


@pytest.fixture
async def flaky(local):
    """The local sandbox behind a severable connection."""
    return FlakySandbox(local)


@pytest.fixture(params=["waits", "polls"])
async def either(request, local):
    """The local sandbox as itself (``run_long`` waits) and behind a wrapper that does not
    wait (``run_long`` is the contract's default), so exec_and_wait polls."""
    return local if request.param == "waits" else FlakySandbox(local)


# -- exec_and_wait ----------------------------------------------------------------------------


async def test_a_backend_that_waits_runs_one_exec_and_one_that_cannot_polls(local):
    """The local sandbox runs a long command in one exec (no launch, poll or cleanup
    execs); a backend whose ``run_long`` is the default polls a marker for it."""
    counted = FlakySandbox(local)
    calls: list[tuple[str, str]] = []
    run_exec, run_long = local.run_exec, local.run_long

    async def counted_exec(request: ExecRequest) -> ExecResult:
        calls.append(("exec", request.cmd))
        return await run_exec(request)

    async def counted_long(request: ExecRequest, **kw: Any) -> ExecResult | None:
        calls.append(("long", request.cmd))
        return await run_long(request, **kw)

    local.run_exec, local.run_long = counted_exec, counted_long  # type: ignore[method-assign]
    waited = await exec_and_wait(local, "sleep 0.3; echo done", time_budget=30)
    assert waited == ExecResult(exit_code=0, stdout="done\n")
    assert calls == [("long", "sleep 0.3; echo done")]
    polled = await exec_and_wait(counted, "sleep 0.3; echo done", time_budget=30)
    assert polled == waited
    assert len(counted.calls) >= 4  # launch, polls, output read, cleanup
    assert any("/rc " in cmd for cmd in counted.calls)


async def test_exit_code_output_env_workdir_user(either):
    """The exit code, stdout and stderr come back; env, workdir and user apply to the command."""
    result = await exec_and_wait(
        either,
        'echo "$GREETING from $(pwd) as $(id -un)"; echo oops >&2; exit 7',
        time_budget=30,
        user="agent",
        env={"GREETING": "hi"},
        workdir="/tmp",
    )
    quiet = await exec_and_wait(either, "echo unseen; exit 3", time_budget=30, want_output=False)
    assert result == ExecResult(exit_code=7, stdout="hi from /tmp as agent\n", stderr="oops\n")
    assert quiet == ExecResult(exit_code=3, stdout="", stderr="")


async def test_a_command_that_locks_the_default_directory_still_reports(either):
    """A command that makes the sandbox's default directory unenterable (as an agent can
    its workspace) still has its exit code seen at once, not polled until the budget."""
    started = time.monotonic()
    result = await exec_and_wait(
        either, "chmod 000 /workspace; exit 5", time_budget=20, user="agent", workdir="/tmp"
    )
    assert result.exit_code == 5
    assert time.monotonic() - started < 10


async def test_concurrent_calls_do_not_collide(either):
    """Concurrent calls on one sandbox each get their own exit code and output."""
    cmds = [f"sleep 0.{(7 * i) % 5}; echo out-{i}; echo err-{i} >&2; exit {i}" for i in range(8)]
    results = await asyncio.gather(*(exec_and_wait(either, c, time_budget=60) for c in cmds))
    for i, result in enumerate(results):
        assert result == ExecResult(exit_code=i, stdout=f"out-{i}\n", stderr=f"err-{i}\n")
    leftover = await either.exec("ls -A /tmp/.agentrl-exec")
    assert leftover.stdout == ""


async def test_budget_exceeded_kills_the_process_group(either):
    """Past the budget the result is -1 and the command and its children are killed."""
    started = time.monotonic()
    result = await exec_and_wait(
        either,
        "echo started; sleep 300 & echo $! > /tmp/child; echo $$ > /tmp/main; sleep 300",
        time_budget=1.5,
    )
    took = time.monotonic() - started
    # A killed process not yet reaped is a zombie, which `kill -0` still finds: dead is
    # no /proc entry or state Z.
    alive = await either.exec(
        "for f in /tmp/child /tmp/main; do s=$(cut -d' ' -f3 /proc/$(cat $f)/stat 2>/dev/null)"
        ' && [ "$s" != Z ] && echo alive; done; true'
    )
    assert result.exit_code == EXIT_TIME_BUDGET_EXCEEDED
    assert result.stdout == "started\n"
    assert "time budget of 1.5s exceeded" in result.stderr
    assert took < 10
    assert alive.stdout == ""


async def test_partial_marker_is_waited_on(flaky):
    """A torn marker ("1" with no newline) is never parsed: the real exit code comes back."""
    flaky.partial_marker = 3
    result = await exec_and_wait(flaky, "sleep 0.3; exit 42", time_budget=30, poll_interval=0.05)
    assert result.exit_code == 42
    assert flaky.partial_marker == 0


def test_marker_parsing():
    """Only a complete marker (digits and a trailing newline) yields an exit code."""
    assert exec_module._parse_marker("") is None
    assert exec_module._parse_marker("1") is None
    assert exec_module._parse_marker("12\nx") is None
    assert exec_module._parse_marker("12\n") == 12
    assert exec_module._parse_marker("-1\n") == -1


async def test_severed_polls_still_give_the_exit_code(flaky):
    """Polls that fail in flight are retried; the command ran once and its code comes back."""
    flaky.sever_after = first_n(2, "/rc ")
    flaky.sever_before = first_n(1, "/rc ")
    result = await exec_and_wait(
        flaky, "echo ran >> /tmp/count; sleep 0.5; exit 5", time_budget=30, poll_interval=0.05
    )
    count = await flaky.inner.exec("cat /tmp/count")
    assert result.exit_code == 5
    assert count.stdout == "ran\n"


async def test_launch_reply_lost_is_not_run_twice(flaky):
    """A launch whose reply is lost after it ran is found by its tag, not sent again."""
    flaky.sever_after = first_n(1, "setsid")
    result = await exec_and_wait(flaky, "echo ran >> /tmp/count; exit 9", time_budget=30)
    count = await flaky.inner.exec("cat /tmp/count")
    assert result.exit_code == 9
    assert count.stdout == "ran\n"
    assert sum("setsid" in c for c in flaky.calls) == 1


async def test_launch_lost_before_sending_is_sent_again_once(flaky):
    """A launch that never reached the sandbox is re-sent, and the command runs exactly once."""
    flaky.sever_before = first_n(1, "setsid")
    result = await exec_and_wait(flaky, "echo ran >> /tmp/count; exit 4", time_budget=30)
    count = await flaky.inner.exec("cat /tmp/count")
    assert result.exit_code == 4
    assert count.stdout == "ran\n"
    assert sum("setsid" in c for c in flaky.calls) == 2


async def test_launch_lost_and_link_still_down_is_probed_again(flaky):
    """After a lost launch reply, the did-it-run probe is retried while the link is down."""
    flaky.sever_after = first_n(1, "setsid")
    flaky.sever_before = first_n(2, "test -d")
    result = await exec_and_wait(flaky, "echo ran >> /tmp/count; exit 6", time_budget=30)
    count = await flaky.inner.exec("cat /tmp/count")
    assert result.exit_code == 6
    assert count.stdout == "ran\n"
    assert sum("setsid" in c for c in flaky.calls) == 1


async def test_cancelled_wait_kills_the_command(either):
    """Cancelling exec_and_wait kills the detached command instead of leaving it running."""
    waiting = asyncio.ensure_future(
        exec_and_wait(either, "echo $$ > /tmp/main; sleep 300", time_budget=600)
    )
    await asyncio.sleep(1.0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    alive = await either.exec("kill -0 $(cat /tmp/main) 2>/dev/null && echo alive; true")
    assert alive.stdout == ""


async def test_launch_refuses_to_start_twice_for_one_tag(local):
    """Re-sending the same launch script does not start the command a second time."""
    script = exec_module._launch_script("/tmp/.agentrl-exec/fixed-tag", "echo ran >> /tmp/count")
    first = await local.exec(script, idempotent=False)
    second = await local.exec(script, idempotent=False)
    await asyncio.sleep(0.3)
    count = await local.exec("cat /tmp/count")
    assert first.exit_code == 0
    assert second.exit_code == exec_module._EXIT_ALREADY_LAUNCHED
    assert "already ran" in second.stderr
    assert count.stdout == "ran\n"


async def test_persistent_poll_failures_raise(flaky):
    """A connection that stays down ends in a SandboxError saying the command may still run."""
    flaky.sever_before = lambda cmd: "/rc " in cmd
    with pytest.raises(SandboxError, match="may still be running"):
        await exec_and_wait(flaky, "sleep 1", time_budget=30, poll_interval=0.01)


async def test_gone_sandbox_raises_at_once(flaky):
    """A sandbox that no longer exists is reported immediately, not polled until the budget."""
    flaky.gone = True
    started = time.monotonic()
    with pytest.raises(SandboxGoneError):
        await exec_and_wait(flaky, "true", time_budget=60)
    assert time.monotonic() - started < 1
    assert len(flaky.calls) == 1


async def test_unlaunchable_command_is_a_clear_error(flaky):
    """A launch that fails in the sandbox (its state directory is blocked) raises with why."""
    await flaky.exec("touch /tmp/.agentrl-exec")
    with pytest.raises(SandboxError, match="could not launch a detached command"):
        await exec_and_wait(flaky, "true", time_budget=10, user="agent")


async def test_output_capped_and_binary_safe(either):
    """Large and binary output of a detached command is capped and decoded without errors."""
    result = await exec_and_wait(
        either,
        "head -c 50000 /dev/zero | tr '\\0' x; printf '\\377\\376' >&2",
        time_budget=30,
        max_output=1000,
    )
    assert result.exit_code == 0
    assert "[agentrl: 49000 bytes of output truncated]" in result.stdout
    assert result.stdout.startswith("x" * 500) and result.stdout.endswith("x" * 500)
    assert result.stderr == "\ufffd\ufffd"


# -- output capping ---------------------------------------------------------------------------


def test_cap_output_keeps_head_and_tail_with_marker():
    """Output past the cap keeps both halves around a marker that counts the dropped bytes."""
    data = b"A" * 600 + b"B" * 600
    capped = cap_output(data, 200)
    assert capped == "A" * 100 + "\n[agentrl: 1000 bytes of output truncated]\n" + "B" * 100
    assert cap_output(b"short", 200) == "short"
    assert cap_output("ünïcode", 200) == "ünïcode"


def test_cap_output_binary_never_crashes():
    """Invalid UTF-8, and a cap that splits a multi-byte character, decode with U+FFFD."""
    assert cap_output(b"\xff\xfeok", 100) == "\ufffd\ufffdok"
    capped = cap_output("é" * 200, 101)
    assert "bytes of output truncated" in capped
    assert capped.startswith("é" * 25)


def test_max_output_bytes_configuration(monkeypatch):
    """The cap comes from the argument, else the environment, else 1 MiB; bad values say why."""
    monkeypatch.delenv("AGENTRL_SANDBOX_MAX_OUTPUT_BYTES", raising=False)
    assert max_output_bytes() == 1 << 20
    monkeypatch.setenv("AGENTRL_SANDBOX_MAX_OUTPUT_BYTES", "4096")
    assert max_output_bytes() == 4096
    assert max_output_bytes(128) == 128
    monkeypatch.setenv("AGENTRL_SANDBOX_MAX_OUTPUT_BYTES", "lots")
    with pytest.raises(SandboxError, match="is not an integer"):
        max_output_bytes()
    with pytest.raises(SandboxError, match="at least 64"):
        max_output_bytes(10)


def test_cap_file_and_shell_match_cap_output(tmp_path):
    """The file reader and the in-sandbox shell snippet truncate exactly like cap_output."""
    data = os.urandom(5000) + b"tail-end"
    path = tmp_path / "out"
    path.write_bytes(data)
    shell = subprocess.run(
        ["sh", "-c", cap_output_shell(str(path), 1000)], capture_output=True, check=True
    ).stdout
    assert cap_file(path, 1000) == cap_output(data, 1000)
    assert shell.decode("utf-8", errors="replace") == cap_output(data, 1000)
    assert cap_file(tmp_path / "missing", 1000) == ""


def test_check_result():
    """check=True turns a non-zero exit into ExecFailedError carrying the result."""
    ok = ExecResult(exit_code=0, stdout="fine")
    bad = ExecResult(exit_code=2, stderr="broken")
    assert check_result("true", ok, True) is ok
    assert check_result("false", bad, False) is bad
    with pytest.raises(ExecFailedError, match="exited with code 2") as info:
        check_result("false", bad, True)
    assert info.value.result is bad


# -- exec and run_exec ------------------------------------------------------------------------


class _Recorder(Sandbox):
    """A sandbox that implements only ``run_exec``: it records requests and exits with 3."""

    name = "recorder"

    def __init__(self) -> None:
        self.requests: list[ExecRequest] = []

    @classmethod
    def from_task(cls, task, **options):
        return cls()

    async def start(self) -> None:
        pass

    async def aclose(self) -> None:
        pass

    async def run_exec(self, request: ExecRequest) -> ExecResult:
        self.requests.append(request)
        return ExecResult(exit_code=3, stdout=request.cmd)

    async def write_file(self, path, content, *, user="root"):
        raise NotImplementedError

    async def read_file(self, path, *, user="root", text=True):
        raise NotImplementedError

    def url_for(self, host: str, port: int) -> str:
        raise NotImplementedError


async def test_exec_hands_run_exec_one_request_and_applies_check():
    """exec passes every argument but ``check`` to run_exec, and ``check`` raises on exit 3."""
    sandbox = _Recorder()
    result = await sandbox.exec("make", user="agent", env={"A": "1"}, timeout=5, workdir="/w")
    with pytest.raises(ExecFailedError, match="exited with code 3"):
        await sandbox.exec("make check", check=True, idempotent=False)
    assert result == ExecResult(exit_code=3, stdout="make")
    assert sandbox.requests == [
        ExecRequest(cmd="make", user="agent", env={"A": "1"}, timeout=5, workdir="/w"),
        ExecRequest(cmd="make check", idempotent=False),
    ]


async def test_a_backend_that_overrides_exec_needs_no_run_exec():
    """A backend written against ``exec`` alone instantiates, and its run_exec goes through
    its own exec; one that implements neither cannot be instantiated."""

    class ExecOnly(_Recorder):
        run_exec = Sandbox.run_exec  # as if it had never implemented it

        async def exec(self, cmd: str, **arguments: object) -> ExecResult:
            self.arguments = arguments
            return ExecResult(exit_code=0, stdout=f"exec ran {cmd}")

    class Neither(_Recorder):
        run_exec = Sandbox.run_exec

    result = await (sandbox := ExecOnly()).run_exec(ExecRequest(cmd="ls", env={"X": "1"}))
    assert result.stdout == "exec ran ls"
    assert sandbox.arguments == {
        "user": "root",
        "env": {"X": "1"},
        "timeout": 120,
        "idempotent": True,
        "workdir": None,
    }
    with pytest.raises(TypeError, match="run_exec"):
        Neither()
