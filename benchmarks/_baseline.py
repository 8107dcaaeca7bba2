"""Columns served by other code: another checkout of agentrl (``--baseline-src``), slime.

``python benchmarks/middleware.py --baseline-src DIR`` adds ``splice@base`` and
``render@base``: the same sessions, in the same lockstep, served by the agentrl under
``DIR`` (a checkout, or its ``src``) in a child process that imports only that code. Its
CPU per request is marked the same way (at each request's arrival, in that process), so
"no slower than the previous code" is judged turn by turn within one run, never against a
figure from another day. Pointing ``DIR`` at the code under test itself is an A/A run: the
ratios it prints are the method's noise.

``slime_server`` serves slime's own ``AnthropicAdapter`` in the benchmark's process
(``--slime-src``), its requests marked the same way.

Child side (this file run as a script, ``PYTHONPATH`` at the baseline's ``src``)::

    python _baseline.py ENGINE_URL '{"splice@base": {"sid": ..., "prompt_mode": "splice"}}'
    -> one JSON line {name: [url, token]}; then, on a line on stdin, one JSON line with
       each column's CPU per request, its finish_session figures and its splice counts.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

#: Baseline columns and the local column each is compared with.
BASE_COLUMNS = {"splice@base": "splice", "render@base": "render"}


def baseline_pythonpath(src: str) -> str:
    """The ``src`` directory of a checkout (or ``src`` itself)."""
    root = Path(src).resolve()
    for candidate in (root / "src", root):
        if (candidate / "agentrl" / "__init__.py").is_file():
            return str(candidate)
    raise SystemExit(f"--baseline-src: no agentrl package under {root} or {root / 'src'}")


class BaselineServer:
    """The parent's handle on the baseline's serving process."""

    def __init__(self, src: str, engine_url: str, columns: dict[str, dict[str, Any]]) -> None:
        self.src, self.engine_url, self.columns = src, engine_url, columns
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> dict[str, tuple[str, str]]:
        env = {**os.environ, "PYTHONPATH": baseline_pythonpath(self.src)}
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            self.engine_url,
            json.dumps(self.columns),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=env,
        )
        return {k: tuple(v) for k, v in (await self._read()).items()}

    async def finish(self) -> dict[str, Any]:
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write(b"finish\n")
        await self.process.stdin.drain()
        result = await self._read()
        await self.process.wait()
        return result

    async def _read(self) -> Any:
        assert self.process is not None and self.process.stdout is not None
        line = await self.process.stdout.readline()
        if not line:
            code = await self.process.wait()
            raise RuntimeError(f"the baseline's serving process exited ({code}); see its stderr")
        return json.loads(line)

    def kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()


async def slime_server(url: str, tokenizer, marks):
    """slime's own AnthropicAdapter serving on 127.0.0.1 (adapter, runner, URL), or why not."""
    try:
        from aiohttp import web
        from slime.agent.adapters.anthropic import AnthropicAdapter
    except ImportError as exc:
        return f"not available ({exc}; pass --slime-src at a slime checkout)"
    adapter = AnthropicAdapter(tokenizer=tokenizer, sglang_url=url)
    adapter.app.middlewares.append(marks.hook("slime"))
    runner = web.AppRunner(adapter.app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    adapter.open_session("slime")
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return adapter, runner, f"http://127.0.0.1:{port}"


def here() -> str:
    """The ``src`` directory this process imports agentrl from."""
    import agentrl

    return str(Path(agentrl.__file__).resolve().parents[1])


async def _serve(engine_url: str, columns: dict[str, dict[str, Any]]) -> None:
    from _driver import load_tokenizer
    from _measure import CpuMarks, timed_finish

    try:
        from agentrl.adapters import Middleware
    except ImportError:
        from agentrl.serve.middleware import Middleware
    from agentrl.engines.sglang import SGLangEngine

    tokenizer = load_tokenizer()
    try:
        from agentrl.serve.shard_wire import tune_gc
    except ImportError:
        pass
    else:
        tune_gc()
    marks, served, engines, addresses = CpuMarks(), {}, [], {}
    for name, spec in columns.items():
        options = {k: v for k, v in spec.items() if k != "sid"}
        engine = SGLangEngine(engine_url)
        mw = Middleware(
            engine=engine,
            tokenizer=tokenizer,
            tool_parser="hermes",
            reasoning_parser="qwen3",
            adapters=["anthropic"],
            **options,
        )
        mw.app.middlewares.append(marks.hook(name))
        await mw.start()
        engines.append(engine)
        served[name] = mw
        addresses[name] = (mw.url, mw.open_session(spec["sid"]))
    print(json.dumps(addresses), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    cpu = marks.per_request(time.process_time())
    finish = {name: await timed_finish(mw, columns[name]["sid"]) for name, mw in served.items()}
    stats = {name: dict(getattr(mw, "splice_stats", {})) for name, mw in served.items()}
    print(json.dumps({"cpu": cpu, "finish": finish, "splice_stats": stats}), flush=True)
    for mw in served.values():
        await mw.close()
    for engine in engines:
        await engine.aclose()


if __name__ == "__main__":
    asyncio.run(_serve(sys.argv[1], json.loads(sys.argv[2])))
