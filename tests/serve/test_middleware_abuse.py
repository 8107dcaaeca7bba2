"""The middleware under abuse: what a request costs before it is refused.

Each client here is a raw TCP socket (blocking, on a worker thread), so the test sees
exactly what the server lets through: whether it answers from the headers alone, in the
route's JSON error shape, and whether it stops the client from streaming the rest of a
body it refused.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket

import pytest

from agentrl.serve import limits

pytest_plugins = ("middleware_fixtures",)

PATHS = {
    "anthropic": "/v1/messages",
    "openai_chat": "/v1/chat/completions",
    "openai_responses": "/v1/responses",
}
MIB = 1024 * 1024
#: What a client may still push into the kernel's socket buffers after the server closed
#: the connection (loopback autotuning allows a few MiB), far below the bodies sent here.
IN_FLIGHT = 16 * MIB


def error_message(protocol: str, body: dict) -> str:
    """The message of a JSON error body, checking it has ``protocol``'s shape."""
    if protocol == "anthropic":
        assert body["type"] == "error"
        assert set(body["error"]) == {"type", "message"}
    else:
        assert set(body["error"]) >= {"message", "type", "code"}
    return body["error"]["message"]


class RawClient:
    """One blocking TCP connection to the middleware (run its methods on a thread)."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.received = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def push(self, chunk: bytes, total: int) -> int:
        """Send ``chunk`` repeatedly up to ``total`` bytes; how many went out before the
        server refused more (its reset or close)."""
        sent = 0
        try:
            while sent < total:
                self.sock.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        return sent

    def response(self) -> tuple[int, dict[str, str], bytes]:
        """The next whole response (status, lower-cased headers, body)."""
        while b"\r\n\r\n" not in self.received:
            self._recv()
        head, _, rest = self.received.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        while len(rest) < length:
            rest += self._recv()
        self.received = rest[length:]
        return int(lines[0].split()[1]), headers, rest[:length]

    def _recv(self) -> bytes:
        data = self.sock.recv(65_536)
        if not data:
            raise ConnectionError(f"closed before a whole response: {self.received[:200]!r}")
        self.received += data
        return data

    def close(self) -> None:
        self.sock.close()


def post_head(path: str, *, token: str = "", length: int | None = None) -> bytes:
    """The request line and headers of a POST (Content-Length ``length``, else chunked)."""
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    if token:
        head += f"Authorization: Bearer {token}\r\n"
    head += "Transfer-Encoding: chunked\r\n" if length is None else f"Content-Length: {length}\r\n"
    return (head + "\r\n").encode()


async def refused_from_headers(url: str, head: bytes, length: int) -> tuple[int, dict, dict, int]:
    """Send ``head`` and 4 KiB of its ``length``-byte body, read the answer, then try to
    send the rest: the status, headers and JSON body, and how much of the rest went out."""
    client = RawClient(url)
    try:
        await asyncio.to_thread(client.send, head + b" " * 4096)
        status, headers, body = await asyncio.to_thread(client.response)
        rest = await asyncio.to_thread(client.push, b" " * MIB, length - 4096)
    finally:
        client.close()
    return status, headers, json.loads(body), rest


@pytest.mark.parametrize("protocol", sorted(PATHS))
async def test_unauthenticated_60mb_body_is_refused_from_its_headers(protocol, middleware):
    """A client without a token announces a 60 MB body and sends its headers plus 4 KiB:
    the 401 comes in the route's JSON shape with ``Connection: close``, and the server
    closes, so the client cannot stream the other 60 MB into it (it lingered and read it)."""
    length = 60_000_000
    head = post_head(PATHS[protocol], length=length)
    status, headers, body, rest = await refused_from_headers(middleware.url, head, length)
    assert status == 401
    assert headers["content-type"].startswith("application/json")
    assert "API key" in error_message(protocol, body)
    assert headers["connection"].lower() == "close"
    assert rest < IN_FLIGHT, f"the server took {rest} more bytes of a body it refused"


@pytest.mark.parametrize("protocol", sorted(PATHS))
async def test_declared_body_over_the_cap_is_refused_from_its_headers(protocol, middleware):
    """An authenticated client announces a body over its session's cap: the 413 comes from
    the headers alone, and the server closes rather than reading the body it refused."""
    token = middleware.open_session("s")
    cap = middleware.body_limit("s")
    length = cap + 40 * MIB
    head = post_head(PATHS[protocol], token=token, length=length)
    status, headers, body, rest = await refused_from_headers(middleware.url, head, length)
    assert status == 413
    assert str(cap) in error_message(protocol, body)
    assert headers["connection"].lower() == "close"
    assert rest < IN_FLIGHT, f"the server took {rest} more bytes of a body it refused"


@pytest.mark.parametrize("protocol", sorted(PATHS))
async def test_chunked_body_over_the_cap_is_cut_at_the_cap(protocol, middleware):
    """An authenticated client streams a chunked body with no Content-Length, far past its
    session's cap: the server stops at the cap, answers 413 in the route's shape and
    closes, so the client cannot push much more than the cap into it."""
    token = middleware.open_session("s")
    cap = middleware.body_limit("s")
    total = cap + 60 * MIB
    client = RawClient(middleware.url)
    try:
        await asyncio.to_thread(client.send, post_head(PATHS[protocol], token=token))
        chunk = b"10000\r\n" + b" " * 0x10000 + b"\r\n"
        sent = await asyncio.to_thread(client.push, chunk, total)
        status, headers, body = await asyncio.to_thread(client.response)
    finally:
        client.close()
    assert status == 413
    assert str(cap) in error_message(protocol, json.loads(body))
    assert headers["connection"].lower() == "close"
    assert sent < cap + IN_FLIGHT, f"the server took {sent} bytes past a cap of {cap}"


@pytest.mark.parametrize("protocol", sorted(PATHS))
@pytest.mark.parametrize("where", ["header", "url"])
async def test_header_overflow_is_the_routes_json_error(protocol, where, middleware, http):
    """A 16 KB header field (or a 16 KB request line) on a protocol's route is a 431 in
    that protocol's JSON error shape naming the limit (aiohttp answered a text/plain 400),
    and the connection stays usable for the next client."""
    big = "a" * 16_384
    path = PATHS[protocol] + (f"?q={big}" if where == "url" else "")
    token = middleware.open_session("s")
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: 2\r\n"
    )
    if where == "header":
        head += f"X-Big: {big}\r\n"
    client = RawClient(middleware.url)
    try:
        await asyncio.to_thread(client.send, (head + "\r\n{}").encode())
        status, headers, body = await asyncio.to_thread(client.response)
    finally:
        client.close()
    assert status == 431, body[:200]
    assert headers["content-type"].startswith("application/json")
    assert str(limits.MAX_HEADER_FIELD_BYTES) in error_message(protocol, json.loads(body))
    async with http.get(middleware.url + "/v1/models") as probe:
        assert probe.status == 200


@pytest.mark.slow
async def test_sharded_front_refuses_as_the_middleware_does(
    agentrl_qwen_tokenizer, agentrl_qwen_tokenizer_dir, caplog
):
    """Through the front of a two-worker middleware: an unauthenticated 60 MB body, a
    declared body over the session's cap and a chunked one past it are refused from what
    was read so far (401, 413, 413 in the route's shape, ``Connection: close``) and the
    client cannot stream the rest into the front (it forwarded the whole body to a worker);
    a 16 KB header is the route's 431 (the front answered a text/plain 400), a 40 KB one
    the parser's own 400 logged on one line (the front logged a traceback); a whole turn
    after them is served and keeps its connection."""
    from shard_support import recipe, scripted

    from agentrl.serve.middleware import DEFAULT_MAX_BODY_BYTES
    from agentrl.serve.shards import ShardedMiddleware

    async with scripted(agentrl_qwen_tokenizer) as engine:
        sm = ShardedMiddleware(workers=2, build=recipe(engine.url, agentrl_qwen_tokenizer_dir))
        await sm.start()
        try:
            token = sm.open_session("s", max_context_tokens=8_192)
            cap = limits.body_cap(8_192, DEFAULT_MAX_BODY_BYTES)
            length = 60_000_000
            head = post_head(PATHS["openai_chat"], length=length)
            status, headers, body, rest = await refused_from_headers(sm.url, head, length)
            assert (status, headers["connection"].lower()) == (401, "close")
            assert "API key" in error_message("openai_chat", body)
            assert rest < IN_FLIGHT, f"the front took {rest} more bytes of a refused body"

            head = post_head(PATHS["anthropic"], token=token, length=length)
            status, headers, body, rest = await refused_from_headers(sm.url, head, length)
            assert (status, headers["connection"].lower()) == (413, "close")
            assert str(cap) in error_message("anthropic", body)
            assert rest < IN_FLIGHT, f"the front took {rest} more bytes of a refused body"

            client = RawClient(sm.url)
            try:
                await asyncio.to_thread(client.send, post_head(PATHS["anthropic"], token=token))
                chunk = b"10000\r\n" + b" " * 0x10000 + b"\r\n"
                sent = await asyncio.to_thread(client.push, chunk, cap + 60 * MIB)
                status, headers, body = await asyncio.to_thread(client.response)
            finally:
                client.close()
            assert status == 413, (status, body)
            message = error_message("anthropic", json.loads(body))
            # The worker's answer names the cap; the front's own (the upload's reset beat the
            # worker's answer to it) says the cap was reached.
            assert str(cap) in message or "body cap was reached" in message, message
            assert sent < cap + IN_FLIGHT, f"the front took {sent} bytes past a cap of {cap}"

            client = RawClient(sm.url)
            try:
                request = post_head(PATHS["anthropic"], token=token, length=2)
                request = request.replace(
                    b"\r\n\r\n", f"\r\nX-Big: {'a' * 16_384}\r\n\r\n{{}}".encode()
                )
                await asyncio.to_thread(client.send, request)
                status, headers, body = await asyncio.to_thread(client.response)
            finally:
                client.close()
            assert status == 431, body[:200]
            assert "8190" in error_message("anthropic", json.loads(body))

            client = RawClient(sm.url)
            try:
                request = post_head(PATHS["anthropic"], token=token, length=2)
                request = request.replace(
                    b"\r\n\r\n", b"\r\nX-Big: " + b"a" * 40_000 + b"\r\n\r\n{}"
                )
                await asyncio.to_thread(client.send, request)
                status, headers, body = await asyncio.to_thread(client.response)
            finally:
                client.close()
            assert status == 400
            logged = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
            assert not logged, [r.getMessage() for r in logged]

            client = RawClient(sm.url)
            try:
                turn = json.dumps(
                    {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]}
                ).encode()
                request = post_head(PATHS["anthropic"], token=token, length=len(turn)) + turn
                await asyncio.to_thread(client.send, request)
                status, headers, body = await asyncio.to_thread(client.response)
            finally:
                client.close()
            assert status == 200, body[:200]
            assert headers.get("connection", "keep-alive").lower() != "close"
        finally:
            await sm.close()


async def test_front_answers_413_when_a_live_worker_cuts_an_upload_short():
    """The race a refusal can lose: the worker stops reading a body and closes before its
    answer reaches the front (here it never answers). The worker is alive, so the client
    gets a 413 in the protocol's error shape, not a 502 saying the worker is gone."""
    import aiohttp
    from aiohttp import web

    from agentrl.serve.shard_proxy import front_app

    async def cut_short(reader, writer):
        await reader.read(1 << 16)  # the head and the start of the body, then hang up
        writer.transport.abort()

    worker = await asyncio.start_server(cut_short, "127.0.0.1", 0)
    port = worker.sockets[0].getsockname()[1]
    session = aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}")

    async def route(headers):
        return session, headers, True

    runner = web.AppRunner(front_app(route))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    front = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    try:

        async def body():
            for _ in range(256):
                yield b" " * (1 << 16)

        async with aiohttp.ClientSession() as client:
            async with client.post(front + PATHS["anthropic"], data=body()) as reply:
                assert reply.status == 413
                assert "body cap was reached" in error_message("anthropic", await reply.json())
    finally:
        await runner.cleanup()
        await session.close()
        worker.close()
        await worker.wait_closed()
