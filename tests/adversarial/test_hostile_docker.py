"""A hostile policy inside a ``docker`` sandbox (a real dockerd): what it cannot do."""

from __future__ import annotations

import time

import pytest

from agentrl.sandboxes.base import EXIT_EXEC_TIMEOUT
from agentrl.sandboxes.docker import DockerSandbox

pytestmark = pytest.mark.slow


async def test_an_endless_stdout_flood_costs_the_host_only_the_cap(docker_options):
    """Attack: ``yes`` forever. Bound: the exec ends at its timeout with at most the cap
    (1 MiB and the marker) kept, and the sandbox answers the next exec."""
    async with DockerSandbox(**docker_options, max_output_bytes=1 << 16) as box:
        started = time.monotonic()
        result = await box.exec("yes agentrl-flood", user="agent", timeout=3)
        assert result.exit_code == EXIT_EXEC_TIMEOUT
        assert time.monotonic() - started < 15
        assert len(result.stdout.encode()) <= (1 << 16) + 100
        assert "bytes of output truncated" in result.stdout
        assert (await box.exec("echo ok")).stdout == "ok\n"


async def test_the_agent_cannot_kill_init_or_roots_processes(docker_options):
    """Attack: ``kill -9 -1`` and ``kill -9 1`` as the agent. Bound: the container's init and
    root's processes survive, the sandbox keeps answering, and the host does not take the
    attempt for its own loss of the sandbox."""
    async with DockerSandbox(**docker_options) as box:
        await box.exec("kill -9 -1; kill -9 1; true", user="agent")
        assert (await box.exec("echo alive")).stdout == "alive\n"
        assert not await box.lost_externally(RuntimeError("probe"))


async def test_the_host_process_table_is_invisible(docker_options):
    """Attack: look for host processes in /proc. Bound: only the container's own are there."""
    async with DockerSandbox(**docker_options) as box:
        result = await box.exec("ls /proc | grep -c '^[0-9]'", user="agent")
        assert int(result.stdout) < 20
        names = await box.exec("cat /proc/[0-9]*/comm 2>/dev/null | sort -u", user="agent")
        assert "dockerd" not in names.stdout and "python" not in names.stdout.split()


async def test_agent_files_cannot_reach_root_only_paths(docker_options):
    """Attack: write over the image and read root's home as the agent. Bound: both refused."""
    async with DockerSandbox(**docker_options) as box:
        assert (await box.exec("echo x > /usr/bin/sh", user="agent")).exit_code != 0
        assert (await box.exec("ls /root", user="agent")).exit_code != 0
        assert (await box.exec("echo x > /etc/passwd", user="root")).exit_code != 0


async def test_only_the_host_or_the_daemon_loses_the_sandbox(docker_options):
    """The container removed from the host side is the backend's loss (``infra_error``);
    one the agent merely tried to kill is not (above)."""
    async with DockerSandbox(**docker_options) as box:
        await box.exec("kill -9 -1; true", user="agent")
        assert not await box.lost_externally(RuntimeError("probe"))
        await box._container.delete(force=True)  # the host's doing, out of the agent's reach
        assert await box.lost_externally(RuntimeError("exec failed"))
