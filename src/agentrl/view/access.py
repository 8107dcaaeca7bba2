"""Who may read the viewer's server: the person who started it, from this machine.

A run's trajectories and diffs are private, and a page the user visits can reach any port
on 127.0.0.1 (a ``fetch``, or DNS rebinding: its own host name re-pointed at 127.0.0.1, so
the browser treats the viewer as that page's origin). So every request must

- name the viewer in its ``Host`` header (``127.0.0.1:PORT``, ``localhost:PORT``,
  ``[::1]:PORT``, or the ``--host`` address): a rebound name is 421 Misdirected Request;
- carry the run's token: the ``token`` query parameter of the URL ``agentrl view``
  prints (which sets an ``HttpOnly``, ``SameSite=Strict`` cookie named for the port and
  redirects to the same page without it), that cookie, or an ``X-Agentrl-Token`` header.
  Anything else is 403 with no data;
- come from the viewer's own page: a browser's ``Sec-Fetch-Site`` of ``same-site`` or
  ``cross-site`` (another port of 127.0.0.1, another site) is 403 whatever cookie the
  browser attached, except a link followed to the page itself (it holds no data).
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from typing import Any

import attrs
from aiohttp import web

__all__ = ["Access", "access_middleware", "new_token"]

TOKEN_PARAM = "token"
TOKEN_HEADER = "X-Agentrl-Token"
#: The browser's word for where a request came from; these never reach the API.
FOREIGN_SITES = frozenset({"same-site", "cross-site"})


def new_token() -> str:
    """A fresh unguessable token (256 bits)."""
    return secrets.token_urlsafe(32)


def _host_names(host: str) -> set[str]:
    """How a ``Host`` header may name the bound address ``host`` (a wildcard names none)."""
    names = {"127.0.0.1", "localhost", "[::1]"}
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        names.add(host.lower())
        return names
    if not address.is_unspecified:
        names.add(f"[{address}]" if address.version == 6 else str(address))
    return names


@attrs.frozen(kw_only=True)
class Access:
    """The token and the ``Host`` values one viewer server answers."""

    token: str = attrs.field(repr=False)
    port: int
    hosts: frozenset[str]

    @classmethod
    def for_address(cls, host: str, port: int, token: str | None = None) -> Access:
        """The rules of a server bound to ``host``:``port`` (a new token unless given)."""
        names = _host_names(host)
        return cls(
            token=token or new_token(), port=port, hosts=frozenset(f"{n}:{port}" for n in names)
        )

    @property
    def cookie(self) -> str:
        """The cookie's name: one per port, as cookies do not tell ports apart."""
        return f"agentrl_view_{self.port}"

    def url(self, host: str = "127.0.0.1") -> str:
        """The address to open: the page, with the token that lets the browser in."""
        return f"http://{host}:{self.port}/?{TOKEN_PARAM}={self.token}"

    def host_allowed(self, header: str | None) -> bool:
        """Whether a ``Host`` header names this server."""
        return header is not None and header.lower() in self.hosts

    def token_matches(self, given: str | None) -> bool:
        """Whether ``given`` is the token (compared in constant time)."""
        return given is not None and hmac.compare_digest(given.encode(), self.token.encode())


ACCESS = web.AppKey("access", Access)


def _opens_the_page(request: web.Request) -> bool:
    """A link followed to the page itself (a tab, not a frame, a fetch or the API)."""
    return (
        request.path == "/"
        and request.headers.get("Sec-Fetch-Mode") == "navigate"
        and request.headers.get("Sec-Fetch-Dest") == "document"
    )


def _refuse(status: int, reason: str) -> web.Response:
    return web.Response(status=status, text=reason + "\n", content_type="text/plain")


@web.middleware
async def access_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """Answer only requests for this server, with its token, from its own page."""
    access = request.app[ACCESS]
    if not access.host_allowed(request.headers.get("Host")):
        return _refuse(
            421,
            "this viewer answers only requests addressed to 127.0.0.1, localhost or [::1] "
            f"on port {access.port}; open the URL `agentrl view` printed",
        )
    query_token = request.query.get(TOKEN_PARAM)
    if access.token_matches(query_token) and request.path == "/" and request.method == "GET":
        # The printed URL: keep the token in a cookie and take it out of the address bar.
        response = web.Response(status=303, headers={"Location": "/"})
        response.set_cookie(access.cookie, access.token, httponly=True, samesite="Strict", path="/")
        return response
    given = query_token or request.headers.get(TOKEN_HEADER) or request.cookies.get(access.cookie)
    if not access.token_matches(given):
        return _refuse(
            403,
            "this viewer needs its token: open the URL `agentrl view` printed "
            "(http://127.0.0.1:PORT/?token=...), or send it as the X-Agentrl-Token header",
        )
    if request.headers.get("Sec-Fetch-Site") in FOREIGN_SITES and not _opens_the_page(request):
        return _refuse(403, "the viewer's data is for its own page only")
    return await handler(request)
