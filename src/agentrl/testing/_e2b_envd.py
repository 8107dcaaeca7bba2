"""The envd half of the E2B test double: processes over Connect-RPC, files over ``/files``.

Commands really run, as host subprocesses (``/bin/bash -l -c CMD`` exactly as the SDK
asks), with the sandbox's temporary directory as home and default working directory.
This is a wire-protocol double, not isolation: absolute paths are host paths.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import json
import logging
import os
import pathlib
import signal
from collections.abc import Callable
from typing import Any, Protocol

import attrs
from aiohttp import web

from agentrl.testing import _e2b_wire as wire

logger = logging.getLogger(__name__)

#: Every process a sandbox starts carries this variable, so killing the sandbox also finds
#: the ones that detached into their own session (``setsid``).
SANDBOX_ENV_MARKER = "AGENTRL_E2B_DOUBLE_SANDBOX_ID"
_READ_CHUNK = 64 * 1024


@attrs.define
class ProcessRun:
    """One command started through ``process.Process/Start``."""

    pid: int
    cmd: str
    user: str
    proc: asyncio.subprocess.Process
    events: asyncio.Queue[dict[str, Any]] = attrs.field(factory=asyncio.Queue)
    exit_code: int | None = None
    pump: asyncio.Task[None] | None = None


@attrs.define(kw_only=True)
class Fault:
    """A fault armed for the next ``remaining`` matching calls of ``route``."""

    route: str
    action: str
    remaining: int
    status: int = 502
    match: str | None = None


@attrs.define(kw_only=True)
class SandboxRecord:
    """One sandbox the double created."""

    sandbox_id: str
    template: str
    metadata: dict[str, str]
    timeout: int | None
    env_vars: dict[str, str]
    home: pathlib.Path
    access_token: str
    idempotency_key: str | None = None
    #: The creation's egress settings as sent (``allow_internet_access``, ``network``).
    egress: dict[str, object] = attrs.field(factory=dict)
    started_at: datetime.datetime = attrs.field(
        factory=lambda: datetime.datetime.now(datetime.timezone.utc)
    )
    alive: bool = True
    processes: dict[int, ProcessRun] = attrs.field(factory=dict)
    reaper: asyncio.TimerHandle | None = None


class E2BServer(Protocol):
    """What the envd handlers need of the server (``e2b_server.E2BServer`` implements it)."""

    def take_fault(self, route: str, detail: str) -> Fault | None: ...

    async def apply_fault(
        self,
        request: web.Request,
        fault: Fault,
        route: str,
        record: SandboxRecord | None,
        detail: str,
        user: str | None = None,
    ) -> web.StreamResponse: ...

    def record(
        self, route: str, sandbox_id: str | None, detail: str, outcome: str, user: str | None = None
    ) -> None: ...

    def sever(self, request: web.Request) -> None: ...


def request_user(request: web.Request) -> str:
    """The user envd runs as: the ``username`` query parameter (file transfers), else the
    SDK's ``Authorization: Basic base64(user:)``."""
    if username := request.query.get("username"):
        return username
    header = request.headers.get("Authorization", "")
    if not header.startswith("Basic "):
        return "user"
    try:
        decoded = base64.b64decode(header[len("Basic ") :]).decode()
    except ValueError:
        return "user"
    return decoded.split(":", 1)[0] or "user"


def resolve_path(record: SandboxRecord, path: str) -> pathlib.Path:
    """A path as envd resolves it: relative paths are relative to the user's home."""
    if path.startswith("~"):
        return record.home / path[1:].lstrip("/")
    candidate = pathlib.Path(path)
    return candidate if candidate.is_absolute() else record.home / candidate


async def _pump(run: ProcessRun) -> None:
    """Move the process's output into its event queue whether or not anyone listens."""

    async def read(stream: asyncio.StreamReader | None, name: str) -> None:
        if stream is None:
            return
        while chunk := await stream.read(_READ_CHUNK):
            run.events.put_nowait(wire.data_event(name, chunk))

    await asyncio.gather(read(run.proc.stdout, "stdout"), read(run.proc.stderr, "stderr"))
    code = await run.proc.wait()
    run.exit_code = code
    run.events.put_nowait(wire.end_event(code))


async def spawn(record: SandboxRecord, config: dict[str, Any], user: str) -> ProcessRun:
    """Start the process a ``ProcessConfig`` describes inside ``record``'s sandbox."""
    cwd = config.get("cwd") or str(record.home)
    cwd_path = resolve_path(record, cwd)
    if not cwd_path.is_dir():
        raise FileNotFoundError(f"cwd '{cwd}' does not exist")
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": str(record.home),
        "USER": user,
        "E2B_SANDBOX": "true",
        "E2B_SANDBOX_ID": record.sandbox_id,
        SANDBOX_ENV_MARKER: record.sandbox_id,
        **record.env_vars,
        **config.get("envs", {}),
    }
    args = [config.get("cmd", "/bin/bash"), *config.get("args", [])]
    proc = await asyncio.create_subprocess_exec(
        *args,
        cwd=cwd_path,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    shell_cmd = args[-1] if len(args) >= 3 and args[-2] == "-c" else " ".join(args)
    run = ProcessRun(pid=proc.pid, cmd=shell_cmd, user=user, proc=proc)
    run.pump = asyncio.create_task(_pump(run))
    record.processes[run.pid] = run
    return run


def kill_sandbox_processes(record: SandboxRecord) -> None:
    """SIGKILL every process of the sandbox, including detached ones."""
    for run in record.processes.values():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(run.pid, signal.SIGKILL)
    marker = f"{SANDBOX_ENV_MARKER}={record.sandbox_id}".encode() + b"\0"
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in environ:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)


async def _write_events(response: web.StreamResponse, run: ProcessRun) -> None:
    while True:
        event = await run.events.get()
        await response.write(wire.envelope(event))
        if "end" in event["event"]:
            return


async def handle_start(server: E2BServer, record: SandboxRecord, request: web.Request) -> Any:
    """``process.Process/Start``: spawn the command and stream its events."""
    try:
        messages = wire.decode_envelopes(await request.read())
    except (wire.ConnectFramingError, json.JSONDecodeError) as exc:
        return wire.connect_error_response("invalid_argument", str(exc))
    if len(messages) != 1:
        return wire.connect_error_response(
            "invalid_argument", f"expected one StartRequest, got {len(messages)}"
        )
    config = messages[0].get("process", {})
    user = request_user(request)
    detail = " ".join(config.get("args", [])[-1:]) or config.get("cmd", "")
    fault = server.take_fault("process.Start", detail)
    if fault is not None and fault.action != "sever":
        return await server.apply_fault(request, fault, "process.Start", record, detail, user)
    try:
        run = await spawn(record, config, user)
    except FileNotFoundError as exc:
        server.record("process.Start", record.sandbox_id, detail, "error:invalid_argument", user)
        return wire.connect_error_response("invalid_argument", str(exc))
    response = web.StreamResponse(headers={"Content-Type": wire.CONNECT_STREAM_CONTENT_TYPE})
    await response.prepare(request)
    await response.write(wire.envelope(wire.start_event(run.pid)))
    if fault is not None:
        server.record("process.Start", record.sandbox_id, run.cmd, "severed", user)
        server.sever(request)
        return response
    server.record("process.Start", record.sandbox_id, run.cmd, "ok", user)
    timeout_ms = request.headers.get("Connect-Timeout-Ms")
    deadline_s = int(timeout_ms) / 1000 if timeout_ms else None
    try:
        await asyncio.wait_for(_write_events(response, run), deadline_s)
        await response.write(wire.end_stream_envelope())
        await response.write_eof()
    except asyncio.TimeoutError:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(run.pid, signal.SIGKILL)
        with contextlib.suppress(ConnectionError):
            await response.write(wire.end_stream_envelope("deadline_exceeded", "deadline exceeded"))
            await response.write_eof()
    except ConnectionError:
        # The client went away; like envd, the process keeps running.
        logger.debug("client left the stream of pid %d", run.pid)
    return response


async def _unary_message(request: web.Request) -> dict[str, Any]:
    body = await request.read()
    return json.loads(body) if body else {}


async def handle_send_signal(server: E2BServer, record: SandboxRecord, request: web.Request) -> Any:
    """``process.Process/SendSignal``: signal a process of this sandbox by pid."""
    message = await _unary_message(request)
    pid = int(message.get("process", {}).get("pid", 0))
    fault = server.take_fault("process.SendSignal", str(pid))
    if fault is not None:
        return await server.apply_fault(request, fault, "process.SendSignal", record, str(pid))
    run = record.processes.get(pid)
    if run is None or run.exit_code is not None:
        server.record("process.SendSignal", record.sandbox_id, str(pid), "error:not_found")
        return wire.connect_error_response("not_found", f"process with pid {pid} not found")
    sig = signal.SIGTERM if message.get("signal") == "SIGNAL_SIGTERM" else signal.SIGKILL
    # Like envd: the process it started is signalled, not its process group.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)
    server.record("process.SendSignal", record.sandbox_id, str(pid), "ok")
    return web.json_response({})


async def handle_list(server: E2BServer, record: SandboxRecord, request: web.Request) -> Any:
    """``process.Process/List``: the processes still running."""
    fault = server.take_fault("process.List", "")
    if fault is not None:
        return await server.apply_fault(request, fault, "process.List", record, "")
    server.record("process.List", record.sandbox_id, "", "ok")
    running = [
        {"pid": run.pid, "config": {"cmd": "/bin/bash", "args": ["-l", "-c", run.cmd]}}
        for run in record.processes.values()
        if run.exit_code is None
    ]
    return web.json_response({"processes": running})


RPC_HANDLERS: dict[str, Callable[..., Any]] = {
    "process.Process/Start": handle_start,
    "process.Process/SendSignal": handle_send_signal,
    "process.Process/List": handle_list,
}


async def handle_files_get(server: E2BServer, record: SandboxRecord, request: web.Request) -> Any:
    """``GET /files?path=…``: download one file."""
    raw_path = request.query.get("path", "")
    user = request_user(request)
    fault = server.take_fault("files.read", raw_path)
    if fault is not None and fault.action != "sever":
        return await server.apply_fault(request, fault, "files.read", record, raw_path, user)
    path = resolve_path(record, raw_path)
    if not path.is_file():
        server.record("files.read", record.sandbox_id, raw_path, "error:404", user)
        return web.json_response(
            {"code": 404, "message": f"path '{path}' does not exist"}, status=404
        )
    response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    response.content_length = path.stat().st_size
    await response.prepare(request)
    with path.open("rb") as handle:
        if fault is not None:
            await response.write(handle.read(max(1, response.content_length // 2)))
            server.record("files.read", record.sandbox_id, raw_path, "severed", user)
            server.sever(request)
            return response
        while chunk := handle.read(_READ_CHUNK):
            await response.write(chunk)
    await response.write_eof()
    server.record("files.read", record.sandbox_id, raw_path, "ok", user)
    return response


async def _stream_to(path: pathlib.Path, chunks: Any) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    size = 0
    with path.open("wb") as handle:
        async for chunk in chunks:
            handle.write(chunk)
            size += len(chunk)
    return size


def _write_info(path: pathlib.Path) -> dict[str, str]:
    return {"name": path.name, "type": "file", "path": str(path)}


async def handle_files_post(server: E2BServer, record: SandboxRecord, request: web.Request) -> Any:
    """``POST /files``: upload as ``multipart/form-data`` or ``application/octet-stream``."""
    query_path = request.query.get("path")
    user = request_user(request)
    fault = server.take_fault("files.write", query_path or "")
    if fault is not None:
        return await server.apply_fault(
            request, fault, "files.write", record, query_path or "", user
        )
    written: list[dict[str, str]] = []
    if request.content_type == "application/octet-stream":
        if not query_path:
            return web.json_response({"code": 400, "message": "missing path"}, status=400)
        path = resolve_path(record, query_path)
        size = await _stream_to(path, request.content.iter_chunked(_READ_CHUNK))
        server.record("files.write", record.sandbox_id, query_path, f"ok:octet-stream:{size}", user)
        written.append(_write_info(path))
    elif request.content_type == "multipart/form-data":
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            target = query_path or part.filename or ""
            if not target:
                return web.json_response({"code": 400, "message": "part has no path"}, status=400)
            path = resolve_path(record, target)

            async def part_chunks(part: Any = part) -> Any:
                while chunk := await part.read_chunk(_READ_CHUNK):
                    yield chunk

            size = await _stream_to(path, part_chunks())
            server.record("files.write", record.sandbox_id, target, f"ok:multipart:{size}", user)
            written.append(_write_info(path))
    else:
        return web.json_response(
            {"code": 400, "message": f"unsupported content type {request.content_type}"}, status=400
        )
    return web.json_response(written)
