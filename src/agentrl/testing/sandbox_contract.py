"""The sandbox contract as a reusable test suite: every backend must pass it.

Subclass :class:`SandboxContract` in a test module and give it a ``contract_factory``
fixture: a callable ``factory(task) -> Sandbox`` (not started) for your backend. pytest
collects the inherited tests::

    from agentrl.testing.sandbox_contract import SandboxContract

    class TestMySandbox(SandboxContract):
        @pytest.fixture
        def contract_factory(self, tmp_path):
            return lambda task: MySandbox.from_task(task, **my_options)

The tests need pytest-asyncio (auto mode, or mark the module). The task they pass names
``contract_repo`` (a small host directory) as its repository and ``/workspace`` as its
workdir; a backend that cannot take a host repository overrides ``contract_task``.
The class attributes ``agent_is_unprivileged`` (the ``agent`` user's uid is not 0) and
``takes_host_repo`` say what a backend offers.
"""

from __future__ import annotations

import asyncio
import pathlib
import time
from collections.abc import Callable
from typing import Any

import pytest

from agentrl.sandboxes.base import (
    EXIT_EXEC_TIMEOUT,
    ExecFailedError,
    Sandbox,
    SandboxError,
)
from agentrl.sandboxes.exec import exec_and_wait
from agentrl.types import Task

__all__ = ["SandboxContract"]

ContractFactory = Callable[[Task], Sandbox]


class SandboxContract:
    """The tests every sandbox backend passes (see the module docstring)."""

    agent_is_unprivileged: bool = True
    #: Whether the backend copies a host ``repo`` into the workspace (``e2b`` does not).
    takes_host_repo: bool = True

    @pytest.fixture
    def contract_repo(self, tmp_path: pathlib.Path) -> pathlib.Path:
        """A host directory with one file, the task's repository."""
        repo = tmp_path / "contract-repo"
        repo.mkdir()
        (repo / "hello.txt").write_text("hello from the repo\n")
        return repo

    @pytest.fixture
    def contract_task(self, contract_repo: pathlib.Path) -> Task:
        """The task every contract test boots a sandbox for."""
        return Task(
            instance_id="contract-1",
            problem_statement="",
            repo=str(contract_repo),
            workdir="/workspace",
        )

    @pytest.fixture
    async def sandbox(self, contract_factory: ContractFactory, contract_task: Task) -> Any:
        """A started sandbox of the backend, closed after the test."""
        box = contract_factory(contract_task)
        await box.start()
        try:
            yield box
        finally:
            await box.aclose()

    async def test_exec_returns_exit_code_output_env_and_workdir(self, sandbox: Sandbox) -> None:
        """An exec reports the command's exit code, both streams, its env and its workdir."""
        result = await sandbox.exec(
            'echo "out $GREETING"; pwd; echo err >&2; exit 7',
            env={"GREETING": "hi"},
            workdir="/tmp",
        )
        assert result.exit_code == 7
        assert result.stdout == "out hi\n/tmp\n"
        assert result.stderr == "err\n"

    async def test_the_repository_is_at_the_workdir_and_writable_by_the_agent(
        self, sandbox: Sandbox
    ) -> None:
        """The task's repository appears at its workdir, and the agent can edit it."""
        if not self.takes_host_repo:
            pytest.skip("this backend takes no host repository")
        result = await sandbox.exec(
            "cat hello.txt && echo edit >> hello.txt && tail -1 hello.txt",
            user="agent",
            workdir="/workspace",
        )
        assert result.exit_code == 0, result
        assert result.stdout == "hello from the repo\nedit\n"

    async def test_check_raises_with_the_output(self, sandbox: Sandbox) -> None:
        """``check=True`` turns a non-zero exit into ``ExecFailedError`` carrying the output."""
        with pytest.raises(ExecFailedError) as info:
            await sandbox.exec("echo broken >&2; exit 3", check=True)
        assert info.value.result.exit_code == 3
        assert "broken" in info.value.result.stderr

    async def test_agent_user_is_unprivileged(self, sandbox: Sandbox) -> None:
        """Commands run as ``agent`` have a non-zero uid; ``root`` has uid 0."""
        root = await sandbox.exec("id -u")
        agent = await sandbox.exec("id -u", user="agent")
        assert root.stdout.strip() == "0"
        if self.agent_is_unprivileged:
            assert agent.stdout.strip() not in ("", "0")

    async def test_timeout_kills_the_command(self, sandbox: Sandbox) -> None:
        """A command past its timeout is killed: exit 124, and it never reaches its next step."""
        started = time.monotonic()
        result = await sandbox.exec("sleep 2; touch /tmp/contract-late", timeout=0.5)
        assert result.exit_code == EXIT_EXEC_TIMEOUT
        assert time.monotonic() - started < 10
        await asyncio.sleep(2.5)
        late = await sandbox.exec("test -e /tmp/contract-late")
        assert late.exit_code != 0

    async def test_output_is_capped_with_a_visible_marker(self, sandbox: Sandbox) -> None:
        """A command printing 3 MiB comes back capped (≤ ~1 MiB) around the truncation marker."""
        result = await sandbox.exec("head -c 3145728 /dev/zero | tr '\\0' a; echo END")
        assert result.exit_code == 0
        assert len(result.stdout) < (1 << 20) + 200
        assert "bytes of output truncated" in result.stdout
        assert result.stdout.startswith("aaaa") and result.stdout.endswith("END\n")

    async def test_files_round_trip_as_text_bytes_and_host_paths(
        self, sandbox: Sandbox, tmp_path: pathlib.Path
    ) -> None:
        """``write_file`` makes parent directories; ``read_file`` returns text or exact bytes."""
        await sandbox.write_file("/tmp/contract/a/b.txt", "text é\n", user="agent")
        assert await sandbox.read_file("/tmp/contract/a/b.txt", user="agent") == "text é\n"
        blob = bytes(range(256)) * 512
        await sandbox.write_file("/tmp/contract/blob", blob)
        assert await sandbox.read_file("/tmp/contract/blob", text=False) == blob
        host = tmp_path / "host.bin"
        host.write_bytes(b"\x00host\xff" * 1000)
        await sandbox.write_file("/tmp/contract/host.bin", host)
        assert await sandbox.read_file("/tmp/contract/host.bin", text=False) == host.read_bytes()

    async def test_missing_files_raise_file_not_found(
        self, sandbox: Sandbox, tmp_path: pathlib.Path
    ) -> None:
        """Reading a missing sandbox file, or writing a missing host path, is FileNotFoundError."""
        with pytest.raises(FileNotFoundError):
            await sandbox.read_file("/tmp/contract-missing")
        with pytest.raises(FileNotFoundError):
            await sandbox.write_file("/tmp/x", tmp_path / "no-such-file")

    async def test_exec_and_wait_returns_the_exit_code_and_output(self, sandbox: Sandbox) -> None:
        """A detached command's exit code and output come back through the marker file."""
        result = await exec_and_wait(
            sandbox, "echo detached; echo e >&2; exit 5", time_budget=30, poll_interval=0.1
        )
        assert result.exit_code == 5
        assert result.stdout == "detached\n"
        assert result.stderr == "e\n"

    async def test_cancelled_exec_and_wait_kills_the_process_group(self, sandbox: Sandbox) -> None:
        """Cancelling ``exec_and_wait`` kills the command and its children."""
        task = asyncio.ensure_future(
            exec_and_wait(
                sandbox,
                "(sleep 3; touch /tmp/contract-child) & sleep 3; touch /tmp/contract-parent",
                time_budget=30,
                poll_interval=0.1,
            )
        )
        await asyncio.sleep(1.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(3.0)
        left = await sandbox.exec("ls /tmp/contract-child /tmp/contract-parent 2>/dev/null; true")
        assert left.stdout == ""

    async def test_a_closed_sandbox_is_gone_and_close_is_idempotent(
        self, contract_factory: ContractFactory, contract_task: Task
    ) -> None:
        """After ``aclose`` (twice is fine) an exec raises ``SandboxError``."""
        box = contract_factory(contract_task)
        async with box:
            assert (await box.exec("true")).exit_code == 0
        await box.aclose()
        with pytest.raises(SandboxError):
            await box.exec("true")
