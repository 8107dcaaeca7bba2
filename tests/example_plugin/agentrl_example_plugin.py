"""A third-party agentrl plugin: a sandbox named ``example``.

It runs commands as host subprocesses in a temporary directory. It isolates nothing; it
exists to show (and test) how a plugin package plugs a backend into agentrl.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import shutil
import tempfile

from agentrl import hookimpl
from agentrl.sandboxes.base import Sandbox
from agentrl.types import ExecResult


class ExampleSandbox(Sandbox):
    """Host subprocesses in a temporary working directory."""

    name = "example"

    def __init__(self, *, workdir: str = "/workspace") -> None:
        self.workdir = workdir
        self._root: pathlib.Path | None = None

    @classmethod
    def from_task(cls, task, **options):
        return cls(workdir=task.workdir, **options)

    async def start(self) -> None:
        self._root = pathlib.Path(tempfile.mkdtemp(prefix="agentrl-example-"))

    async def aclose(self) -> None:
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def _path(self, path: str) -> pathlib.Path:
        assert self._root is not None, "sandbox not started"
        return self._root / path.lstrip("/")

    async def exec(
        self, cmd, *, user="root", env=None, timeout=120, check=False, idempotent=True, workdir=None
    ):
        proc = await asyncio.create_subprocess_shell(
            cmd,
            cwd=self._root,
            env={**os.environ, **(env or {})},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
        result = ExecResult(exit_code=proc.returncode, stdout=out.decode(), stderr=err.decode())
        if check and result.exit_code != 0:
            raise RuntimeError(f"command failed ({result.exit_code}): {cmd}")
        return result

    async def write_file(self, path, content, *, user="root"):
        target = self._path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, pathlib.Path):
            shutil.copyfile(content, target)
        elif isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)

    async def read_file(self, path, *, user="root", text=True):
        target = self._path(path)
        return target.read_text() if text else target.read_bytes()

    def url_for(self, host, port):
        return f"http://{host}:{port}"


@hookimpl
def register_sandboxes(register):
    register(ExampleSandbox)
