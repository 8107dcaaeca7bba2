"""What unauthenticated bodies cost the middleware: four clients at once each announce and
push a 60 MB body with no token; reported: the middleware loop's longest stall, its RSS
growth, what each client managed to send and what it was answered.

    python benchmarks/middleware_abuse.py [--clients 4] [--mb 60] [--workers 1]

Goal: a stall of at most 50 ms and an RSS growth of at most 16 MiB (the 401 comes from the
headers; the rest of the body is never read). The clients run in a child process (blocking
sockets, one thread each), so this process does only the middleware's work. ``--workers
2`` measures the sharded middleware's front (the process that accepts the connections).
Run it with ``PYTHONPATH`` at another checkout's ``src`` to compare before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

from _driver import goal_line

from agentrl.engines.sglang import SGLangEngine
from agentrl.testing.scripted_engine import ScriptedEngine
from agentrl.testing.stack import started_middleware
from agentrl.tokenizers import qwen_tokenizer_dir

GOAL_STALL_S = 0.050
GOAL_RSS_MIB = 16.0

CLIENT = r"""
import json, socket, sys, threading, time
url, clients, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
host, port = url.removeprefix("http://").rsplit(":", 1)
head = ("POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {size}\r\n\r\n").encode()
chunk = b" " * (1 << 20)
results = [None] * clients

def one(i):
    t0 = time.perf_counter()
    sock = socket.create_connection((host, int(port)), timeout=60)
    sent, error = 0, None
    try:
        sock.sendall(head)
        while sent < size:
            n = min(len(chunk), size - sent)
            sock.sendall(chunk[:n])
            sent += n
    except OSError as exc:
        error = type(exc).__name__
    answer = b""
    try:
        while b"\r\n\r\n" not in answer:
            data = sock.recv(65536)
            if not data:
                break
            answer += data
    except OSError as exc:
        answer = answer or f"({type(exc).__name__})".encode()
    sock.close()
    status = answer.split(b"\r\n", 1)[0].decode("latin-1")
    results[i] = {"sent": sent, "send_error": error, "status": status,
                  "seconds": round(time.perf_counter() - t0, 3)}

threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(results))
"""


def rss_bytes() -> int:
    """This process's resident set size now."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


async def serve(workers: int, tok_dir: str, engine_url: str):
    """A started middleware (or sharded front) and how to close it."""
    from transformers import PreTrainedTokenizerFast

    if workers > 1:
        from agentrl.serve.recipe import MiddlewareRecipe
        from agentrl.serve.shards import ShardedMiddleware

        recipe = MiddlewareRecipe(engine_url=engine_url, tokenizer=tok_dir)
        sm = ShardedMiddleware(workers=workers, build=recipe)
        await sm.start()
        return sm.url, sm.close
    tok = PreTrainedTokenizerFast.from_pretrained(tok_dir, local_files_only=True)
    context = started_middleware(SGLangEngine(engine_url), tok)
    mw = await context.__aenter__()
    return mw.url, lambda: context.__aexit__(None, None, None)


async def main(clients: int, mb: float, workers: int) -> None:
    from transformers import PreTrainedTokenizerFast

    tok_dir = str(qwen_tokenizer_dir())
    engine = ScriptedEngine(PreTrainedTokenizerFast.from_pretrained(tok_dir, local_files_only=True))
    await engine.start()
    url, close = await serve(workers, tok_dir, engine.url)
    size = int(mb * 1_000_000)
    stalls: list[float] = []
    peak = baseline = rss_bytes()
    stop = False

    async def watch() -> None:
        nonlocal peak
        last = time.perf_counter()
        while not stop:
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            stalls.append(now - last - 0.005)
            last = now
            peak = max(peak, rss_bytes())

    watcher = asyncio.create_task(watch())
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CLIENT, url, str(clients), str(size), stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    stop = True
    await watcher
    await close()
    await engine.close()
    results = json.loads(out)
    stall, growth = max(stalls), (peak - baseline) / 2**20
    print(f"{clients} unauthenticated {mb:g} MB bodies, workers={workers}")
    for i, r in enumerate(results):
        print(
            f"  client {i}: answered {r['status']!r} after {r['seconds']} s; sent "
            f"{r['sent'] / 2**20:.1f} MiB of the body ({r['send_error'] or 'all of it'})"
        )
    goal_ms = f"<= {GOAL_STALL_S * 1000:.0f} ms"
    print(
        goal_line(
            "middleware loop's longest stall",
            f"{stall * 1000:.1f} ms",
            goal_ms,
            stall <= GOAL_STALL_S,
        )
    )
    print(
        goal_line(
            "middleware RSS growth",
            f"{growth:.1f} MiB",
            f"<= {GOAL_RSS_MIB:.0f} MiB",
            growth <= GOAL_RSS_MIB,
        )
    )
    body_read = max(r["sent"] for r in results) / 2**20
    print(
        goal_line("most of one refused body sent", f"{body_read:.1f} MiB", "(kernel buffers)", None)
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--mb", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    asyncio.run(main(args.clients, args.mb, args.workers))
