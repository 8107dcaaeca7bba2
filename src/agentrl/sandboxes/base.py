"""The sandbox contract every backend implements."""

from __future__ import annotations

import abc
import pathlib
from collections.abc import Mapping
from typing import Any, ClassVar

from agentrl.types import ExecResult, Task

__all__ = ["Sandbox", "SandboxError"]


class SandboxError(Exception):
    """The sandbox could not start, run a command, or move a file."""


class Sandbox(abc.ABC):
    """An isolated machine for one agent run or one grading run.

    Use as an async context manager: the sandbox starts on enter and is destroyed on exit,
    whatever happened inside.
    """

    name: ClassVar[str]

    @classmethod
    @abc.abstractmethod
    def from_task(cls, task: Task, **options: Any) -> Sandbox:
        """A sandbox (not yet started) for ``task``'s image / repository and workdir."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Boot the sandbox."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Destroy the sandbox and everything running in it. Never raises."""

    @abc.abstractmethod
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
        """Run a shell command and wait for it."""

    @abc.abstractmethod
    async def write_file(
        self, path: str, content: str | bytes | pathlib.Path, *, user: str = "root"
    ) -> None:
        """Write a file; a host ``Path`` is streamed, not read into memory."""

    @abc.abstractmethod
    async def read_file(self, path: str, *, user: str = "root", text: bool = True) -> str | bytes:
        """Read a file."""

    @abc.abstractmethod
    def url_for(self, host: str, port: int) -> str:
        """The base URL an agent inside reaches the host service ``host:port`` at."""

    async def __aenter__(self) -> Sandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
