"""A local E2B API + envd server for the real e2b SDK to talk to (a test double).

It speaks the wire protocol the e2b Python SDK uses, on one aiohttp server at
``http://127.0.0.1:PORT``:

- the control-plane REST API: ``POST /v2/sandboxes`` (template, metadata, timeout,
  ``Idempotency-Key``: a key seen before returns its sandbox while that one lives),
  ``GET /v2/sandboxes`` (the live ones, filtered by ``metadata``, paged by ``limit`` and
  ``nextToken`` / ``x-next-token``), ``DELETE /sandboxes/{id}``,
  ``POST /sandboxes/{id}/timeout``;
- envd, addressed by the ``E2b-Sandbox-Id`` header the SDK sends and guarded by the
  ``X-Access-Token`` it was given at creation: Connect-RPC with the JSON codec
  (``process.Process/Start`` server-streaming, ``SendSignal``, ``List``), ``/files``
  downloads (``GET``) and uploads (``POST``, multipart or octet-stream), ``/health``.

Point the SDK at it with ``api_url=server.url`` and ``sandbox_url=server.url`` (the
SDK's ``E2B_API_URL`` / ``E2B_SANDBOX_URL``); debug mode is not used, so sandbox
creation and kill really go over the API. Commands really run as host subprocesses in a
per-sandbox temporary directory: this is a protocol double, not isolation.

Faults are injected per route (``create``, ``list``, ``kill``, ``health``, ``process.Start``,
``process.SendSignal``, ``process.List``, ``files.read``, ``files.write``):

- ``status``: a plain proxy error (default 502) instead of an answer;
- ``reset``: the connection is dropped before any response byte;
- ``protocol_error``: bytes that are not HTTP, then the connection is closed;
- ``sever``: the call is carried out, then the connection is cut before the answer is
  complete (``create``: the sandbox exists but its answer is lost, ``lose_creates``;
  ``process.Start``: the
  stream is cut after the start event and the command keeps running, as under envd;
  ``files.read``: the download stops halfway).

Every request is counted (``request_count``) and every routed call recorded
(``calls``), so a test can assert that a command ran exactly once or that nothing
reached the server at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import datetime
import logging
import pathlib
import secrets
import shutil
import sys
import tempfile
import urllib.parse
import uuid
from typing import Any

import attrs
from aiohttp import web

from agentrl.testing import _e2b_envd as envd
from agentrl.testing import _e2b_wire as wire
from agentrl.testing._e2b_envd import Fault, SandboxRecord

__all__ = ["FAULT_ACTIONS", "ROUTES", "Call", "E2BServer", "Fault", "SandboxRecord"]

logger = logging.getLogger(__name__)

ROUTES = (
    "create",
    "list",
    "kill",
    "set_timeout",
    "health",
    "process.Start",
    "process.SendSignal",
    "process.List",
    "files.read",
    "files.write",
)
FAULT_ACTIONS = ("status", "reset", "protocol_error", "sever")
_SEVERABLE = ("create", "process.Start", "files.read")
_NOT_HTTP = b"\x00\x17\x03 this is not an HTTP response\r\n\r\n"
#: The client port of the request being handled, so a record can tell connections apart.
_peer_port: contextvars.ContextVar[int | None] = contextvars.ContextVar("peer_port", default=None)


@attrs.frozen(kw_only=True)
class Call:
    """One routed request as the server handled it."""

    route: str
    sandbox_id: str | None
    detail: str
    outcome: str
    user: str | None = None
    #: The client's TCP port: two calls with different ports came on different connections.
    peer_port: int | None = None


class E2BServer:
    """The E2B API and envd, on ``127.0.0.1:0``, with fault injection and call records."""

    def __init__(
        self, *, api_key: str | None = None, envd_version: str = "0.6.4", host: str = "127.0.0.1"
    ) -> None:
        self.api_key = api_key
        self.envd_version = envd_version
        self.host = host
        self.sandboxes: dict[str, SandboxRecord] = {}
        self.calls: list[Call] = []
        self.request_count = 0
        self.faults: list[Fault] = []
        self._runner: web.AppRunner | None = None
        self._port: int | None = None
        self._root = pathlib.Path(tempfile.mkdtemp(prefix="agentrl-e2b-double-"))

    # -- lifecycle -----------------------------------------------------------------
    @property
    def url(self) -> str:
        if self._port is None:
            raise RuntimeError("E2BServer is not started; use `async with E2BServer() as server`")
        return f"http://{self.host}:{self._port}"

    async def start(self) -> E2BServer:
        app = web.Application(middlewares=[self._count_requests], client_max_size=1 << 34)
        app.router.add_post("/v2/sandboxes", self._create)
        app.router.add_get("/v2/sandboxes", self._list)
        app.router.add_delete("/sandboxes/{sandbox_id}", self._kill)
        app.router.add_post("/sandboxes/{sandbox_id}/timeout", self._set_timeout)
        app.router.add_get("/health", self._envd(self._health))
        app.router.add_get("/files", self._envd(envd.handle_files_get))
        app.router.add_post("/files", self._envd(envd.handle_files_post))
        app.router.add_post("/{service}/{method}", self._envd(self._rpc))
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        self._port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def aclose(self) -> None:
        for record in list(self.sandboxes.values()):
            await self._destroy(record)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        shutil.rmtree(self._root, ignore_errors=True)

    async def __aenter__(self) -> E2BServer:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- faults and records ----------------------------------------------------------
    def inject(
        self,
        route: str,
        action: str = "status",
        *,
        times: int = 1,
        status: int = 502,
        match: str | None = None,
    ) -> Fault:
        """Arm a fault for the next ``times`` calls of ``route`` whose detail contains ``match``."""
        if route not in ROUTES:
            raise ValueError(f"unknown route {route!r}; expected one of {ROUTES}")
        if action not in FAULT_ACTIONS:
            raise ValueError(f"unknown fault action {action!r}; expected one of {FAULT_ACTIONS}")
        if action == "sever" and route not in _SEVERABLE:
            raise ValueError(f"only {_SEVERABLE} can be severed, not {route!r}")
        fault = Fault(route=route, action=action, remaining=times, status=status, match=match)
        self.faults.append(fault)
        return fault

    def fail_boot(self, times: int = 1, *, status: int = 500) -> Fault:
        """The next ``times`` sandbox creations fail with ``status``."""
        return self.inject("create", "status", times=times, status=status)

    def lose_creates(self, times: int | None = None) -> Fault:
        """The next ``times`` creations (None: every one) happen, but their answer is lost."""
        return self.inject("create", "sever", times=sys.maxsize if times is None else times)

    def live_sandboxes(self) -> list[SandboxRecord]:
        """The sandboxes that exist now (created and neither killed nor expired)."""
        return [record for record in self.sandboxes.values() if record.alive]

    def fail_kill(self, times: int = 1, *, status: int = 500) -> Fault:
        """The next ``times`` sandbox kills fail with ``status``."""
        return self.inject("kill", "status", times=times, status=status)

    def sever_stream(self, match: str | None = None, *, times: int = 1) -> Fault:
        """Cut the next command stream (whose command contains ``match``) after it starts."""
        return self.inject("process.Start", "sever", times=times, match=match)

    def take_fault(self, route: str, detail: str) -> Fault | None:
        """Consume one armed fault for this call, if any."""
        for fault in self.faults:
            if fault.route != route or fault.remaining <= 0:
                continue
            if fault.match is not None and fault.match not in detail:
                continue
            fault.remaining -= 1
            return fault
        return None

    def record(
        self, route: str, sandbox_id: str | None, detail: str, outcome: str, user: str | None = None
    ) -> None:
        self.calls.append(
            Call(
                route=route,
                sandbox_id=sandbox_id,
                detail=detail,
                outcome=outcome,
                user=user,
                peer_port=_peer_port.get(),
            )
        )

    def calls_to(self, route: str, *, sandbox_id: str | None = None) -> list[Call]:
        return [
            call
            for call in self.calls
            if call.route == route and (sandbox_id is None or call.sandbox_id == sandbox_id)
        ]

    def commands_run(self, match: str = "") -> list[str]:
        """Commands that were really started (faulted attempts that never ran excluded)."""
        return [
            call.detail
            for call in self.calls_to("process.Start")
            if call.outcome in ("ok", "severed") and match in call.detail
        ]

    def expire(self, sandbox_id: str) -> None:
        """End a sandbox as if its lifetime ran out: later requests find it gone."""
        record = self.sandboxes[sandbox_id]
        envd.kill_sandbox_processes(record)
        record.alive = False

    async def apply_fault(
        self,
        request: web.Request,
        fault: Fault,
        route: str,
        record: SandboxRecord | None,
        detail: str,
        user: str | None = None,
    ) -> web.StreamResponse:
        """Answer a call with its armed fault instead of handling it."""
        sandbox_id = record.sandbox_id if record is not None else None
        outcome = f"fault:{fault.action}" + (f":{fault.status}" if fault.action == "status" else "")
        self.record(route, sandbox_id, detail, outcome, user)
        if fault.action == "status":
            return wire.plain_proxy_error(fault.status, f"injected {fault.status} for {route}")
        transport = request.transport
        if transport is not None:
            if fault.action == "protocol_error":
                transport.write(_NOT_HTTP)
                transport.close()
            else:
                transport.abort()
        # The connection is gone; aiohttp drops whatever is returned.
        raise asyncio.CancelledError

    def sever(self, request: web.Request) -> None:
        """Cut the connection of a response already under way."""
        if request.transport is not None:
            request.transport.abort()

    # -- middleware ------------------------------------------------------------------
    @web.middleware
    async def _count_requests(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.request_count += 1
        peer = request.transport.get_extra_info("peername") if request.transport else None
        _peer_port.set(peer[1] if peer else None)
        return await handler(request)

    def _check_api_key(self, request: web.Request) -> web.Response | None:
        key = request.headers.get("X-API-KEY")
        if not key or (self.api_key is not None and key != self.api_key):
            return web.json_response({"code": 401, "message": "Invalid API key"}, status=401)
        return None

    # -- control plane ---------------------------------------------------------------
    async def _create(self, request: web.Request) -> web.StreamResponse:
        if (denied := self._check_api_key(request)) is not None:
            self.record("create", None, "", "error:401")
            return denied
        body = await request.json()
        template = body.get("templateID", "")
        key = request.headers.get("Idempotency-Key")
        detail = f"template={template} idempotency_key={key}"
        fault = self.take_fault("create", detail)
        if fault is not None and fault.action != "sever":
            return await self.apply_fault(request, fault, "create", None, detail)
        record = next(
            (r for r in self.sandboxes.values() if key and r.idempotency_key == key and r.alive),
            None,
        )
        if record is None:
            sandbox_id = uuid.uuid4().hex[:20]
            home = self._root / sandbox_id
            home.mkdir()
            record = SandboxRecord(
                sandbox_id=sandbox_id,
                template=template,
                metadata=dict(body.get("metadata") or {}),
                timeout=body.get("timeout"),
                env_vars=dict(body.get("envVars") or {}),
                home=home,
                access_token=secrets.token_hex(16),
                idempotency_key=key,
                egress={k: body[k] for k in ("allow_internet_access", "network") if k in body},
            )
            self.sandboxes[sandbox_id] = record
            self._arm_reaper(record)
            outcome = "ok"
        else:
            outcome = "ok:idempotent-replay"
        if fault is not None:
            # Created, but the answer is lost on the way back.
            self.record("create", record.sandbox_id, detail, "severed")
            self.sever(request)
            raise asyncio.CancelledError
        self.record("create", record.sandbox_id, detail, outcome)
        return web.json_response(
            {
                "templateID": record.template,
                "sandboxID": record.sandbox_id,
                "clientID": "agentrl-e2b-double",
                "envdVersion": self.envd_version,
                "envdAccessToken": record.access_token,
            },
            status=201,
        )

    async def _list(self, request: web.Request) -> web.StreamResponse:
        if (denied := self._check_api_key(request)) is not None:
            self.record("list", None, "", "error:401")
            return denied
        query = request.query
        # The SDK sends metadata as one parameter: urlencode({quote(k): quote(v)}).
        wanted = {
            urllib.parse.unquote(k): urllib.parse.unquote(v)
            for k, v in urllib.parse.parse_qsl(query.get("metadata", ""))
        }
        detail = urllib.parse.urlencode(sorted(wanted.items()))
        fault = self.take_fault("list", detail)
        if fault is not None:
            return await self.apply_fault(request, fault, "list", None, detail)
        matching = [
            record
            for record in self.live_sandboxes()
            if all(record.metadata.get(k) == v for k, v in wanted.items())
        ]
        start = int(query.get("nextToken") or 0)
        limit = int(query.get("limit") or 100)
        page = matching[start : start + limit]
        headers = {"x-next-token": str(start + limit)} if start + limit < len(matching) else {}
        self.record("list", None, detail, f"ok:{len(page)}")
        return web.json_response([self._listed(r) for r in page], headers=headers)

    def _listed(self, record: SandboxRecord) -> dict[str, object]:
        """A ``ListedSandbox`` in the API's JSON shape."""
        started = record.started_at
        end = started + datetime.timedelta(seconds=record.timeout or 300)
        return {
            "templateID": record.template,
            "sandboxID": record.sandbox_id,
            "clientID": "agentrl-e2b-double",
            "startedAt": started.isoformat(),
            "endAt": end.isoformat(),
            "cpuCount": 2,
            "memoryMB": 512,
            "diskSizeMB": 1024,
            "state": "running",
            "envdVersion": self.envd_version,
            "metadata": dict(record.metadata),
        }

    def _arm_reaper(self, record: SandboxRecord) -> None:
        if record.reaper is not None:
            record.reaper.cancel()
        if record.timeout:
            loop = asyncio.get_running_loop()
            record.reaper = loop.call_later(record.timeout, self.expire, record.sandbox_id)

    async def _kill(self, request: web.Request) -> web.StreamResponse:
        sandbox_id = request.match_info["sandbox_id"]
        if (denied := self._check_api_key(request)) is not None:
            self.record("kill", sandbox_id, "", "error:401")
            return denied
        record = self.sandboxes.get(sandbox_id)
        fault = self.take_fault("kill", sandbox_id)
        if fault is not None:
            return await self.apply_fault(request, fault, "kill", record, sandbox_id)
        if record is None or not record.alive:
            self.record("kill", sandbox_id, sandbox_id, "error:404")
            return web.json_response(
                {"code": 404, "message": f"sandbox {sandbox_id} not found"}, status=404
            )
        await self._destroy(record)
        self.record("kill", sandbox_id, sandbox_id, "ok")
        return web.Response(status=204)

    async def _set_timeout(self, request: web.Request) -> web.StreamResponse:
        sandbox_id = request.match_info["sandbox_id"]
        record = self.sandboxes.get(sandbox_id)
        if record is None or not record.alive:
            self.record("set_timeout", sandbox_id, "", "error:404")
            return web.json_response({"code": 404, "message": "sandbox not found"}, status=404)
        record.timeout = int((await request.json())["timeout"])
        self._arm_reaper(record)
        self.record("set_timeout", sandbox_id, str(record.timeout), "ok")
        return web.Response(status=204)

    async def _destroy(self, record: SandboxRecord) -> None:
        if record.reaper is not None:
            record.reaper.cancel()
        envd.kill_sandbox_processes(record)
        for run in record.processes.values():
            if run.pump is not None:
                with contextlib.suppress(asyncio.TimeoutError, Exception):
                    await asyncio.wait_for(asyncio.shield(run.pump), 5)
        record.alive = False
        shutil.rmtree(record.home, ignore_errors=True)

    # -- envd ------------------------------------------------------------------------
    def _envd(self, handler: Any) -> Any:
        """Wrap an envd handler: find the sandbox by header and check its access token."""

        async def wrapped(request: web.Request) -> web.StreamResponse:
            sandbox_id = request.headers.get("E2b-Sandbox-Id", "")
            record = self.sandboxes.get(sandbox_id)
            if record is None or not record.alive:
                self.record("envd", sandbox_id or None, request.path, "error:sandbox-not-found")
                return wire.plain_proxy_error(
                    502, f"The sandbox {sandbox_id} was not found", sandbox_id=sandbox_id
                )
            if request.headers.get("X-Access-Token") != record.access_token:
                self.record("envd", sandbox_id, request.path, "error:401")
                return web.json_response({"code": 401, "message": "bad access token"}, status=401)
            return await handler(self, record, request)

        return wrapped

    @staticmethod
    async def _health(server: E2BServer, record: SandboxRecord, request: web.Request) -> Any:
        fault = server.take_fault("health", "")
        if fault is not None:
            return await server.apply_fault(request, fault, "health", record, "")
        server.record("health", record.sandbox_id, "", "ok")
        return web.Response(status=204)

    @staticmethod
    async def _rpc(server: E2BServer, record: SandboxRecord, request: web.Request) -> Any:
        name = f"{request.match_info['service']}/{request.match_info['method']}"
        handler = envd.RPC_HANDLERS.get(name)
        if handler is None:
            server.record("envd", record.sandbox_id, name, "error:unimplemented")
            return wire.connect_error_response("unimplemented", f"{name} is not implemented")
        return await handler(server, record, request)
