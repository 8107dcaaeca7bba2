"""``agentrl view OUT_DIR [OTHER]``: the page, and the run and each rollout as JSON.

Routes: ``/`` (the page, with no data in it), ``/api/run`` (the run page's data),
``/api/rollout?key=KEY`` (one rollout, read when asked for), ``/api/events?since=N``
(Server-Sent Events: the rollouts committed since, as the run goes on) and, with a second
run, ``/api/compare``. A key is looked up among the run's rows; it never becomes a path.
Every request passes :mod:`~agentrl.view.access` first (the ``Host``, the token).

::

    server = ViewServer([RunSource.open("runs/demo")])
    await server.start()      # 127.0.0.1 on a free port unless told otherwise
    print(server.url)         # http://127.0.0.1:PORT/?token=...
    await server.close()
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import Any

import attrs
from aiohttp import web

from agentrl import jsonio
from agentrl.view.access import ACCESS, Access, access_middleware
from agentrl.view.compare import compare_runs
from agentrl.view.page import page_policy, render_page
from agentrl.view.source import RunSource

__all__ = ["ViewServer", "make_app"]

_SOURCES = web.AppKey("sources", list)
_POLL = web.AppKey("poll_seconds", float)
_STOPPING = web.AppKey("stopping", asyncio.Event)
#: How often a page's event stream looks for new rollouts (seconds).
POLL_SECONDS = 1.0
#: A comment line this often keeps a quiet stream from being closed by a proxy.
KEEPALIVE_SECONDS = 15.0


def _json(value: Any) -> web.Response:
    return web.Response(body=jsonio.dumps(value, default=str), content_type="application/json")


def _source(request: web.Request) -> RunSource:
    return request.app[_SOURCES][0]


async def _page(request: web.Request) -> web.Response:
    sources = request.app[_SOURCES]
    title = " vs ".join(source.root.name for source in sources)
    html = render_page({"mode": "server", "runs": len(sources)}, title=f"agentrl view · {title}")
    return web.Response(
        text=html,
        content_type="text/html",
        headers={"Content-Security-Policy": page_policy() + "; frame-ancestors 'none'"},
    )


async def _run(request: web.Request) -> web.Response:
    source = _source(request)
    await asyncio.to_thread(source.refresh)
    return _json(await asyncio.to_thread(source.run_data))


async def _rollout(request: web.Request) -> web.Response:
    key = request.query.get("key")
    data = await asyncio.to_thread(_source(request).rollout_data, key)
    if data is None:
        raise web.HTTPNotFound(text="no such rollout")
    return _json(data)


def _compare_data(sources: list[RunSource]) -> dict[str, Any]:
    for source in sources:
        source.refresh()
    return compare_runs([source.run_data() for source in sources])


async def _compare(request: web.Request) -> web.Response:
    sources = request.app[_SOURCES]
    if len(sources) < 2:
        raise web.HTTPNotFound(text="one run: nothing to compare (agentrl view RUN_A RUN_B)")
    return _json(await asyncio.to_thread(_compare_data, sources))


def _since(request: web.Request) -> tuple[int | None, int]:
    """The page's ``(generation, rows it holds)``: from the query, or the stream's last id."""
    last = request.headers.get("Last-Event-ID") or ""
    generation, _, count = last.partition(":")
    if not count:
        generation, count = request.query.get("generation", ""), request.query.get("since", "")
    try:
        return int(generation), max(0, int(count))
    except ValueError:
        return None, 0


def _update(source: RunSource, generation: int | None, count: int) -> dict[str, Any] | None:
    """What a page holding ``count`` rows of ``generation`` lacks, or None when nothing."""
    source.refresh()
    if source.generation == generation and len(source.rows) <= count:
        return None  # nothing new: no need to count the run again
    data = source.run_data()
    reset = generation != data["generation"]
    start = 0 if reset else min(count, len(data["rollouts"]))
    if not reset and start == len(data["rollouts"]):
        return None
    return {
        "reset": reset,
        "generation": data["generation"],
        "start": start,
        "rollouts": data["rollouts"][start:],
        "count": len(data["rollouts"]),
        "overview": data["overview"],
    }


async def _events(request: web.Request) -> web.StreamResponse:
    """New rollouts as they are committed, one ``rollouts`` event per batch."""
    source, poll = _source(request), request.app[_POLL]
    stopping = request.app[_STOPPING]
    generation, count = _since(request)
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"}
    )
    await response.prepare(request)
    quiet = 0.0
    while not stopping.is_set():
        update = await asyncio.to_thread(_update, source, generation, count)
        if update is not None:
            generation, count = update["generation"], update["count"]
            body = jsonio.dumps_text(update, default=str)  # one line: JSON escapes newlines
            await response.write(
                f"id: {generation}:{count}\nevent: rollouts\ndata: {body}\n\n".encode()
            )
            quiet = 0.0
        elif quiet >= KEEPALIVE_SECONDS:
            await response.write(b": still here\n\n")
            quiet = 0.0
        try:
            await asyncio.wait_for(stopping.wait(), poll)
        except TimeoutError:
            quiet += poll
    return response


@web.middleware
async def _headers(request: web.Request, handler: Any) -> web.StreamResponse:
    response = await handler(request)
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["X-Frame-Options"] = "DENY"
    response.headers.setdefault("Cache-Control", "no-store")
    response.headers.setdefault("Content-Security-Policy", "default-src 'none'")
    return response


async def _stop_streams(app: web.Application) -> None:
    app[_STOPPING].set()


def make_app(
    sources: list[RunSource], access: Access, poll_seconds: float = POLL_SECONDS
) -> web.Application:
    """The viewer's aiohttp application over ``sources`` (a run, or two to compare)."""
    app = web.Application(middlewares=[_headers, access_middleware])
    app[_SOURCES] = list(sources)
    app[ACCESS] = access
    app[_POLL] = poll_seconds
    app[_STOPPING] = asyncio.Event()
    app.on_shutdown.append(_stop_streams)
    app.router.add_get("/", _page)
    app.router.add_get("/api/run", _run)
    app.router.add_get("/api/rollout", _rollout)
    app.router.add_get("/api/events", _events)
    app.router.add_get("/api/compare", _compare)
    return app


def _url_host(bound: str) -> str:
    """The host part of the URL to print for a server bound to ``bound``."""
    try:
        address = ipaddress.ip_address(bound)
    except ValueError:
        return bound  # a name: the user chose it
    if address.is_unspecified:
        return "127.0.0.1"
    return f"[{address}]" if address.version == 6 else str(address)


@attrs.define
class ViewServer:
    """The viewer's server: bound to ``host`` on ``port`` (0: a free one), one token."""

    sources: list[RunSource]
    host: str = "127.0.0.1"
    port: int = 0
    token: str | None = None
    poll_seconds: float = POLL_SECONDS
    access: Access | None = None
    _runner: web.AppRunner | None = None

    async def start(self) -> str:
        """Bind, serve, and return :attr:`url`."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
        except OSError:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        self.access = Access.for_address(self.host, self.port, self.token)
        self._runner = web.AppRunner(
            make_app(self.sources, self.access, self.poll_seconds), shutdown_timeout=1.0
        )
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()
        return self.url

    @property
    def url(self) -> str:
        """The page's address with the token (what a person opens)."""
        if self.access is None:
            raise RuntimeError("the viewer is not started: await start() first")
        return self.access.url(_url_host(self.host))

    async def close(self) -> None:
        """Stop serving (open event streams end)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
