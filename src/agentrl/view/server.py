"""``agentrl view OUT_DIR --port P``: the page, and the run and each rollout as JSON.

Routes: ``/`` (the page, with no data in it), ``/api/run`` (the run page's data) and
``/api/rollout?key=KEY`` (one rollout, read when asked for). A key is looked up among the
run's rows; it never becomes a path. Bound to 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from agentrl import jsonio
from agentrl.view.page import page_policy, render_page
from agentrl.view.source import RunSource

__all__ = ["make_app"]

_SOURCE = web.AppKey("source", RunSource)


def _json(value: Any) -> web.Response:
    return web.Response(body=jsonio.dumps(value, default=str), content_type="application/json")


async def _page(request: web.Request) -> web.Response:
    source = request.app[_SOURCE]
    html = render_page({"mode": "server"}, title=f"agentrl view · {source.root.name}")
    return web.Response(
        text=html, content_type="text/html", headers={"Content-Security-Policy": page_policy()}
    )


async def _run(request: web.Request) -> web.Response:
    return _json(request.app[_SOURCE].run_data())


async def _rollout(request: web.Request) -> web.Response:
    key = request.query.get("key")
    data = await asyncio.to_thread(request.app[_SOURCE].rollout_data, key)
    if data is None:
        raise web.HTTPNotFound(text="no such rollout")
    return _json(data)


@web.middleware
async def _headers(request: web.Request, handler: Any) -> web.StreamResponse:
    response = await handler(request)
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers.setdefault("Content-Security-Policy", "default-src 'none'")
    return response


def make_app(source: RunSource) -> web.Application:
    """The viewer's aiohttp application over ``source``."""
    app = web.Application(middlewares=[_headers])
    app[_SOURCE] = source
    app.router.add_get("/", _page)
    app.router.add_get("/api/run", _run)
    app.router.add_get("/api/rollout", _rollout)
    return app
