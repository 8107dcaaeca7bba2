"""The stall one large prompt causes: while session A sends a prompt near its body cap,
session B (a separate process, so a blocked event loop shows in its latency) sends small
turns; reported: A's time, B's latencies, and the middleware loop's worst lag.

    python benchmarks/middleware_stall.py [MiB]     # default 3.8 (under the 4 MiB cap)

Run it with ``PYTHONPATH`` at another checkout's ``src`` to compare before and after.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import aiohttp
from transformers import PreTrainedTokenizerFast

from agentrl.engines.sglang import SGLangEngine
from agentrl.testing.scripted_engine import ScriptedEngine
from agentrl.testing.stack import started_middleware
from agentrl.tokenizers import qwen_tokenizer_dir

MB = float(sys.argv[1]) if len(sys.argv) > 1 else 3.8


async def main():
    tok = PreTrainedTokenizerFast.from_pretrained(str(qwen_tokenizer_dir()), local_files_only=True)
    se = ScriptedEngine(tok)
    await se.start()
    eng = SGLangEngine(se.url)
    async with started_middleware(eng, tok) as mw, aiohttp.ClientSession() as http:
        a = mw.open_session("a", max_context_tokens=131072)
        b = mw.open_session("b", max_context_tokens=131072)
        words = "def foo(bar):\n    return bar + 1  # some code comment here\n"
        text = words * int(MB * 1024 * 1024 // len(words) - 10)
        big = json.dumps(
            {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": text}]}
        )
        print(f"A body {len(big) / 2**20:.2f} MiB")
        gaps = []
        stop = False

        async def ticker():
            last = time.perf_counter()
            while not stop:
                await asyncio.sleep(0.01)
                now = time.perf_counter()
                gaps.append(now - last - 0.01)
                last = now

        async def send_a():
            t0 = time.perf_counter()
            async with http.post(
                mw.url + "/v1/messages",
                data=big,
                headers={"Authorization": f"Bearer {a}", "Content-Type": "application/json"},
            ) as r:
                await r.read()
                return r.status, time.perf_counter() - t0

        for _ in range(8):
            se.queue("fine", session="b")
        client = (
            "import json,sys,time,urllib.request\n"
            "url, tok = sys.argv[1], sys.argv[2]\n"
            "body = json.dumps({'model':'m','max_tokens':9,'messages':[{'role':'user','content':'hi'}]}).encode()\n"
            "time.sleep(0.5); out = []\n"
            "for i in range(8):\n"
            "    t0 = time.perf_counter()\n"
            "    req = urllib.request.Request(url + '/v1/messages', data=body, headers={'Authorization': 'Bearer ' + tok, 'Content-Type': 'application/json'})\n"
            "    urllib.request.urlopen(req, timeout=120).read(); out.append(time.perf_counter() - t0); time.sleep(0.25)\n"
            "print(json.dumps(out))\n"
        )

        async def send_b():
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", client, mw.url, b, stdout=asyncio.subprocess.PIPE
            )
            out, _ = await proc.communicate()
            return json.loads(out)

        tick = asyncio.create_task(ticker())
        (sa, ta), lat = await asyncio.gather(send_a(), send_b())
        stop = True
        await tick
        print(
            f"A: {sa} in {ta:.2f}s; B latencies: max {max(lat):.3f}s, all {[round(x, 3) for x in lat]}; loop max lag {max(gaps):.3f}s"
        )
    await eng.aclose()
    await se.close()


if __name__ == "__main__":
    asyncio.run(main())
