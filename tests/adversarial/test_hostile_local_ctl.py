"""A hostile command in the real ``local`` sandbox attacks the host through the control area.

Each test runs the attack from inside a real bubblewrap sandbox (symlinks, FIFOs, devices,
sparse files, floods, races by a background loop) and asserts that a canary host file is
neither written nor returned, that every read is capped, that the host's event loop stays
responsive (bounds below), and that no process outlives the sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import shutil
import time

import pytest

from agentrl.sandboxes.base import SandboxError
from agentrl.sandboxes.local import LocalSandbox, processes_in_namespace

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")

#: A concurrent exec answers within this while an attack runs.
EXEC_BOUND_S = 2.0
#: The host's event loop is never blocked longer than this.
LOOP_GAP_BOUND_S = 0.5
SECRET = "agentrl-canary-host-secret-3f9c"
#: In-sandbox: ``$s`` is the path of this command's own stdout file less its "out", so
#: ``${s}out``, ``${s}err`` and ``${s}rc`` name its output files (in any layout of the area).
SELF = "o=$(readlink /proc/$$/fd/1); s=${o%out}; "


#: Every exec's stdout, stderr and every read_file transfer (this layout's and main's before).
_ALL_OUT = "/.agentrl/out/*.out /.agentrl/ctl/req/*/out"
_ALL_ERR = "/.agentrl/out/*.err /.agentrl/ctl/req/*/err"
_ALL_XFER = "/.agentrl/out/*.xfer /.agentrl/ctl/xfer/*"


@pytest.fixture
def canary(tmp_path) -> pathlib.Path:
    path = tmp_path / "canary"
    path.write_text(SECRET + "\n")
    return path


@contextlib.asynccontextmanager
async def hostile(tmp_path: pathlib.Path, **options):
    """A started sandbox, and after it closes: no process of it left, its state gone."""
    sb = LocalSandbox(state_dir=tmp_path / "state", **options)
    async with sb:
        ns = sb.pid_namespace
        yield sb
    assert ns is not None and processes_in_namespace(ns) == []
    assert sb.state is not None and not sb.state.exists()


class LoopWatch:
    """The longest gap between ticks of a 10 ms timer on the event loop."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task | None = None

    async def _tick(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            self.worst = max(self.worst, now - last - 0.01)
            last = now

    async def __aenter__(self) -> LoopWatch:
        self._task = asyncio.create_task(self._tick())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def _timed_exec(sb: LocalSandbox, cmd: str, **kw) -> tuple[float, object]:
    started = time.monotonic()
    result = await sb.exec(cmd, **kw)
    return time.monotonic() - started, result


async def _background(sb: LocalSandbox, loop_body: str) -> None:
    """Start ``while :; do loop_body; done`` detached in the sandbox."""
    script = f"while :; do {loop_body}; done"
    await sb.exec(f"setsid sh -c {_q(script)} > /dev/null 2>&1 < /dev/null &")


def _q(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


# -- the host-written area is read-only --------------------------------------------------------


async def test_control_area_is_read_only_and_unlinkable(tmp_path):
    """Attack: write, replace or hard-link anything in /.agentrl/ctl (requests, uploads,
    FIFOs), or remount it writable from a new user namespace. Bound: every attempt fails."""
    attempts = [
        "touch /.agentrl/ctl/x",
        "mkdir /.agentrl/ctl/req/0123abcd",
        "for d in /.agentrl/ctl/req/*; do rm -rf $d; ln -s /etc $d; done",
        "ln -sf /etc/shadow /.agentrl/ctl/in/x",
        "ln /.agentrl/ctl/queue /.agentrl/out/q",
        "for d in /.agentrl/ctl/req/*; do ln $d/cmd.sh /.agentrl/out/c; done; [ -e /.agentrl/out/c ]",
        "unshare -rm sh -c 'mount -o remount,bind,rw /.agentrl/ctl && touch /.agentrl/ctl/x'",
    ]
    async with hostile(tmp_path) as sb:
        results = [await sb.exec(f"{cmd} 2>/dev/null") for cmd in attempts]
        after = await sb.exec("echo still-fine")
    assert [cmd for cmd, r in zip(attempts, results, strict=True) if r.exit_code == 0] == []
    assert after.stdout == "still-fine\n"


@pytest.mark.slow
async def test_racing_request_file_symlinks_never_touch_the_host(tmp_path, canary):
    """Attack: a background loop replaces cmd.sh/env.sh/user of every new request with
    symlinks to a host file while the host runs 100 execs. Bound: the canary is untouched,
    no host file is created, every exec answers correctly."""
    created = tmp_path / "created-by-the-host"
    body = (
        "for d in /.agentrl/ctl/req/*/; do for f in cmd.sh env.sh user; do "
        f"rm -f $d$f 2>/dev/null; ln -sf {canary} $d$f 2>/dev/null && echo hit >> /tmp/hits; "
        f"ln -sf {created} $d$f 2>/dev/null; done; echo x >> /tmp/tries; done"
    )
    async with hostile(tmp_path) as sb:
        await _background(sb, body)
        results = [await sb.exec(f"echo run-{i}", user="agent") for i in range(100)]
        tries = await sb.exec("wc -l < /tmp/tries; cat /tmp/hits 2>/dev/null | wc -l")
    assert [r.stdout for r in results] == [f"run-{i}\n" for i in range(100)]
    assert canary.read_text() == SECRET + "\n"
    assert not created.exists()
    seen, hits = (int(n) for n in tries.stdout.split())
    assert seen > 0 and hits == 0


# -- outputs the sandbox writes ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("attack", "expected"),
    [
        ("ln -s {canary} ${s}out", "[agentrl: stdout was not a regular file (a symbolic link)]\n"),
        (
            "ln -s /etc/shadow ${s}out",
            "[agentrl: stdout was not a regular file (a symbolic link)]\n",
        ),
        ("ln -s /dev/zero ${s}out", "[agentrl: stdout was not a regular file (a symbolic link)]\n"),
        ("mkfifo ${s}out", "[agentrl: stdout was not a regular file (a FIFO)]\n"),
        ("mkdir ${s}out", "[agentrl: stdout was not a regular file (a directory)]\n"),
    ],
)
async def test_stdout_replaced_by_a_link_fifo_or_dir_reads_as_a_marker(
    tmp_path, canary, attack, expected
):
    """Attack: the command replaces its own stdout file with a symlink to a host file
    (the canary, /etc/shadow, /dev/zero), a FIFO or a directory. Bound: the result is the
    marker, never host data, and the exec returns at once (under EXEC_BOUND_S)."""
    cmd = SELF + "exec > /dev/null; rm -f ${s}out; " + attack.replace("{canary}", str(canary))
    async with hostile(tmp_path) as sb:
        took, result = await _timed_exec(sb, cmd)
    assert result.stdout == expected
    assert SECRET not in result.stdout and "root:" not in result.stdout
    assert took < EXEC_BOUND_S


async def test_huge_sparse_output_is_capped(tmp_path):
    """Attack: the command's stdout becomes a 2 GiB sparse file. Bound: the host reads only
    max_output_bytes of it, with the truncation marker."""
    async with hostile(tmp_path, max_output_bytes=4096) as sb:
        took, result = await _timed_exec(sb, SELF + "truncate -s 2G ${s}out; echo -n")
    assert "[agentrl: 2147479552 bytes of output truncated]" in result.stdout
    assert len(result.stdout.encode()) < 4096 + 100
    assert took < EXEC_BOUND_S


async def test_fifo_at_rc_does_not_block_the_host(tmp_path):
    """Attack: the command puts a FIFO where its exit code goes (the host used to block on
    it forever, freezing the event loop). Bound: concurrent execs answer within
    EXEC_BOUND_S, the loop never stalls over LOOP_GAP_BOUND_S, the attacked exec finishes
    normally once the real exit code replaces the FIFO."""
    async with hostile(tmp_path) as sb, LoopWatch() as watch:
        attacked = asyncio.create_task(
            _timed_exec(sb, SELF + "mkfifo ${s}rc; sleep 1.5; exit 3", timeout=20)
        )
        await asyncio.sleep(0.3)
        probes = [await _timed_exec(sb, "echo probe") for _ in range(5)]
        took, result = await attacked
    assert result.exit_code == 3
    assert took < 1.5 + EXEC_BOUND_S
    assert all(t < EXEC_BOUND_S and r.stdout == "probe\n" for t, r in probes)
    assert watch.worst < LOOP_GAP_BOUND_S


@pytest.mark.slow
async def test_racing_output_symlinks_never_return_host_files(tmp_path, canary):
    """Attack: a background loop swaps every stdout/stderr file and every read_file transfer
    for a symlink to a host file (the canary, /etc/shadow) while the host runs 100 execs
    and 20 read_files. Bound: no result holds host data; each is the real output, the
    marker, or (read_file) a SandboxError."""
    body = (
        f"for f in {_ALL_OUT} {_ALL_ERR} {_ALL_XFER}; do "
        f"[ -e $f ] && ln -sf {canary} $f.t 2>/dev/null && mv -f $f.t $f 2>/dev/null; done; "
        f"for f in {_ALL_ERR}; do ln -sf /etc/shadow $f 2>/dev/null; done"
    )
    async with hostile(tmp_path) as sb:
        await sb.write_file("/tmp/data.txt", "sandbox data\n")
        await _background(sb, body)
        results = [await sb.exec("echo out; echo err >&2") for _ in range(100)]
        reads = []
        for _ in range(20):
            try:
                reads.append(await sb.read_file("/tmp/data.txt"))
            except SandboxError as exc:
                reads.append(str(exc))
    texts = [r.stdout + r.stderr for r in results] + reads
    assert not any(SECRET in t or "root:" in t for t in texts)
    assert all(r.stdout in ("out\n", "") or "not a regular file" in r.stdout for r in results)


async def test_read_file_is_capped(tmp_path):
    """Attack: a file far over the cap (8 MiB here, for a 1 MiB cap; the sandbox's real cap is
    64 MiB) is read back. Bound: text keeps at most
    read_file_max_bytes around the marker; bytes mode raises SandboxError naming the cap."""
    async with hostile(tmp_path) as sb:
        sb.read_file_max_bytes = 1 << 20
        await sb.exec("truncate -s 8M /tmp/big")
        text = await sb.read_file("/tmp/big")
        with pytest.raises(SandboxError, match="over read_file's cap of 1048576 bytes"):
            await sb.read_file("/tmp/big", text=False)
    assert "[agentrl: 7340032 bytes of output truncated]" in text
    assert len(text) < (1 << 20) + 100


# -- the completion FIFO -----------------------------------------------------------------------


async def test_done_fifo_flood_does_not_pin_the_loop(tmp_path):
    """Attack: background writers flood the completion FIFO with endless lines without a
    newline and with garbage lines. Bound: the host buffers at most MAX_LINE bytes, the
    loop never stalls over LOOP_GAP_BOUND_S, and execs still answer within EXEC_BOUND_S."""
    async with hostile(tmp_path) as sb:
        await _background(sb, "head -c 1000000 /dev/zero > /.agentrl/ctl/done")
        await _background(sb, "yes garbage-not-an-id | head -n 100000 > /.agentrl/ctl/done")
        await asyncio.sleep(0.5)
        async with LoopWatch() as watch:
            probes = [await _timed_exec(sb, "echo probe") for _ in range(20)]
        done = sb._channel._done
        partial = len(getattr(done, "_partial", getattr(done, "_buffer", b"")))
    assert all(t < EXEC_BOUND_S and r.stdout == "probe\n" for t, r in probes)
    assert watch.worst < LOOP_GAP_BOUND_S
    assert partial <= done.MAX_LINE


# -- removal of what the sandbox left ----------------------------------------------------------


async def test_huge_or_deep_leftovers_are_removed_boundedly(tmp_path):
    """Attack: the command turns its stderr file into a directory with 12,000 files and its
    stdout into a 1,200-deep tree. Bound: the exec returns within EXEC_BOUND_S of the
    command's end with markers, and the teardown still removes the whole state."""
    deep = "/".join(["d"] * 1200)
    cmd = (
        SELF
        + "exec > /dev/null 2>&1; rm -f ${s}out ${s}err; mkdir -p ${s}err ${s}out/"
        + deep
        + "; cd ${s}err && seq 12000 | xargs touch; echo -n"
    )
    async with hostile(tmp_path) as sb:
        started = time.monotonic()
        result = await sb.exec(cmd, timeout=60)
        took = time.monotonic() - started
        after = await sb.exec("echo fine")
    assert result.stdout.startswith("[agentrl: stdout was not a regular file (a directory)]")
    assert result.stderr.startswith("[agentrl: stderr was not a regular file (a directory)]")
    assert took < 10
    assert after.stdout == "fine\n"
