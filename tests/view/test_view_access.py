"""Who the viewer's server answers (agentrl.view.access), over real HTTP: the real server
on 127.0.0.1 and a free port, aiohttp's client, and `agentrl view` as a process."""

from __future__ import annotations

import asyncio
import os
import pathlib
import re
import sys

import aiohttp
from view_support import SESSION_TASK, viewer

from agentrl.view.access import Access

SRC = pathlib.Path(__file__).resolve().parents[2] / "src"
KEY = f"{SESSION_TASK}#0"
API = ("/api/run", f"/api/rollout?key={SESSION_TASK}%230", "/api/events", "/api/compare")


async def _get(url: str, **headers: str) -> tuple[int, str, aiohttp.ClientResponse]:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
        async with http.get(
            url, headers=headers, allow_redirects=False, timeout=aiohttp.ClientTimeout(total=10)
        ) as response:
            body = await response.content.read(4096)  # an event stream never ends
            return response.status, body.decode(errors="replace"), response


async def test_requests_without_the_token_get_403_and_no_data(crafted_source):
    """No token, a wrong one, or one for another viewer: 403 on the page and on every API
    route, and no rollout key in the answer."""
    async with viewer(crafted_source) as server:
        base = f"http://127.0.0.1:{server.port}"
        for path in ("/", *API):
            for headers in (
                {},
                {"X-Agentrl-Token": "nope"},
                {"Cookie": f"{server.access.cookie}=x"},
            ):
                status, body, _ = await _get(base + path, **headers)
                assert status == 403, (path, headers, status)
                assert KEY not in body and "crafted" not in body
        status, _, _ = await _get(base + "/api/run?token=" + "A" * len(server.access.token))
        assert status == 403


async def test_a_foreign_host_header_is_421_even_with_the_token(crafted_source):
    """DNS rebinding at the HTTP level: a request carrying the token but naming another
    host (an attacker's name, or 127.0.0.1 on another port) is 421 Misdirected Request."""
    async with viewer(crafted_source) as server:
        base, token = f"http://127.0.0.1:{server.port}", server.access.token
        other_port = server.port + 1 if server.port < 65535 else server.port - 1
        for host in (f"evil.example:{server.port}", "evil.example", f"127.0.0.1:{other_port}"):
            for path in ("/", "/api/run"):
                status, body, _ = await _get(
                    f"{base}{path}?token={token}", Host=host, **{"X-Agentrl-Token": token}
                )
                assert status == 421, (host, path, status)
                assert KEY not in body


async def test_the_printed_url_sets_a_strict_cookie_and_the_cookie_opens_the_api(crafted_source):
    """The URL `agentrl view` prints: 303 to the page without the token, setting an
    HttpOnly SameSite=Strict cookie; the cookie, the header and each loopback name get
    the data; a request marked cross-site or same-site by the browser does not."""
    async with viewer(crafted_source) as server:
        assert re.fullmatch(rf"http://127\.0\.0\.1:{server.port}/\?token=[\w-]{{40,}}", server.url)
        status, _, response = await _get(server.url)
        assert status == 303 and response.headers["Location"] == "/"
        cookie = response.headers["Set-Cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
        assert cookie.startswith(f"{server.access.cookie}={server.access.token};")
        jar = f"{server.access.cookie}={server.access.token}"
        base = f"http://127.0.0.1:{server.port}"
        for host in ("127.0.0.1", "localhost", "[::1]"):
            status, _, _ = await _get(base + "/", Host=f"{host}:{server.port}", Cookie=jar)
            assert status == 200, host
        status, body, _ = await _get(base + "/api/run", **{"X-Agentrl-Token": server.access.token})
        assert status == 200 and KEY in body
        status, body, _ = await _get(
            base + "/api/run", Cookie=jar, **{"Sec-Fetch-Site": "same-origin"}
        )
        assert status == 200 and KEY in body
        for site in ("same-site", "cross-site"):
            status, body, _ = await _get(base + "/api/run", Cookie=jar, **{"Sec-Fetch-Site": site})
            assert status == 403 and KEY not in body


async def test_the_printed_url_names_the_bound_address(crafted_source):
    """Bound to ::1, the viewer prints an [::1] URL that opens it (not a 127.0.0.1 one,
    where nothing listens)."""
    async with viewer(crafted_source, host="::1") as server:
        assert server.url.startswith(f"http://[::1]:{server.port}/?token=")
        status, body, _ = await _get(server.url.replace("/?", "/api/run?"))
        assert status == 200 and KEY in body


def test_host_rules_follow_the_bound_address():
    """A server bound to a named address also answers that name; a wildcard bind adds no
    name (a request must still say 127.0.0.1, localhost or [::1])."""
    assert Access.for_address("127.0.0.1", 5000).host_allowed("LOCALHOST:5000")
    assert not Access.for_address("127.0.0.1", 5000).host_allowed("localhost:5001")
    assert not Access.for_address("127.0.0.1", 5000).host_allowed(None)
    assert Access.for_address("::1", 7).host_allowed("[::1]:7")
    assert Access.for_address("10.1.2.3", 7).host_allowed("10.1.2.3:7")
    assert Access.for_address("0.0.0.0", 7).hosts == {"127.0.0.1:7", "localhost:7", "[::1]:7"}
    assert Access.for_address("::", 7).hosts == {"127.0.0.1:7", "localhost:7", "[::1]:7"}


async def test_agentrl_view_serves_on_a_free_loopback_port_with_a_token(crafted_dir, tmp_path):
    """`agentrl view DIR` as a process: it prints a 127.0.0.1 URL on a port it chose (two
    viewers get two ports, neither the old fixed 8765) with a token; the URL opens the
    API, the bare address is 403."""
    procs, urls = [], []
    # This checkout's code, wherever the test runs from.
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    try:
        for _ in range(2):
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "agentrl.cli", "view", str(crafted_dir),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=tmp_path, env=env,
            )  # fmt: skip
            procs.append(proc)
            line = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode()
            match = re.search(r"http://127\.0\.0\.1:(\d+)/\?token=([\w-]+)", line)
            if match is None:
                proc.kill()
                assert match, line + (await proc.stderr.read()).decode()[-2000:]
            urls.append(match)
        ports = {int(m.group(1)) for m in urls}
        assert len(ports) == 2 and 8765 not in ports
        port, token = urls[0].group(1), urls[0].group(2)
        status, body, _ = await _get(f"http://127.0.0.1:{port}/api/run?token={token}")
        assert status == 200 and KEY in body
        status, body, _ = await _get(f"http://127.0.0.1:{port}/api/run")
        assert status == 403 and KEY not in body
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.terminate()
                await proc.wait()
