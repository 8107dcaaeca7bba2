"""A hostile policy inside the real ``local`` sandbox reaching for host data and host disk.

Each test runs the attack from inside a real bubblewrap sandbox and asserts on the host:
the launcher's environment and file descriptors stay out of reach, the agent's uid is not
the host's root, /dev is read-only, and every area a command can fill (workspace, output,
/dev/shm) stops at its size without the host's disk or memory growing.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import resource
import time

import pytest

from agentrl.sandboxes.local import LocalSandbox

pytestmark = pytest.mark.slow

_CANARY = "agentrl-canary-7d1f0b2c"


def _tree_bytes(root: pathlib.Path) -> int:
    """Bytes the host's filesystem holds under ``root`` (allocated blocks, sparse-aware)."""
    total = 0
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                pass
    return total


@pytest.fixture
def state_dir(tmp_path) -> pathlib.Path:
    """Where this test's sandboxes keep their host-side state."""
    return tmp_path / "state"


async def test_no_process_inside_shows_the_launchers_environment(state_dir, monkeypatch):
    """An API-key canary in the launching process's environment appears in no process's
    /proc/*/environ inside (pid 1, bubblewrap's init, included)."""
    monkeypatch.setenv("AGENTRL_TEST_SECRET_KEY", _CANARY)
    async with LocalSandbox(state_dir=state_dir) as sb:
        found = await sb.exec(
            "for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f; done 2>/dev/null", user="agent"
        )
        nested = await sb.exec("cat /proc/1/environ | tr '\\0' '\\n'", user="root")
    assert _CANARY not in found.stdout and _CANARY not in nested.stdout
    assert "AGENTRL_TEST_SECRET_KEY" not in found.stdout


async def test_pid1s_output_is_no_channel_to_the_host_disk(state_dir):
    """Writing 64 MB into /proc/1/fd/1 and /proc/1/fd/2 (bubblewrap's init's output) puts
    nothing on the host's disk: the output is a pipe the host stops reading, so the writer
    blocks (and is stopped by its own timeout) instead."""
    async with LocalSandbox(state_dir=state_dir) as sb:
        before = _tree_bytes(state_dir)
        spam = await sb.exec(
            "for fd in 1 2; do timeout 2 sh -c "
            '"head -c 33554432 /dev/zero > /proc/1/fd/$fd"; echo $?; done',
            user="agent",
            timeout=20,
        )
        after = _tree_bytes(state_dir)
        assert (await sb.exec("echo alive")).stdout == "alive\n"
    codes = spam.stdout.split()
    assert all(code != "0" for code in codes), spam
    assert after - before < 1 << 20


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid mapping under test is a root host's")
async def test_agent_uid_is_not_host_root(state_dir, tmp_path):
    """On a root host the sandbox's ids map to an unprivileged host uid: a root-only host file
    bound in stays unreadable to the agent and to its own nested root (``unshare -r``), and the
    sandbox's processes run as that uid on the host."""
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "key").write_text(_CANARY)
    (secrets / "key").chmod(0o600)
    async with LocalSandbox(state_dir=state_dir, ro_binds={"/secrets": str(secrets)}) as sb:
        agent = await sb.exec("cat /secrets/key", user="agent")
        root = await sb.exec("cat /secrets/key", user="root")
        nested = await sb.exec("unshare -r cat /secrets/key", user="agent")
        sleeper = await sb.exec("sleep 30 & echo started", user="agent")
        pids = [
            int(p) for p in os.listdir("/proc") if p.isdigit() and _namespace(p) == sb.pid_namespace
        ]
        uids = {os.stat(f"/proc/{p}").st_uid for p in pids}
    for result in (agent, root, nested):
        assert result.exit_code != 0 and _CANARY not in result.stdout, result
    assert sleeper.ok and uids and 0 not in uids


def _namespace(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


async def test_dev_is_read_only_and_shm_is_bounded(state_dir):
    """/dev takes no new files (read-only); /dev/shm stops at ``shm_size_mb``; the device
    nodes still work."""
    async with LocalSandbox(state_dir=state_dir, shm_size_mb=4) as sb:
        create = await sb.exec("touch /dev/evil", user="agent")
        fill = await sb.exec("head -c 8000000 /dev/zero > /dev/shm/big", user="agent")
        size = await sb.exec("stat -c %s /dev/shm/big")
        nodes = await sb.exec("echo x > /dev/null && head -c 3 /dev/zero | wc -c")
    assert create.exit_code != 0 and "Read-only file system" in create.stderr
    assert fill.exit_code != 0 and "No space left on device" in fill.stderr
    assert int(size.stdout) <= 4 * 1024 * 1024
    assert nodes.stdout.strip() == "3"


async def test_workspace_stops_at_its_quota_without_host_disk(state_dir, tmp_path):
    """Filling the workspace stops at ``workspace_size_mb`` with ENOSPC inside; the host's disk
    under the state directory does not grow (the area is a tmpfs of the sandbox's own)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.txt").write_text("a\n")
    for overlay in ("auto", "never"):
        async with LocalSandbox(
            state_dir=state_dir, repo=str(repo), overlay=overlay, workspace_size_mb=8
        ) as sb:
            before = _tree_bytes(state_dir)
            fill = await sb.exec("head -c 64000000 /dev/zero > big", user="agent")
            size = int((await sb.exec("stat -c %s big")).stdout)
            after = _tree_bytes(state_dir)
            # Room comes back when the file goes.
            again = await sb.exec("rm big && echo ok > small && cat small", user="agent")
        assert fill.exit_code != 0 and "No space left on device" in fill.stderr, overlay
        # The copy's area is the repository's size (rounded up to pages) plus the quota.
        assert size <= 11 * 1024 * 1024, overlay
        assert after - before < 1 << 20, overlay
        assert again.stdout == "ok\n", overlay


async def test_a_flood_of_stdout_costs_the_host_neither_disk_nor_memory(state_dir):
    """``yes`` for 3 s (gigabytes of stdout) comes back capped; the host's disk under the state
    directory (sampled while it runs) and its own peak RSS do not grow with it; the sandbox
    answers afterwards."""
    async with LocalSandbox(state_dir=state_dir, output_size_mb=16) as sb:
        before = _tree_bytes(state_dir)
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        started = time.monotonic()
        task = asyncio.ensure_future(sb.exec("timeout 3 yes", user="agent", timeout=20))
        after = before
        while not task.done():
            after = max(after, await asyncio.to_thread(_tree_bytes, state_dir))
            await asyncio.sleep(0.2)
        flood = task.result()
        elapsed = time.monotonic() - started
        rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        alive = await sb.exec("echo alive")
    assert "bytes of output truncated" in flood.stdout
    assert len(flood.stdout.encode()) <= sb.max_output + 200
    assert after - before < 1 << 20
    assert rss_after - rss_before < 64 * 1024  # KiB: the host never held the flood
    assert alive.stdout == "alive\n" and elapsed < 15


async def test_who_ended_the_sandbox_is_known_from_outside_it(state_dir):
    """``kill -9 -1`` by the agent ends the sandbox as the agent's doing
    (``lost_externally`` False, so the rollout trains); the host killing bubblewrap's outer
    process, which no process inside can signal, is external (True)."""
    from agentrl.sandboxes.base import SandboxError

    async with LocalSandbox(state_dir=state_dir) as sb:
        with pytest.raises(SandboxError) as by_agent:
            await sb.exec("kill -9 -1; sleep 5", user="agent", timeout=20)
            await sb.exec("true")
        assert await sb.lost_externally(by_agent.value) is False
    async with LocalSandbox(state_dir=state_dir) as sb:
        os.kill(sb._process.pid, 9)
        with pytest.raises(SandboxError) as by_host:
            await sb.exec("sleep 5", timeout=20)
        assert await sb.lost_externally(by_host.value) is True
