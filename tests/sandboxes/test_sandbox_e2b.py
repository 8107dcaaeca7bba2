"""The ``e2b`` sandbox through the real e2b SDK, against the local E2B API + envd double.

The double (``agentrl.testing.e2b_server``) speaks the SDK's real wire protocol: REST for
create / kill, Connect-RPC JSON streaming for commands, multipart / octet-stream ``/files``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import ssl
import subprocess
import sys

import pytest

from agentrl import plugins
from agentrl.retry import RetryPolicy
from agentrl.sandboxes.base import (
    EXIT_EXEC_TIMEOUT,
    ExecFailedError,
    SandboxError,
    SandboxGoneError,
)
from agentrl.sandboxes.boot import Booter, BootError
from agentrl.sandboxes.e2b import E2BSandbox, sweep
from agentrl.sandboxes.e2b.errors import Verdict, classify
from agentrl.sandboxes.e2b.options import E2BOptions
from agentrl.sandboxes.exec import exec_and_wait
from agentrl.testing.e2b_server import E2BServer
from agentrl.types import Task

API_KEY = "e2b_test_key"


@pytest.fixture
async def server():
    async with E2BServer(api_key=API_KEY) as srv:
        yield srv


@pytest.fixture
def make_sandbox(server):
    """Build sandboxes aimed at the double, with tiny backoff and no host environment."""

    def make(image: str | None = "registry/task:1", **options):
        defaults = {
            "api_key": API_KEY,
            "api_url": server.url,
            "sandbox_url": server.url,
            "image_metadata_key": "image",
            "backoff_base_sec": 0.002,
            "backoff_cap_sec": 0.02,
            "rpc_retries": 3,
            "environ": {},
            "rng": random.Random(7),
        }
        defaults.update(options)
        return E2BSandbox(image, **defaults)

    return make


async def _wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


def _alive(pid: int) -> bool:
    """Whether host process ``pid`` is running (not gone, not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _processes_done(server: E2BServer, sandbox_id: str) -> bool:
    return all(run.exit_code is not None for run in server.sandboxes[sandbox_id].processes.values())


# -- lifecycle -------------------------------------------------------------------------------


async def test_create_routes_image_by_metadata_key_with_size_and_lifetime(server, make_sandbox):
    """Creation sends the image under the routing key, the size beside it, the lifetime,
    and the run labels (run, owner, process, and the boot's idempotency key)."""
    sandbox = make_sandbox(
        image_metadata_key="gw/image", size="lg", lifetime_sec=900, run_id="r-1", owner="dep"
    )
    async with sandbox:
        record = server.sandboxes[sandbox.sandbox_id]
        assert record.metadata == {
            "gw/image": "registry/task:1",
            "gw/size": "lg",
            "agentrl-run": "r-1",
            "agentrl-owner": "dep",
            "agentrl-process": sweep.process_label(),
            "agentrl-boot": record.idempotency_key,
        }
        assert record.timeout == 900
        assert record.template == "base"
        assert record.idempotency_key
    assert server.calls_to("kill")[0].outcome == "ok"
    assert not record.alive


async def test_sandbox_is_killed_when_the_body_raises(server, make_sandbox):
    """An exception inside the context still kills the sandbox, and propagates unchanged."""
    sandbox = make_sandbox()
    with pytest.raises(RuntimeError, match="boom"):
        async with sandbox:
            sandbox_id = sandbox.sandbox_id
            raise RuntimeError("boom")
    assert [c.outcome for c in server.calls_to("kill", sandbox_id=sandbox_id)] == ["ok"]
    assert not server.sandboxes[sandbox_id].alive


async def test_sandbox_is_killed_when_the_task_is_cancelled_twice(server, make_sandbox):
    """A task cancelled in its body, then again while the kill is retrying, still kills it."""
    # Seeded jitter: the one retry sleeps 0.32 s, the window for the second cancel.
    sandbox = make_sandbox(backoff_base_sec=1.0, backoff_cap_sec=1.0, rng=random.Random(7))
    entered = asyncio.Event()

    async def hold() -> None:
        async with sandbox:
            entered.set()
            await asyncio.sleep(3600)

    task = asyncio.create_task(hold())
    await entered.wait()
    sandbox_id = sandbox.sandbox_id
    server.fail_kill(times=1, status=503)
    task.cancel()
    await _wait_for(lambda: len(server.calls_to("kill")) == 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert server.sandboxes[sandbox_id].alive  # the retry is still sleeping
    await _wait_for(lambda: not server.sandboxes[sandbox_id].alive)
    assert [c.outcome for c in server.calls_to("kill")] == ["fault:status:503", "ok"]


async def test_wrong_api_key_is_a_clear_boot_error_without_retries(server, make_sandbox):
    """A rejected API key fails the boot at once, naming the API and what to check."""
    with pytest.raises(SandboxError, match=r"refused by http://127\.0\.0\.1.*API key"):
        await make_sandbox(api_key="e2b_wrong").start()
    assert [c.outcome for c in server.calls_to("create")] == ["error:401"]


async def test_lifetime_expiry_makes_the_sandbox_gone(server, make_sandbox):
    """When the lifetime runs out the double reaps the sandbox; the next call is SandboxGoneError."""
    async with make_sandbox(lifetime_sec=1) as sandbox:
        await _wait_for(lambda: not server.sandboxes[sandbox.sandbox_id].alive, timeout=5)
        with pytest.raises(SandboxGoneError, match="no longer exists"):
            await sandbox.exec("true")
        assert sandbox.retry_log == []


# -- exec ------------------------------------------------------------------------------------


async def test_exec_returns_exit_code_output_env_workdir_and_user(server, make_sandbox):
    """exec runs the command once and returns its exit code, stdout and stderr."""
    async with make_sandbox() as sandbox:
        home = server.sandboxes[sandbox.sandbox_id].home
        (home / "sub").mkdir()
        result = await sandbox.exec(
            'echo "out $GREETING"; echo err >&2; pwd; exit 3',
            env={"GREETING": "hi"},
            workdir=str(home / "sub"),
            user="agent",
        )
    assert result.exit_code == 3
    assert result.stdout == f"out hi\n{home / 'sub'}\n"
    assert result.stderr == "err\n"
    (call,) = server.calls_to("process.Start")
    assert call.user == "agent"


async def test_exec_check_raises_with_the_output(make_sandbox):
    """check=True turns a non-zero exit into ExecFailedError carrying the result."""
    async with make_sandbox() as sandbox:
        with pytest.raises(ExecFailedError, match="exited with code 2") as info:
            await sandbox.exec("echo nope >&2; exit 2", check=True)
    assert info.value.result.stderr == "nope\n"


async def test_exec_timeout_kills_the_command(server, make_sandbox):
    """A command past its timeout is killed with its children (envd signals only the process
    it started) and reported with EXIT_EXEC_TIMEOUT."""
    async with make_sandbox() as sandbox:
        home = server.sandboxes[sandbox.sandbox_id].home
        result = await sandbox.exec(
            "echo started; sleep 30 & echo $! > child; sleep 30; touch late", timeout=0.5
        )
        assert result.exit_code == EXIT_EXEC_TIMEOUT
        assert result.stdout == "started\n"
        assert "timed out after 0.5s" in result.stderr
        assert [c.outcome for c in server.calls_to("process.SendSignal")] == ["ok"]
        await _wait_for(lambda: _processes_done(server, sandbox.sandbox_id))
        assert not (home / "late").exists()
        child = int((home / "child").read_text())
        await _wait_for(lambda: not _alive(child))


async def test_cancelled_exec_kills_the_command(server, make_sandbox):
    """Cancelling an exec kills its command in the sandbox instead of leaving it running."""
    async with make_sandbox() as sandbox:
        home = server.sandboxes[sandbox.sandbox_id].home
        task = asyncio.create_task(sandbox.exec("touch started; sleep 30; touch late"))
        await _wait_for(lambda: (home / "started").exists())
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert [c.outcome for c in server.calls_to("process.SendSignal")] == ["ok"]
        await _wait_for(lambda: _processes_done(server, sandbox.sandbox_id))
        assert not (home / "late").exists()


async def test_exec_output_is_capped_and_binary_safe(make_sandbox):
    """Long output keeps head and tail around a marker; invalid UTF-8 never crashes."""
    async with make_sandbox(max_output_bytes=64) as sandbox:
        long = await sandbox.exec("head -c 5000 /dev/zero | tr '\\0' a")
        binary = await sandbox.exec("printf 'ok\\377\\376end'")
    assert long.stdout.startswith("a" * 32) and long.stdout.endswith("a" * 32)
    assert "[agentrl: 4936 bytes of output truncated]" in long.stdout
    assert binary.stdout == "ok\ufffd\ufffdend"


async def test_missing_workdir_is_a_clear_error_not_a_gone_sandbox(server, make_sandbox):
    """envd refuses a nonexistent working directory ("cwd ... does not exist"): a SandboxError
    naming it, sent once, while the sandbox stays usable (it is not reported as gone)."""
    async with make_sandbox() as sandbox:
        with pytest.raises(SandboxError, match="cwd '/nonexistent/dir' does not exist") as info:
            await sandbox.exec("true", workdir="/nonexistent/dir")
        assert not isinstance(info.value, SandboxGoneError)
        assert (await sandbox.exec("echo still here")).stdout == "still here\n"
        assert sandbox.retry_log == []
    assert [c.outcome for c in server.calls_to("process.Start")] == ["error:invalid_argument", "ok"]


# -- files -----------------------------------------------------------------------------------


async def test_write_and_read_str_and_bytes(server, make_sandbox):
    """str and bytes round-trip; parents are created; text=False returns bytes."""
    async with make_sandbox() as sandbox:
        await sandbox.write_file("notes/a.txt", "héllo\n")
        await sandbox.write_file("blob.bin", b"\x00\xffdata")
        assert await sandbox.read_file("notes/a.txt") == "héllo\n"
        assert await sandbox.read_file("blob.bin", text=False) == b"\x00\xffdata"
        assert (await sandbox.exec("cat notes/a.txt")).stdout == "héllo\n"
    outcomes = [c.outcome for c in server.calls_to("files.write")]
    assert outcomes == ["ok:multipart:7", "ok:multipart:6"]


async def test_host_path_is_streamed_as_octet_stream(server, make_sandbox, tmp_path):
    """A host Path goes up as a streamed octet-stream body and arrives byte for byte."""
    payload = random.Random(1).randbytes(3 * 1024 * 1024 + 17)
    source = tmp_path / "big.bin"
    source.write_bytes(payload)
    async with make_sandbox() as sandbox:
        await sandbox.write_file("up/big.bin", source)
        assert await sandbox.read_file("up/big.bin", text=False) == payload
    (call,) = server.calls_to("files.write")
    assert call.outcome == f"ok:octet-stream:{len(payload)}"


async def test_missing_files_raise_file_not_found(server, make_sandbox, tmp_path):
    """Reading an absent sandbox file or uploading an absent host file is FileNotFoundError."""
    async with make_sandbox() as sandbox:
        with pytest.raises(FileNotFoundError, match="no such file"):
            await sandbox.read_file("absent.txt")
        with pytest.raises(FileNotFoundError, match="not a file on the host"):
            await sandbox.write_file("x", tmp_path / "absent")
        assert sandbox.retry_log == []
    assert [c.outcome for c in server.calls_to("files.read")] == ["error:404"]


# -- exec_and_wait ---------------------------------------------------------------------------


async def test_exec_and_wait_survives_a_severed_launch_stream(server, make_sandbox):
    """The launch stream is cut mid-command: the exit code still arrives, the command ran once."""
    async with make_sandbox() as sandbox:
        server.sever_stream(match="setsid")
        result = await exec_and_wait(
            sandbox, "echo ran >> ran.txt; echo done; exit 7", time_budget=30, poll_interval=0.05
        )
        assert result.exit_code == 7
        assert result.stdout == "done\n"
        assert (await sandbox.read_file("ran.txt")) == "ran\n"
    assert [c.outcome for c in server.calls_to("process.Start")].count("severed") == 1


async def test_exec_and_wait_survives_a_severed_poll_stream(server, make_sandbox):
    """A cut poll is an idempotent call: it is re-sent and the right exit code comes back."""
    async with make_sandbox() as sandbox:
        server.sever_stream(match="/rc 2>/dev/null", times=2)
        result = await exec_and_wait(
            sandbox, "echo ran >> ran.txt; exit 5", time_budget=30, poll_interval=0.05
        )
        assert result.exit_code == 5
        assert (await sandbox.read_file("ran.txt")) == "ran\n"
        assert len(sandbox.retry_log) == 2
    assert len(server.commands_run("echo ran >> ran.txt")) == 1


# -- retries ---------------------------------------------------------------------------------


async def _do(sandbox: E2BSandbox, route: str):
    if route == "process.Start":
        return (await sandbox.exec("echo hello")).stdout
    if route == "files.write":
        await sandbox.write_file("w.txt", "written")
        return await sandbox.read_file("w.txt")
    return await sandbox.read_file("r.txt")


@pytest.mark.parametrize(
    ("route", "action"),
    [
        ("process.Start", "status"),
        ("process.Start", "reset"),
        ("process.Start", "protocol_error"),
        ("process.Start", "sever"),
        ("files.write", "status"),
        ("files.write", "reset"),
        ("files.write", "protocol_error"),
        ("files.read", "status"),
        ("files.read", "reset"),
        ("files.read", "protocol_error"),
        ("files.read", "sever"),
    ],
)
async def test_transient_failures_of_idempotent_calls_are_retried(
    server, make_sandbox, route, action
):
    """Two transient failures in a row are retried with growing jittered backoff, then succeed."""
    async with make_sandbox(backoff_base_sec=0.01, backoff_cap_sec=1.0) as sandbox:
        (server.sandboxes[sandbox.sandbox_id].home / "r.txt").write_text("read me")
        server.inject(route, action, times=2)
        value = await _do(sandbox, route)
        assert value == {"process.Start": "hello\n", "files.write": "written"}.get(route, "read me")
        events = sandbox.retry_log
        assert [e.attempt for e in events] == [1, 2]
        assert 0 <= events[0].delay_sec <= 0.01 and 0 <= events[1].delay_sec <= 0.02
    attempts = server.calls_to(route)[:3]
    assert [c.outcome.split(":")[0] for c in attempts] in (
        ["fault", "fault", "ok"],
        ["severed", "severed", "ok"],
    )


async def test_retry_dials_a_fresh_connection(server, make_sandbox):
    """After a 502 on a kept-alive connection, the retry arrives on a new connection."""
    async with make_sandbox() as sandbox:
        await sandbox.exec("true")
        server.inject("process.Start", "status")
        await sandbox.exec("echo again")
    first, failed, retried = server.calls_to("process.Start")
    assert failed.outcome == "fault:status:502" and retried.outcome == "ok"
    assert first.peer_port == failed.peer_port  # keep-alive reused the connection
    assert retried.peer_port != failed.peer_port


async def test_retries_exhausted_is_a_clear_error(server, make_sandbox):
    """With rpc_retries=2 a persistent 503 is tried three times, then raised with the count."""
    async with make_sandbox(rpc_retries=2) as sandbox:
        server.inject("files.write", "status", status=503, times=10)
        with pytest.raises(SandboxError, match="after 3 attempts"):
            await sandbox.write_file("x.txt", "x")
        assert len(sandbox.retry_log) == 2
    assert len(server.calls_to("files.write")) == 3


@pytest.mark.parametrize("action", ["status", "reset", "protocol_error", "sever"])
async def test_non_idempotent_exec_is_never_re_sent(server, make_sandbox, action):
    """A transient failure of an idempotent=False exec raises and the command is not re-sent."""
    async with make_sandbox() as sandbox:
        home = server.sandboxes[sandbox.sandbox_id].home
        server.inject("process.Start", action)
        with pytest.raises(SandboxError, match="not re-sent because the call is not idempotent"):
            await sandbox.exec("echo once >> count.txt", idempotent=False)
        await _wait_for(lambda: _processes_done(server, sandbox.sandbox_id))
        assert len(server.calls_to("process.Start")) == 1
        assert sandbox.retry_log == []
        expected = "once\n" if action == "sever" else None
        ran = (home / "count.txt").read_text() if (home / "count.txt").exists() else None
        assert ran == expected


async def test_gone_sandbox_is_not_retried(server, make_sandbox):
    """A sandbox that no longer exists raises SandboxGoneError at once, without retries."""
    async with make_sandbox() as sandbox:
        server.expire(sandbox.sandbox_id)
        before = server.request_count
        with pytest.raises(SandboxGoneError, match="no longer exists"):
            await sandbox.exec("true")
        assert sandbox.retry_log == []
        assert server.request_count == before + 1


# -- boot and kill failures ------------------------------------------------------------------


async def test_boot_failures_are_retried_with_one_idempotency_key(server, make_sandbox):
    """Two failed creations (502, then a lost answer) are retried; one sandbox exists."""
    server.fail_boot(status=502)
    server.inject("create", "sever")
    async with make_sandbox() as sandbox:
        assert (await sandbox.exec("echo up")).stdout == "up\n"
    creates = server.calls_to("create")
    assert [c.outcome for c in creates] == ["fault:status:502", "severed", "ok:idempotent-replay"]
    assert len({c.detail for c in creates}) == 1
    assert len(server.sandboxes) == 1
    assert len(sandbox.retry_log) == 2


async def test_boot_failure_exhausted_is_a_clear_error(server, make_sandbox):
    """A creation that keeps failing raises a SandboxError naming the image and attempts."""
    server.fail_boot(times=10, status=500)
    sandbox = make_sandbox(rpc_retries=1)
    with pytest.raises(
        SandboxError, match=r"create e2b sandbox \(image 'registry/task:1'.*after 2"
    ):
        async with sandbox:
            pytest.fail("the body must not run")
    assert len(server.calls_to("create")) == 2
    assert server.sandboxes == {}


async def test_boot_refused_with_4xx_is_not_retried(server, make_sandbox):
    """A 400 from the gateway (unknown image) is a clear error after one attempt."""
    server.fail_boot(status=400)
    with pytest.raises(SandboxError, match=r"refused by .*gateway knows the image"):
        await make_sandbox().start()
    assert len(server.calls_to("create")) == 1


async def test_kill_failure_is_logged_not_raised(server, make_sandbox, caplog):
    """A kill that keeps failing is retried, then logged as a warning; exit does not raise."""
    server.fail_kill(times=100)
    sandbox = make_sandbox(rpc_retries=2)
    with caplog.at_level(logging.WARNING, logger="agentrl.sandboxes.e2b"):
        async with sandbox:
            sandbox_id = sandbox.sandbox_id
    assert len(server.calls_to("kill")) == 3
    assert server.sandboxes[sandbox_id].alive
    assert any(f"could not kill e2b sandbox {sandbox_id}" in r.getMessage() for r in caplog.records)


async def test_one_failed_kill_is_retried(server, make_sandbox):
    """A single transient kill failure is retried and the sandbox is gone afterwards."""
    server.fail_kill(times=1, status=503)
    async with make_sandbox() as sandbox:
        sandbox_id = sandbox.sandbox_id
    assert [c.outcome for c in server.calls_to("kill")] == ["fault:status:503", "ok"]
    assert not server.sandboxes[sandbox_id].alive


# -- lost creations, boot keys and sweeps -----------------------------------------------------


async def test_create_answer_lost_on_every_retry_leaves_no_sandbox(server, make_sandbox):
    """Every creation happens but no answer arrives: start() raises, and the sandbox the
    re-sends got back (one, by the key) is found by its boot label and killed."""
    server.lose_creates()
    sandbox = make_sandbox(rpc_retries=2)
    with pytest.raises(SandboxError, match=r"after 3 attempts.*killed 1 sandbox\(es\)"):
        await sandbox.start()
    assert [c.outcome for c in server.calls_to("create")] == ["severed"] * 3
    assert len(server.sandboxes) == 1
    assert server.live_sandboxes() == []
    (listing,) = server.calls_to("list")
    assert "agentrl-boot" in listing.detail and listing.outcome == "ok:1"


async def test_create_answer_lost_once_gives_one_sandbox_that_is_used(server, make_sandbox):
    """The first answer is lost; the re-send with the same key gets the same sandbox back,
    which is the one used: exactly one sandbox is created, and nothing is swept."""
    server.lose_creates(times=1)
    async with make_sandbox() as sandbox:
        assert (await sandbox.exec("echo up")).stdout == "up\n"
        assert [r.sandbox_id for r in server.live_sandboxes()] == [sandbox.sandbox_id]
    assert [c.outcome for c in server.calls_to("create")] == ["severed", "ok:idempotent-replay"]
    assert len(server.sandboxes) == 1
    assert server.calls_to("list") == []


async def test_a_refused_creation_is_not_followed_by_a_search(server, make_sandbox):
    """A 4xx means nothing was created: no list call is spent looking for a leftover."""
    server.fail_boot(status=400)
    with pytest.raises(SandboxError, match="refused"):
        await make_sandbox().start()
    assert server.calls_to("list") == []


def _booter(**fields) -> Booter:
    return Booter(policy=RetryPolicy(attempts=3, base=0.001, cap=0.001), **fields)


async def test_booter_re_attempts_send_the_boot_s_one_key(server, make_sandbox):
    """A start that fails after its re-sends is re-attempted by the Booter on a fresh
    sandbox object with the same idempotency key; a second boot has its own key."""
    server.fail_boot(times=2, status=502)  # the whole first start (rpc_retries=1)
    task = Task(instance_id="t", problem_statement="", image="registry/task:1")
    booted = await _booter().boot(lambda t: make_sandbox(t.image, rpc_retries=1), task)
    other = await _booter().boot(lambda t: make_sandbox(t.image, rpc_retries=1), task)
    try:
        creates = server.calls_to("create")
        assert [c.outcome for c in creates] == ["fault:status:502"] * 2 + ["ok", "ok"]
        first_key = server.sandboxes[booted.sandbox_id].idempotency_key
        assert [c.detail for c in creates[:3]] == [creates[2].detail] * 3
        assert first_key in creates[0].detail
        assert server.sandboxes[other.sandbox_id].idempotency_key != first_key
        assert len(server.live_sandboxes()) == 2
    finally:
        await booted.aclose()
        await other.aclose()


async def test_booter_after_a_reaped_attempt_creates_under_a_new_key(server, make_sandbox):
    """Every answer of the first start is lost: its sandbox is killed, and the next attempt
    moves to a new key (the old one would replay a killed sandbox); one sandbox is left."""
    server.lose_creates(times=2)
    task = Task(instance_id="t", problem_statement="", image="registry/task:1")
    sandbox = await _booter().boot(lambda t: make_sandbox(t.image, rpc_retries=1), task)
    try:
        assert (await sandbox.exec("echo up")).stdout == "up\n"
        assert [r.sandbox_id for r in server.live_sandboxes()] == [sandbox.sandbox_id]
        keys = [r.idempotency_key for r in server.sandboxes.values()]
        assert len(keys) == 2 and keys[1] == f"{keys[0]}-1"
    finally:
        await sandbox.aclose()
    assert server.live_sandboxes() == []


async def test_a_start_cancelled_mid_creation_is_reaped_on_close(server, make_sandbox):
    """The Booter's timeout cancels a start whose answer was lost: closing the cancelled
    sandbox finds and kills what it created, so the failed boot leaves nothing."""
    server.lose_creates()
    task = Task(instance_id="t", problem_statement="", image="registry/task:1")
    factory = lambda t: make_sandbox(t.image, backoff_base_sec=5.0, backoff_cap_sec=5.0)  # noqa: E731
    with pytest.raises(BootError):
        await Booter(policy=RetryPolicy(attempts=2, base=0.001), timeout=0.5).boot(factory, task)
    assert len(server.sandboxes) == 2
    assert server.live_sandboxes() == []


async def _raw_sandbox(server: E2BServer, metadata: dict[str, str]) -> str:
    """A sandbox made straight through the SDK with ``metadata`` (not by agentrl's code)."""
    from e2b import AsyncSandbox

    params = {"api_key": API_KEY, "api_url": server.url, "sandbox_url": server.url, "retries": 0}
    return (await AsyncSandbox.create(metadata=metadata, **params)).sandbox_id


async def test_sweep_kills_this_run_s_leftovers_only(server, make_sandbox, monkeypatch):
    """``E2BSandbox.sweep`` kills what run ``mine`` left alive, and neither another run's
    sandbox nor one that is not agentrl's; listing in pages of 2 does not hide any."""
    monkeypatch.setattr(sweep, "_PAGE_SIZE", 2)
    options = {"api_key": API_KEY, "api_url": server.url, "environ": {}, "owner": "dep"}
    mine = [make_sandbox(run_id="mine", owner="dep") for _ in range(3)]
    for sandbox in mine:
        await sandbox.start()  # never closed: as if the process lost track of them
    theirs = make_sandbox(run_id="theirs", owner="dep")
    await theirs.start()
    foreign = await _raw_sandbox(server, {"agentrl-run": "mine"})  # no owner label
    killed = await E2BSandbox.sweep(run_id="mine", **options)
    assert sorted(killed) == sorted(s.sandbox_id for s in mine)
    assert [c.outcome for c in server.calls_to("list")] == ["ok:2", "ok:1"]
    live = {r.sandbox_id for r in server.live_sandboxes()}
    assert live == {theirs.sandbox_id, foreign}
    assert await E2BSandbox.sweep(run_id="mine", **options) == []
    await theirs.aclose()


async def test_sweep_defaults_to_the_run_id_option_then_the_process(server, make_sandbox):
    """Without ``run_id``, the sweep takes the ``run_id`` option, else this process's run id."""
    labelled, default = make_sandbox(run_id="opt"), make_sandbox()
    await labelled.start()
    await default.start()
    options = {"api_key": API_KEY, "api_url": server.url, "environ": {}}
    assert await E2BSandbox.sweep(**options, rng=None) == [default.sandbox_id]
    assert server.sandboxes[labelled.sandbox_id].alive
    assert await E2BSandbox.sweep(**options) == []
    assert await E2BSandbox.sweep(**{**options, "run_id": "opt"}) == [labelled.sandbox_id]
    assert server.sandboxes[default.sandbox_id].metadata["agentrl-run"] == sweep.process_run_id()


async def test_a_failed_sweep_is_logged_not_raised(server, caplog):
    """A sweep whose listing keeps failing returns [] and logs why (a close must not raise)."""
    server.inject("list", "status", times=100, status=503)
    options = {"api_key": API_KEY, "api_url": server.url, "environ": {}, "rpc_retries": 1}
    options |= {"backoff_base_sec": 0.001}
    with caplog.at_level(logging.WARNING, logger="agentrl.sandboxes.e2b"):
        assert await E2BSandbox.sweep(run_id="r", **options) == []
    assert len(server.calls_to("list")) == 2
    assert any("sweep of run r failed" in r.getMessage() for r in caplog.records)


async def test_stale_sweep_kills_only_dead_runs_of_this_deployment(server, make_sandbox):
    """The restart sweep kills the deployment's sandboxes whose process is gone (or is on
    another host), and keeps a live process's, the current run's, another deployment's
    and a non-agentrl one."""
    host = socket.gethostname()
    labels = {"agentrl-owner": "dep", "agentrl-boot": "b"}
    dead = await _raw_sandbox(
        server, {**labels, "agentrl-run": "old", "agentrl-process": f"{host}:999999999:1"}
    )
    reused_pid = await _raw_sandbox(
        server, {**labels, "agentrl-run": "old2", "agentrl-process": f"{host}:{os.getpid()}:1"}
    )
    elsewhere = await _raw_sandbox(
        server, {**labels, "agentrl-run": "old3", "agentrl-process": "other-host:1:1"}
    )
    alive = await _raw_sandbox(
        server, {**labels, "agentrl-run": "peer", "agentrl-process": sweep.process_label()}
    )
    other_deployment = await _raw_sandbox(
        server, {"agentrl-owner": "dep2", "agentrl-run": "old", "agentrl-process": "x:1:1"}
    )
    not_agentrl = await _raw_sandbox(server, {"agentrl-owner": "dep"})  # no run label
    current = make_sandbox(owner="dep", run_id="now")
    await current.start()
    options = {"api_key": API_KEY, "api_url": server.url, "environ": {}, "owner": "dep"}
    killed = await E2BSandbox.sweep_stale_runs(run_id="now", **options)
    assert sorted(killed) == sorted([dead, reused_pid, elsewhere])
    live = {r.sandbox_id for r in server.live_sandboxes()}
    assert live == {alive, other_deployment, not_agentrl, current.sandbox_id}
    await current.aclose()


async def test_sweep_stale_option_sweeps_once_before_the_first_creation(server, make_sandbox):
    """With ``sweep_stale``, the first start kills a dead run's sandbox before creating;
    later starts do not list again. Without it nothing is listed."""
    host = socket.gethostname()
    left = await _raw_sandbox(
        server,
        {"agentrl-owner": "dep", "agentrl-run": "old", "agentrl-process": f"{host}:999999999:1"},
    )
    async with make_sandbox(owner="dep"):
        pass
    assert server.calls_to("list") == [] and server.sandboxes[left].alive
    async with make_sandbox(owner="dep", sweep_stale=True):
        assert not server.sandboxes[left].alive
    async with make_sandbox(owner="dep", sweep_stale=True):
        pass
    assert len(server.calls_to("list")) == 1


def test_sweep_options_come_from_the_environment():
    """AGENTRL_E2B_OWNER and AGENTRL_E2B_SWEEP_STALE set the owner label and the knob."""
    env = {"AGENTRL_E2B_OWNER": "dep-a", "AGENTRL_E2B_SWEEP_STALE": "1"}
    options = E2BOptions.resolve(env)
    assert (options.owner, options.sweep_stale) == ("dep-a", True)
    assert E2BOptions.resolve({}).sweep_stale is False
    assert sweep.owner_of(E2BOptions.resolve({})) == socket.gethostname()


# -- configuration ---------------------------------------------------------------------------


async def test_missing_routing_key_fails_before_any_request(server, make_sandbox):
    """An image without a routing key is a clear error, and nothing reaches the server."""
    with pytest.raises(SandboxError, match="AGENTRL_E2B_IMAGE_METADATA_KEY"):
        make_sandbox(image_metadata_key=None)
    with pytest.raises(SandboxError, match="needs an image"):
        make_sandbox(image=None)
    assert server.request_count == 0


def test_bad_output_cap_fails_at_construction(monkeypatch, server, make_sandbox):
    """An output cap below 64 bytes, or a non-integer one in the environment, is an error
    when the sandbox is built, before any request (not after a command already ran)."""
    with pytest.raises(SandboxError, match="at least 64"):
        make_sandbox(max_output_bytes=10)
    monkeypatch.setenv("AGENTRL_SANDBOX_MAX_OUTPUT_BYTES", "lots")
    with pytest.raises(SandboxError, match="AGENTRL_SANDBOX_MAX_OUTPUT_BYTES='lots'"):
        make_sandbox()
    assert server.request_count == 0


def test_options_come_from_agentrl_then_slime_environment():
    """AGENTRL_E2B_* wins over slime's names; explicit arguments win over both."""
    environ = {
        "SLIME_AGENT_SANDBOX_IMAGE_METADATA_KEY": "gw/image",
        "SLIME_AGENT_SANDBOX_LIFETIME_SEC": "77",
        "SLIME_AGENT_SANDBOX_RPC_RETRIES": "2",
        "SLIME_AGENT_E2B_SANDBOX_SIZE": "xl",
        "AGENTRL_E2B_RPC_RETRIES": "4",
        "AGENTRL_E2B_API_URL": "http://gw:3000",
    }
    options = E2BOptions.resolve(environ, lifetime_sec=10)
    assert options.image_metadata_key == "gw/image"
    assert options.size == "xl" and options.size_metadata_key() == "gw/size"
    assert options.lifetime_sec == 10
    assert options.rpc_retries == 4
    assert options.sdk_params() == {
        "retries": 0,
        "debug": False,
        "request_timeout": 60.0,
        "api_url": "http://gw:3000",
    }
    with pytest.raises(SandboxError, match="SLIME_AGENT_SANDBOX_LIFETIME_SEC='soon' is not"):
        E2BOptions.resolve({"SLIME_AGENT_SANDBOX_LIFETIME_SEC": "soon"})
    with pytest.raises(TypeError, match="unknown e2b option"):
        E2BOptions.resolve({}, lifetime=3)


@pytest.mark.parametrize(
    ("variable", "value", "option", "expected"),
    [
        ("SWE_SANDBOX_IMAGE_METADATA_KEY", "gw/image", "image_metadata_key", "gw/image"),
        ("SWE_SANDBOX_LIFETIME_SEC", "900", "lifetime_sec", 900),
        ("SWE_E2B_SANDBOX_SIZE", "lg", "size", "lg"),
        ("SWE_RPC_RETRIES", "4", "rpc_retries", 3),
        ("SLIME_AGENT_SANDBOX_RPC_RETRIES", "4", "rpc_retries", 3),
        ("AGENTRL_E2B_RPC_RETRIES", "4", "rpc_retries", 4),
    ],
)
def test_slime_legacy_swe_names_set_the_options(variable, value, option, expected):
    """Each of slime's E2B names (the SWE_* legacy ones included) sets its option alone;
    slime's RPC retry names count attempts, so their N is N - 1 re-sends here."""
    assert getattr(E2BOptions.resolve({variable: value}), option) == expected


def test_slime_names_take_precedence_in_slime_s_order():
    """AGENTRL_E2B_* beats SLIME_AGENT_*, which beats the legacy SWE_* name (slime's order)."""
    env = {
        "SWE_SANDBOX_IMAGE_METADATA_KEY": "old",
        "SLIME_AGENT_SANDBOX_IMAGE_METADATA_KEY": "new",
        "SWE_E2B_SANDBOX_SIZE": "sm",
        "SLIME_AGENT_E2B_SANDBOX_SIZE": "xl",
    }
    options = E2BOptions.resolve(env)
    assert (options.image_metadata_key, options.size) == ("new", "xl")
    env["AGENTRL_E2B_SIZE"] = "md"
    assert E2BOptions.resolve(env).size == "md"


def test_rpc_retries_from_slime_names_are_a_clear_error_below_one_attempt():
    """slime's value 0 would make no request at all (slime itself crashes on it): it is
    rejected naming the variable and what it means here, while agentrl's 0 is one attempt."""
    with pytest.raises(SandboxError, match=r"got '0' \(from SWE_RPC_RETRIES, where 0 means -1"):
        E2BOptions.resolve({"SWE_RPC_RETRIES": "0"})
    assert E2BOptions.resolve({"SWE_RPC_RETRIES": "1"}).retry_policy.attempts == 1
    assert E2BOptions.resolve({"AGENTRL_E2B_RPC_RETRIES": "0"}).retry_policy.attempts == 1


def test_same_retry_count_under_agentrl_and_slime_names_does_not_warn(caplog):
    """AGENTRL_E2B_RPC_RETRIES=5 and SWE_RPC_RETRIES=6 mean the same six requests: no
    disagreement is logged; 5 and 5 do disagree (six requests against five) and are logged."""
    with caplog.at_level(logging.WARNING, logger="agentrl.settings"):
        E2BOptions.resolve({"AGENTRL_E2B_RPC_RETRIES": "5", "SWE_RPC_RETRIES": "6"})
    assert "disagree" not in caplog.text
    with caplog.at_level(logging.WARNING, logger="agentrl.settings"):
        E2BOptions.resolve({"AGENTRL_E2B_RPC_RETRIES": "5", "SWE_RPC_RETRIES": "5"})
    assert "disagree" in caplog.text


async def test_slime_rpc_retries_value_makes_as_many_requests_as_in_slime(server, make_sandbox):
    """slime's SWE_RPC_RETRIES=3 makes three requests in all against a persistent 503, as
    slime's own `for attempt in range(rpc_retries)` loop does."""
    retries = E2BOptions.resolve({"SWE_RPC_RETRIES": "3"}).rpc_retries
    async with make_sandbox(rpc_retries=retries) as sandbox:
        server.inject("files.write", "status", status=503, times=10)
        with pytest.raises(SandboxError, match="after 3 attempts"):
            await sandbox.write_file("x.txt", "x")
    assert len(server.calls_to("files.write")) == 3


def test_environment_is_read_when_constructed_not_at_import(monkeypatch, server):
    """A variable set after import is honoured by the next sandbox built."""
    monkeypatch.setenv("AGENTRL_E2B_IMAGE_METADATA_KEY", "late/image")
    sandbox = E2BSandbox("img", api_url=server.url)
    assert sandbox.options.image_metadata_key == "late/image"


def test_importing_the_backend_does_not_import_the_sdk():
    """agentrl.sandboxes and its e2b module load without importing the e2b SDK."""
    code = "import sys, agentrl.sandboxes.e2b; assert 'e2b' not in sys.modules, 'e2b imported'"
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ))


def test_missing_sdk_says_what_to_install(monkeypatch):
    """Without the SDK, constructing the sandbox says to install the e2b extra's package."""
    monkeypatch.setitem(sys.modules, "e2b", None)
    with pytest.raises(ImportError, match=r"pip install 'e2b>=2.0' \(agentrl's \[e2b\] extra"):
        E2BSandbox("img", image_metadata_key="image", environ={})


def test_registered_as_e2b_and_built_from_a_task():
    """The built-in plugin registers the class as 'e2b'; from_task takes image and workdir."""
    registry = plugins.PluginRegistry(builtins=("agentrl.sandboxes",), load_entrypoints=False)
    assert registry.get("sandbox", "e2b") is E2BSandbox
    task = Task(instance_id="t", problem_statement="p", image="img:2", workdir="/repo")
    sandbox = E2BSandbox.from_task(task, image_metadata_key="image", environ={})
    assert (sandbox.image, sandbox.workdir) == ("img:2", "/repo")


def test_url_for_is_the_routable_host_address(caplog):
    """url_for returns http://host:port, brackets IPv6, and warns about loopback hosts."""
    sandbox = E2BSandbox("img", image_metadata_key="image", environ={})
    assert sandbox.url_for("10.1.2.3", 8000) == "http://10.1.2.3:8000"
    assert sandbox.url_for("fd00::5", 80) == "http://[fd00::5]:80"
    assert sandbox.url_for("head-node", 9) == "http://head-node:9"
    with caplog.at_level(logging.WARNING, logger="agentrl.sandboxes.e2b"):
        sandbox.url_for("127.0.0.1", 8000)
    assert "loopback" in caplog.text


def test_backoff_options_make_the_shared_full_jitter_policy():
    """rpc_retries, backoff_base_sec and backoff_cap_sec map onto agentrl.retry's policy:
    retries + 1 attempts, delay n uniform in [0, min(cap, base * 2**(n-1))]."""
    options = E2BOptions.resolve(
        {"AGENTRL_E2B_RPC_RETRIES": "6", "AGENTRL_E2B_BACKOFF_BASE_SEC": "1.5"},
        backoff_cap_sec=8.0,
    )
    policy = options.retry_policy
    assert policy == RetryPolicy(attempts=7, base=1.5, cap=8.0, jitter=1.0)
    assert [policy.ceiling(n) for n in range(1, 7)] == [1.5, 3, 6, 8, 8, 8]
    rng = random.Random(3)
    delays = [policy.delay(n, rng) for n in range(1, 7)]
    assert all(0 <= d <= policy.ceiling(n) for n, d in enumerate(delays, start=1))
    assert len(set(delays)) == 6


def test_classification_of_client_failures():
    """Transport and 5xx failures are transient; gone and 4xx ones are not."""
    import httpx
    from connectrpc.code import Code
    from connectrpc.errors import ConnectError
    from e2b.exceptions import (
        AuthenticationException,
        FileNotFoundException,
        InvalidArgumentException,
        SandboxException,
        SandboxNotRunningException,
        SandboxUnreachableException,
    )

    transient = [
        httpx.RemoteProtocolError("h2 stream reset"),
        ssl.SSLError("bad record mac"),
        ConnectionResetError("reset by peer"),
        ConnectError(Code.UNAVAILABLE, "stream error"),
        SandboxUnreachableException("502 from proxy"),
        SandboxException("503: busy"),
        Exception("Command ended without an end event"),
    ]
    gone = [
        SandboxNotRunningException("sandbox was not found"),
        SandboxException("sandbox abc does not exist"),
        SandboxException("sandbox is in STOPPED state"),
    ]
    fatal = [
        SandboxException("400: bad template"),
        AuthenticationException("no key"),
        KeyError(),
        InvalidArgumentException("cwd '/testbed' does not exist"),
        FileNotFoundException("path '/x' does not exist"),
    ]
    wrapped = RuntimeError("wrapper")
    wrapped.__cause__ = ConnectionAbortedError()
    assert [classify(e) for e in [*transient, wrapped]] == [Verdict.TRANSIENT] * 8
    assert [classify(e) for e in gone] == [Verdict.GONE] * 3
    assert [classify(e) for e in fatal] == [Verdict.FATAL] * 5


async def test_double_replays_a_creation_with_the_same_idempotency_key(server):
    """Two SDK creations with one Idempotency-Key yield the same sandbox (server semantics)."""
    from e2b import AsyncSandbox

    params = {"api_key": API_KEY, "api_url": server.url, "sandbox_url": server.url, "retries": 0}
    first = await AsyncSandbox.create(idempotency_key="k-1", **params)
    second = await AsyncSandbox.create(idempotency_key="k-1", **params)
    assert first.sandbox_id == second.sandbox_id
    assert await first.kill()
    assert not server.sandboxes[first.sandbox_id].alive


@pytest.mark.parametrize(
    ("options", "sent"),
    [
        ({}, {}),
        ({"allow_internet_access": False}, {"allow_internet_access": False}),
        (
            {"allow_internet_access": False, "egress_allow": ["mw.example.com", "10.0.0.0/8"]},
            {"network": {"allowOut": ["mw.example.com", "10.0.0.0/8"], "denyOut": ["0.0.0.0/0"]}},
        ),
    ],
)
async def test_egress_is_restricted_through_the_sdk_option(server, make_sandbox, options, sent):
    """``allow_internet_access=False`` reaches E2B's create request as the SDK's own field
    (alone, or as deny-all-but ``egress_allow``); left unset, nothing is sent."""
    async with make_sandbox(**options) as sandbox:
        assert server.sandboxes[sandbox.sandbox_id].egress == sent


async def test_lost_externally_only_on_the_providers_word(server, make_sandbox):
    """After the agent ran, only the API's "no such sandbox" (or our own teardown) is the
    provider's doing; a failed command or a transport error is not evidence of it."""
    async with make_sandbox(rpc_retries=0) as sandbox:
        assert not await sandbox.lost_externally(SandboxError("exec failed: exit 137"))
        server.inject("files.write", "status", status=503, times=1)
        with pytest.raises(SandboxError) as unreachable:
            await sandbox.write_file("x.txt", "x")
        assert not await sandbox.lost_externally(unreachable.value)
        server.expire(sandbox.sandbox_id)
        with pytest.raises(SandboxGoneError) as gone:
            await sandbox.exec("true")
        assert await sandbox.lost_externally(gone.value)
        wrapped = SandboxError("could not capture the diff")
        wrapped.__cause__ = gone.value
        assert await sandbox.lost_externally(wrapped)
    assert await sandbox.lost_externally(SandboxError("after close"))
