"""The benchmarks' load generator and scripted engine, in processes of their own.

The process under test does only its own work: a scripted SGLang engine runs in one child
process and the clients (:mod:`_client`) in one or more others, each reporting its own CPU
time, so a saturated load generator shows in the figures instead of passing for the
middleware's latency. The engine answers every ``/generate`` exactly ``delay`` seconds
after the request arrived (``ScriptedEngine(delay_from_arrival=True)``: its own parsing and
checks happen inside that time), so what the middleware adds is measured at the client:
client latency minus the known delay, from the request's first byte written to the
reply's last byte read.

Parent side::

    with Driver(clients=2) as driver:              # engine child + 2 client children
        url = driver.engine(delay=0.05)            # (re)starts the scripted engine
        report = driver.play(Plan(url=mw_url, tokens=(...), until_tokens=131_072, stream=True))
        report.latencies[i] -> [(seconds, prompt_tokens, edit), ...] per session
        report.driver_cpu -> [(cpu seconds, wall seconds), ...] per client process

    with Driver() as driver:                       # one child: engine and a sequential client
        turns = await driver.alockstep(Lockstep(targets=(Target(url=..., token=...), ...),
                                                until_tokens=131_072))

``lockstep`` plays one session per target, one request in flight at a time, taking the
targets in turn and reversing the order every turn (A B C, C B A, …): a comparison whose
columns share each moment of the machine's load.
"""

from __future__ import annotations

import asyncio
import functools
import json
import multiprocessing
import time
from pathlib import Path
from typing import Any

import attrs
from _client import LINES_PER_1750, ClientSession
from _measure import goal_line, percentile  # noqa: F401  (re-exported to the benchmarks)

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = REPO / "tests" / "data" / "qwen3_chat_template.jinja"


@functools.cache
def load_tokenizer():
    """The Qwen3 tokenizer with its chat template (what every run renders with; one per
    process)."""
    from agentrl.tokenizers import build_qwen_tokenizer

    return build_qwen_tokenizer(chat_template=TEMPLATE.read_text())


def tool_call_text(index: int, *, reasoning: bool = False, style: str = "agentrl") -> str:
    """The model's turn ``index``: read a module with the Bash tool.

    ``style="agentrl"`` is Hermes JSON (the middleware's ``hermes`` parser); ``"slime"`` is
    the XML form that slime's adapter parses without SGLang installed.
    """
    command = f"cat src/module_{index}.py"
    if style == "slime":
        call = (
            f"<tool_call>\n<function=Bash>\n<parameter=command>\n{command}\n</parameter>\n"
            f"<parameter=description>\nShow module {index}\n</parameter>\n</function>\n"
            "</tool_call>"
        )
    else:
        arguments = {"command": command, "description": f"Show module {index}"}
        call = f"<tool_call>\n{json.dumps({'name': 'Bash', 'arguments': arguments})}\n</tool_call>"
    text = f"Let me read module {index}.\n{call}"
    if reasoning:
        text = f"<think>\nModule {index - 1} looked fine; next I check module {index}.\n</think>\n\n{text}"
    return text


def responder_for(
    *, reasoning: bool = False, style: str = "agentrl", delay: float = 0.0, tokenizer=None
):
    """A scripted-engine responder: each session's turn k calls the tool on module k.

    With ``tokenizer``, each turn's text is tokenized once and its ids reused, so 256
    sessions do not tokenize the same few texts thousands of times in the engine's process.
    """
    from agentrl.testing.scripted_engine import ScriptedReply

    counters: dict[str, int] = {}

    @functools.cache
    def ids_of(text: str) -> tuple[int, ...]:
        return tuple(tokenizer(text, add_special_tokens=False)["input_ids"])

    def respond(body, headers):
        key = headers.get("X-SMG-Routing-Key", "")
        counters[key] = counters.get(key, 0) + 1
        text = tool_call_text(counters[key], reasoning=reasoning, style=style)
        if tokenizer is None:
            return ScriptedReply(text=text, delay=delay)
        return ScriptedReply(ids=ids_of(text), delay=delay)

    return respond


def build_middleware(engine_url: str):
    """A worker's middleware (module level, so it pickles into a worker process)."""
    from agentrl.adapters import Middleware
    from agentrl.engines.sglang import SGLangEngine

    return Middleware(
        engine=SGLangEngine(engine_url),
        tokenizer=load_tokenizer(),
        tool_parser="hermes",
        reasoning_parser="qwen3",
        adapters=["anthropic"],
    )


@attrs.frozen(kw_only=True)
class Plan:
    """What the clients do: one session per token, all at once.

    Each session runs ``turns`` turns, or until its prompt reaches ``until_tokens``; each
    tool result is ``lines`` lines of code; the client waits ``think`` seconds between a
    reply and its next request (tool time); session i starts ``i * stagger`` seconds in.
    ``stream``: ask for SSE, as Claude Code does. ``edits``/``edit_every``: history edits
    (:class:`_client.ClientSession`).
    """

    url: str
    tokens: tuple[str, ...]
    turns: int | None = None
    until_tokens: int | None = None
    lines: int = LINES_PER_1750
    think: float = 0.0
    stagger: float = 0.0
    stream: bool = False
    edits: tuple[str, ...] = ()
    edit_every: int = 0
    first: int = 0  # the index of tokens[0] among all sessions (for its start offset)


@attrs.frozen(kw_only=True)
class Target:
    """One lockstep session: where it goes and how its client behaves.

    ``check_render``: assert that the engine's prompt equals the full render of each
    request (``render`` prompt mode). ``edits``/``edit_every``: history edits.
    """

    url: str
    token: str
    stream: bool = True
    check_render: bool = False
    edits: tuple[str, ...] = ()
    edit_every: int = 0


@attrs.frozen(kw_only=True)
class Lockstep:
    """One session per target, taken in turn, one request in flight at a time, each
    until its prompt reaches ``until_tokens``."""

    targets: tuple[Target, ...]
    until_tokens: int
    lines: int = LINES_PER_1750


@attrs.frozen(kw_only=True)
class Report:
    """What the clients measured: per session, (seconds, prompt tokens, edit) per turn."""

    latencies: list[list[tuple[float, int, str | None]]]
    wall: float
    overruns: int
    driver_cpu: list[tuple[float, float]] = attrs.Factory(list)
    engine_cpu: float = 0.0
    checked_turns: int = 0

    def driver_busiest(self) -> float:
        """The busiest client process's share of one core over the run (1.0: saturated)."""
        return max((cpu / wall for cpu, wall in self.driver_cpu if wall > 0), default=0.0)


class _Child:
    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_child, args=(child,), daemon=True)
        self.process.start()
        child.close()

    def send(self, *message: Any) -> None:
        self.conn.send(message)

    def recv(self) -> Any:
        kind, value = self.conn.recv()
        if kind == "error":
            raise RuntimeError(f"benchmark client process failed:\n{value}")
        return value

    def call(self, *message: Any) -> Any:
        self.send(*message)
        return self.recv()

    def close(self) -> None:
        if self.process.is_alive():
            try:
                self.conn.send(("stop",))
            except (BrokenPipeError, OSError):
                pass
            self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


class Driver:
    """The parent's handle on the child processes: the engine's, and ``clients`` more for
    the clients (0: the engine's child plays the clients too)."""

    def __init__(self, clients: int = 0) -> None:
        self._engine = _Child()
        self._clients = [_Child() for _ in range(clients)] or [self._engine]

    def __enter__(self) -> Driver:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def pids(self) -> set[int]:
        """Every child process (the engine's and the clients')."""
        children = {self._engine, *self._clients}
        return {c.process.pid for c in children if c.process.pid}

    @property
    def client_processes(self) -> int:
        return len(self._clients)

    def engine(
        self,
        *,
        delay: float,
        style: str = "agentrl",
        reasoning: bool = False,
        count_ids: bool = False,
    ) -> str:
        """(Re)start the scripted engine of ``style``; returns its URL. ``count_ids``: the
        engine counts prompt ids on the raw body instead of parsing them (load modes)."""
        options = {"delay": delay, "style": style, "reasoning": reasoning}
        return self._engine.call("engine", {**options, "count_ids": count_ids})

    def play(self, plan: Plan) -> Report:
        """Run ``plan`` in the client processes, sessions dealt out in turn (blocking)."""
        n = len(self._clients)
        engine_cpu = self._engine.call("reset")
        shares = [plan.tokens[i::n] for i in range(n)]
        for index, (child, tokens) in enumerate(zip(self._clients, shares, strict=True)):
            if tokens:
                child.send("play", attrs.evolve(plan, tokens=tokens, first=index), n)
        parts = [
            child.recv() for child, tokens in zip(self._clients, shares, strict=True) if tokens
        ]
        overruns, engine_cpu_after = self._engine.call("stats")
        latencies: list[list] = [[] for _ in plan.tokens]
        for index, part in enumerate(parts):
            latencies[index::n] = part["latencies"]
        return Report(
            latencies=latencies,
            wall=max(p["wall"] for p in parts),
            overruns=overruns,
            driver_cpu=[(p["cpu"], p["wall"]) for p in parts],
            engine_cpu=engine_cpu_after - engine_cpu,
            checked_turns=sum(p["checked"] for p in parts),
        )

    async def aplay(self, plan: Plan) -> Report:
        """``play`` without blocking the caller's event loop (the middleware serves on it)."""
        return await asyncio.get_running_loop().run_in_executor(None, self.play, plan)

    async def alockstep(self, plan: Lockstep) -> dict[str, Any]:
        """Play ``plan`` in the engine's child: per target, [(seconds, tokens, edit), ...]."""
        if self._clients[0] is not self._engine:
            raise RuntimeError("lockstep needs Driver(clients=0): its engine checks renders")

        def play() -> dict[str, Any]:
            self._engine.call("reset")
            return self._engine.call("lockstep", plan)

        return await asyncio.get_running_loop().run_in_executor(None, play)

    def close(self) -> None:
        for child in {self._engine, *self._clients}:
            child.close()


# -- child side ---------------------------------------------------------------------------


def _child(conn) -> None:
    asyncio.run(_child_main(conn))


async def _child_main(conn) -> None:
    import traceback

    from agentrl.testing.scripted_engine import ScriptedEngine

    loop = asyncio.get_running_loop()
    engines: dict[str, ScriptedEngine] = {}
    try:
        while True:
            message = await loop.run_in_executor(None, conn.recv)
            try:
                if message[0] == "stop":
                    return
                if message[0] == "engine":
                    options = dict(message[1])
                    if options["style"] in engines:
                        await engines.pop(options["style"]).close()
                    count_ids = options.pop("count_ids", False)
                    engine = ScriptedEngine(
                        load_tokenizer(),
                        responder=responder_for(**options, tokenizer=load_tokenizer()),
                        delay_from_arrival=True,
                        count_ids=count_ids,
                    )
                    engines[options["style"]] = engine
                    conn.send(("ok", await engine.start()))
                elif message[0] == "reset":
                    for engine in engines.values():
                        engine.overruns = 0
                        _forget(engine)
                    conn.send(("ok", time.process_time()))
                elif message[0] == "stats":
                    overruns = sum(e.overruns for e in engines.values())
                    conn.send(("ok", (overruns, time.process_time())))
                elif message[0] == "play":
                    conn.send(("ok", await _play(list(engines.values()), *message[1:])))
                elif message[0] == "lockstep":
                    conn.send(("ok", await _lockstep(engines, message[1])))
            except Exception:
                conn.send(("error", traceback.format_exc()))
    finally:
        for engine in engines.values():
            await engine.close()


def _forget(engine) -> None:
    engine.requests.clear()
    engine.served.clear()


def _http():
    import aiohttp

    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=900)
    return aiohttp.ClientSession(trust_env=False, connector=connector, timeout=timeout)


async def _play(engines, plan: Plan, processes: int) -> dict[str, Any]:
    cpu = time.process_time()
    async with _http() as http:
        started = time.perf_counter()
        latencies = await asyncio.gather(
            *(
                _session(http, plan, token, (plan.first + i * processes) * plan.stagger, engines)
                for i, token in enumerate(plan.tokens)
            )
        )
        wall = time.perf_counter() - started
    return {"latencies": latencies, "wall": wall, "cpu": time.process_time() - cpu, "checked": 0}


async def _session(http, plan: Plan, token: str, offset: float, engines):
    await asyncio.sleep(offset)
    client = ClientSession(
        token, stream=plan.stream, lines=plan.lines, edits=plan.edits, edit_every=plan.edit_every
    )
    out: list[tuple[float, int, str | None]] = []
    while True:
        for engine in engines:  # nothing reads what the engine recorded: keep memory flat
            _forget(engine)
        out.append(await client.exchange(http, plan.url))
        if plan.turns is not None and client.turn >= plan.turns:
            return out
        if plan.until_tokens is not None and client.prompt_tokens >= plan.until_tokens:
            return out
        if plan.think:
            await asyncio.sleep(plan.think)


async def _lockstep(engines, plan: Lockstep) -> dict[str, Any]:
    clients = [
        ClientSession(
            t.token, stream=t.stream, lines=plan.lines, edits=t.edits, edit_every=t.edit_every
        )
        for t in plan.targets
    ]
    out: list[list[tuple[float, int, str | None]]] = [[] for _ in clients]
    checker = _RenderCheck(engines["agentrl"], load_tokenizer())
    order = list(range(len(clients)))
    done: set[int] = set()
    async with _http() as http:
        while len(done) < len(clients):
            for index in order:
                if index in done:
                    continue
                for engine in engines.values():
                    _forget(engine)
                client, target = clients[index], plan.targets[index]
                out[index].append(await client.exchange(http, target.url))
                if target.check_render:
                    checker.check(client)
                if client.prompt_tokens >= plan.until_tokens:
                    done.add(index)
            order.reverse()
    overruns = sum(e.overruns for e in engines.values())
    return {"latencies": out, "checked": checker.turns, "overruns": overruns}


class _RenderCheck:
    """Asserts that the engine got exactly the full render of each request."""

    def __init__(self, engine, tokenizer) -> None:
        from agentrl.adapters.anthropic import AnthropicAdapter

        self.engine, self.tokenizer, self.adapter = engine, tokenizer, AnthropicAdapter()
        self.turns = 0

    def check(self, client: ClientSession) -> None:
        from agentrl.prompts.rendering import render_full

        # the request just answered: the history before its reply and tool result
        body = {**client.body, "messages": client.messages[:-2]}
        chat = self.adapter.parse_request(body, {})
        expected = render_full(self.tokenizer, chat.messages, chat.tools)
        got = self.engine.served[-1].input_ids
        if list(got) != list(expected):
            first = next(
                (i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b),
                min(len(got), len(expected)),
            )
            raise AssertionError(
                f"render mode: turn {self.turns + 1}'s prompt ids differ from the full render "
                f"at token {first} ({len(got)} vs {len(expected)} ids)"
            )
        self.turns += 1
