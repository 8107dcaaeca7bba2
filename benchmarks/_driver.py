"""The benchmarks' client side: a Claude-Code-shaped session, played from a child process.

The child process runs a scripted SGLang engine and the load generator (the clients), so
the process under test does only its own work. The engine answers every ``/generate``
exactly ``delay`` seconds after the request arrived (``ScriptedEngine(delay_from_arrival=
True)``: its own JSON parsing and checks happen inside that time), so what the middleware
adds is measured at the client: client latency minus the known delay. The client encodes
each request body before it starts the clock and parses the reply after it stops, so its
own JSON work is not charged to the middleware: the clock runs from the request's first
byte written to the reply's last byte read.

Parent side::

    with Driver() as driver:                       # spawns the child (tokenizer loaded there)
        url = driver.engine(delay=0.05, style="agentrl")   # (re)starts the scripted engine
        report = driver.play(Plan(url=mw_url, tokens=[...], ...))
        report.latencies[i] -> [(seconds, prompt_tokens), ...] per session
"""

from __future__ import annotations

import asyncio
import functools
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any

import attrs

from agentrl import jsonio

REPO = Path(__file__).resolve().parents[1]
FIXTURE = (
    REPO.parent / "shared" / "fixtures" / "clients" / "claude_code" / "001_post_v1_messages.json"
)
TEMPLATE = REPO / "tests" / "data" / "qwen3_chat_template.jinja"
#: Lines of code-like tool output per ~1.75k tokens.
LINES_PER_1750 = 120


@functools.cache
def load_tokenizer():
    """The Qwen3 tokenizer with its chat template (what every run renders with; one per
    process)."""
    from agentrl.tokenizers import build_qwen_tokenizer

    return build_qwen_tokenizer(chat_template=TEMPLATE.read_text())


def base_body() -> dict[str, Any]:
    """Claude Code 2.1.332's first request (its real system prompt and tools), not streamed."""
    if not FIXTURE.is_file():
        sys.exit(f"captured Claude Code request not found at {FIXTURE} (shared/ beside the clone)")
    body = json.loads(FIXTURE.read_text())["body"]
    return {**body, "stream": False}


def source_file(index: int, lines: int = LINES_PER_1750) -> str:
    """Code-like tool output, about 14.6 tokens a line, different for every index."""
    out = [f'"""Module {index}: helpers for the data pipeline."""', "", "import os", ""]
    for i in range(lines // 6):
        name = f"handle_{index}_{i}"
        out += [
            f"def {name}(record, limit={i + index % 7}):",
            f"    # step {i}: normalise field_{i} and check bounds",
            f"    value = record.get('field_{i}', {i * index % 97})",
            "    if value > limit:",
            f"        raise ValueError(f'{name}: {{value}} exceeds {{limit}}')",
            f"    return os.path.join('out', str(value), '{name}.json')",
        ]
    return "\n".join(out)


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

    With ``tokenizer``, each turn's text is tokenized once and its ids reused (what the
    engine would tokenize each time), so 256 sessions do not tokenize the same few texts
    thousands of times in the load generator's process.
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
    from agentrl.adapters.middleware import Middleware
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
    """What the child's clients do: one session per token.

    Each session runs ``turns`` turns, or until its prompt reaches ``until_tokens``; each
    tool result is ``lines`` lines of code; the client waits ``think`` seconds between a
    reply and its next request (tool time); session i starts ``i * stagger`` seconds in.
    ``check_render``: after every turn, assert that the ids the engine got equal the full
    render of the request (``render`` prompt mode).
    """

    url: str
    tokens: tuple[str, ...]
    turns: int | None = None
    until_tokens: int | None = None
    lines: int = LINES_PER_1750
    think: float = 0.0
    stagger: float = 0.0
    check_render: bool = False
    reminder_every: int = 0


@attrs.frozen(kw_only=True)
class Report:
    """What the clients measured: per session, (latency seconds, prompt tokens) per turn."""

    latencies: list[list[tuple[float, int]]]
    wall: float
    overruns: int
    checked_turns: int = 0
    sampled_tokens: int = 0


class Driver:
    """The parent's handle on the child process (engine + clients)."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self.process = context.Process(target=_child, args=(child,), daemon=True)
        self.process.start()
        child.close()

    def __enter__(self) -> Driver:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _call(self, *message: Any) -> Any:
        self._conn.send(message)
        kind, value = self._conn.recv()
        if kind == "error":
            raise RuntimeError(f"benchmark client process failed:\n{value}")
        return value

    def engine(
        self,
        *,
        delay: float,
        style: str = "agentrl",
        reasoning: bool = False,
        count_ids: bool = False,
    ) -> str:
        """(Re)start the child's scripted engine; returns its URL. ``count_ids``: the engine
        counts prompt ids on the raw body instead of parsing them (load modes)."""
        options = {"delay": delay, "style": style, "reasoning": reasoning}
        return self._call("engine", {**options, "count_ids": count_ids})

    def play(self, plan: Plan) -> Report:
        """Run ``plan`` in the child (blocking)."""
        return self._call("play", plan)

    async def aplay(self, plan: Plan) -> Report:
        """``play`` without blocking the caller's event loop (the middleware serves on it)."""
        return await asyncio.get_running_loop().run_in_executor(None, self.play, plan)

    def close(self) -> None:
        if self.process.is_alive():
            try:
                self._conn.send(("stop",))
            except (BrokenPipeError, OSError):
                pass
            self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


# -- child side ---------------------------------------------------------------------------


def _child(conn) -> None:
    asyncio.run(_child_main(conn))


async def _child_main(conn) -> None:
    import traceback

    from agentrl.testing.scripted_engine import ScriptedEngine

    tokenizer = load_tokenizer()
    loop = asyncio.get_running_loop()
    engine: ScriptedEngine | None = None
    try:
        while True:
            message = await loop.run_in_executor(None, conn.recv)
            try:
                if message[0] == "stop":
                    return
                if message[0] == "engine":
                    if engine is not None:
                        await engine.close()
                    options = dict(message[1])
                    count_ids = options.pop("count_ids", False)
                    engine = ScriptedEngine(
                        tokenizer,
                        responder=responder_for(**options, tokenizer=tokenizer),
                        delay_from_arrival=True,
                        count_ids=count_ids,
                    )
                    conn.send(("ok", await engine.start()))
                elif message[0] == "play":
                    assert engine is not None, "start the engine first"
                    conn.send(("ok", await _play(engine, tokenizer, message[1])))
            except Exception:
                conn.send(("error", traceback.format_exc()))
    finally:
        if engine is not None:
            await engine.close()


async def _play(engine, tokenizer, plan: Plan) -> Report:
    import aiohttp

    engine.overruns = 0
    engine.requests.clear()
    engine.served.clear()
    checker = _RenderCheck(engine, tokenizer) if plan.check_render else None
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=900)
    async with aiohttp.ClientSession(trust_env=False, connector=connector, timeout=timeout) as http:
        started = time.perf_counter()
        latencies = await asyncio.gather(
            *(
                _session(http, plan, token, i * plan.stagger, engine, checker)
                for i, token in enumerate(plan.tokens)
            )
        )
        wall = time.perf_counter() - started
    return Report(
        latencies=list(latencies),
        wall=wall,
        overruns=engine.overruns,
        checked_turns=checker.turns if checker else 0,
        sampled_tokens=sum(len(g.output_ids) for g in engine.served),
    )


async def _session(http, plan: Plan, token: str, offset: float, engine, checker):
    """Play a Claude-Code-like client: replay each reply, answer its tool call with a file."""
    await asyncio.sleep(offset)
    body = base_body()
    messages = list(body["messages"])
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    out: list[tuple[float, int]] = []
    turn = 0
    while True:
        turn += 1
        data = jsonio.dumps({**body, "messages": messages})
        if checker is None and not plan.reminder_every:
            # Nothing reads what the engine recorded: keep the child's memory flat.
            engine.requests.clear()
            engine.served.clear()
        started = time.perf_counter()
        async with http.post(f"{plan.url}/v1/messages", data=data, headers=headers) as r:
            raw = await r.read()
            status = r.status
        latency = time.perf_counter() - started
        reply = jsonio.loads(raw)
        if status != 200:
            raise RuntimeError(f"middleware answered {status}: {reply}")
        out.append((latency, reply["usage"]["input_tokens"]))
        if checker is not None:
            checker.check(data, token)
        call = next(b for b in reply["content"] if b["type"] == "tool_use")
        result: list[dict[str, Any]] = [
            {
                "type": "tool_result",
                "tool_use_id": call["id"],
                "content": source_file(turn, plan.lines),
            }
        ]
        if plan.reminder_every and turn % plan.reminder_every == 0:
            result.append(
                {
                    "type": "text",
                    "text": "<system-reminder>\nKeep the todo list current.\n</system-reminder>",
                }
            )
        messages += [
            {"role": "assistant", "content": reply["content"]},
            {"role": "user", "content": result},
        ]
        if plan.turns is not None and turn >= plan.turns:
            return out
        if plan.until_tokens is not None and out[-1][1] >= plan.until_tokens:
            return out
        if plan.think:
            await asyncio.sleep(plan.think)


class _RenderCheck:
    """Asserts that the engine got exactly the full render of each request."""

    def __init__(self, engine, tokenizer) -> None:
        from agentrl.adapters.anthropic import AnthropicAdapter

        self.engine, self.tokenizer, self.adapter = engine, tokenizer, AnthropicAdapter()
        self.turns = 0

    def check(self, data: bytes, token: str) -> None:
        from agentrl.adapters.rendering import render_full

        chat = self.adapter.parse_request(json.loads(data), {})
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
        self.engine.requests.clear()
        self.engine.served.clear()


# -- measuring ----------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by nearest rank; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def cpu_seconds(exclude: set[int]) -> float:
    """CPU seconds used so far by this process and its descendants, less ``exclude``'d ones."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = sum(os.times()[:2])
    for pid in _descendants(os.getpid()) - exclude:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def exclude_driver(driver: Driver) -> set[int]:
    """The child process and its descendants (not the process under test)."""
    pid = driver.process.pid
    return {pid} | _descendants(pid) if pid else set()


def goal_line(label: str, value: str, goal: str, ok: bool | None) -> str:
    """One figure with its goal beside it and a PASS/MISS mark (``None``: no mark)."""
    mark = "    " if ok is None else ("PASS" if ok else "MISS")
    return f"  [{mark}] {label:<52} {value:>16}   goal {goal}"
