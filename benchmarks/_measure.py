"""Measuring helpers shared by the benchmarks: CPU of processes, the machine's load,
spreads of repeated rounds, and goal lines."""

from __future__ import annotations

import gc
import math
import os
import statistics
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by nearest rank; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def median_min(values: Iterable[float]) -> tuple[float, float]:
    """(median, min) of repeated measurements; NaNs for none."""
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return float("nan"), float("nan")
    return statistics.median(values), min(values)


def cpu_seconds(exclude: set[int] = frozenset()) -> float:
    """CPU seconds used so far by this process and its descendants, less ``exclude``'d ones
    (and their descendants)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = time.process_time()  # this process to the nanosecond; the others by /proc ticks
    skip = set(exclude)
    for pid in exclude:
        skip |= descendants(pid)
    for pid in descendants(os.getpid()) - skip:
        total += process_cpu(pid, ticks)
    return total


def process_cpu(pid: int, ticks: int | None = None) -> float:
    """User + system CPU seconds of process ``pid`` so far (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / (ticks or os.sysconf("SC_CLK_TCK"))


def runqueue_wait(pids: Iterable[int]) -> float:
    """Seconds the threads of ``pids`` have spent runnable but waiting for a CPU (the
    scheduler's run queue, ``/proc/PID/task/*/schedstat``): the machine's queue, which a
    busy shared machine adds to every latency measured on it. Threads that have exited
    are not counted, so take differences over a run of long-lived threads."""
    total = 0
    for pid in pids:
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                total += int((task / "schedstat").read_text().split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return total / 1e9


def serving_pids(exclude: set[int]) -> set[int]:
    """This process and its descendants, less ``exclude``'d ones and theirs."""
    skip = set(exclude)
    for pid in exclude:
        skip |= descendants(pid)
    return {os.getpid(), *(descendants(os.getpid()) - skip)}


def descendants(root: int) -> set[int]:
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


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def load_line() -> str:
    """The machine's load average beside its core count, for a report's header."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {cores()} cores"


def free_cores() -> float:
    """Cores not busy with other work right now (cores less the 1-minute load average)."""
    return max(0.0, cores() - os.getloadavg()[0])


def goal_line(label: str, value: str, goal: str, ok: bool | None) -> str:
    """One figure with its goal beside it and a PASS/MISS mark (``None``: no mark)."""
    mark = "    " if ok is None else ("PASS" if ok else "MISS")
    return f"  [{mark}] {label:<52} {value:>16}   goal {goal}"


class CpuMarks:
    """The serving process's CPU clock at each request's arrival, by column.

    Requests come one at a time, so a request's CPU is the clock's advance from its
    arrival to the next request's (or the end): all its work, the reply's bytes included.
    """

    def __init__(self) -> None:
        self.marks: list[tuple[float, str]] = []

    def hook(self, column: str):
        from aiohttp import web

        @web.middleware
        async def mark(request, handler):
            self.marks.append((time.process_time(), column))
            return await handler(request)

        return mark

    def per_request(self, end: float) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        for (at, column), (after, _) in zip(self.marks, [*self.marks[1:], (end, "")], strict=True):
            out.setdefault(column, []).append(after - at)
        return out


def deep_size(value: Any, seen: set[int] | None = None) -> int:
    """Bytes of ``value`` and everything it holds (shared objects counted once)."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return 0
    seen.add(id(value))
    size = sys.getsizeof(value)
    if isinstance(value, dict):
        size += sum(deep_size(k, seen) + deep_size(v, seen) for k, v in value.items())
    elif isinstance(value, list | tuple | set | frozenset):
        size += sum(deep_size(v, seen) for v in value)
    elif hasattr(value, "__attrs_attrs__"):
        size += sum(deep_size(getattr(value, a.name), seen) for a in value.__attrs_attrs__)
    return size


async def timed_finish(mw, sid: str) -> dict[str, Any]:
    """``finish_session``'s CPU and wall time, and the size of what it returned."""
    gc.collect()
    cpu, wall = time.process_time(), time.perf_counter()
    samples = await mw.finish_session(sid, reward=1.0)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {
        "cpu_ms": cpu * 1e3,
        "wall_ms": wall * 1e3,
        "samples": len(samples),
        "tokens": sum(len(s.tokens) for s in samples),
        "bytes": sum(deep_size(s) for s in samples),
    }


class TailWatch:
    """Where a serving process's slow moments come from, watched while a run plays: the
    event loop's lag (a ``sleep(interval)`` that woke late: a long step held the loop, or
    the process waited for a CPU) and every garbage-collector pause, by generation.

    ``async with TailWatch() as watch: ...`` then ``watch.figures()``.
    """

    def __init__(self, interval: float = 0.005) -> None:
        self.interval = interval
        self.lags: list[float] = []
        self.pauses: list[tuple[int, float]] = []
        self._gc_started = 0.0
        self._task: Any = None

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self.pauses.append((info["generation"], time.perf_counter() - self._gc_started))

    async def _sample(self) -> None:
        import asyncio

        while True:
            started = time.perf_counter()
            await asyncio.sleep(self.interval)
            self.lags.append(time.perf_counter() - started - self.interval)

    async def __aenter__(self) -> TailWatch:
        import asyncio

        gc.callbacks.append(self._on_gc)
        self._task = asyncio.ensure_future(self._sample())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        import asyncio

        gc.callbacks.remove(self._on_gc)
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass

    def figures(self) -> dict[str, float]:
        """Loop lag p99 and max, GC pauses (count, of generation 2, longest, total), in ms."""
        pauses = [seconds for _, seconds in self.pauses]
        return {
            "lag_p99_ms": percentile(self.lags, 0.99) * 1e3,
            "lag_max_ms": max(self.lags, default=0.0) * 1e3,
            "gc_pauses": float(len(pauses)),
            "gc_gen2": float(sum(1 for gen, _ in self.pauses if gen == 2)),
            "gc_max_ms": max(pauses, default=0.0) * 1e3,
            "gc_total_ms": sum(pauses) * 1e3,
        }


#: The library-path columns: each switches one fast path off in the serving process while
#: its requests are served (issue 34's rule: a fast path stays only behind a measured win).
#: ``libenc``: the tokenizers library encodes every text (``ascii_bpe`` off); ``libjinja``:
#: transformers' ``apply_chat_template`` renders every prompt (the compiled ``FastSandbox``
#: template off).
LIBRARY_SWITCHES = {"libenc": ("ascii_bpe", "ENABLED"), "libjinja": ("templates", "COMPILED")}


def switches_hook(column: str):
    """An aiohttp middleware that sets the fast-path switches for ``column``'s requests:
    off where the column's name ends with ``-libenc`` or ``-libjinja``, on otherwise.

    Requests come one at a time and all their work runs before the next one arrives, so the
    columns of one process can each run with their own switches, interleaved turn by turn.
    """
    import importlib

    from aiohttp import web

    settings = [
        (importlib.import_module(f"agentrl.prompts.{module}"), name, not column.endswith(suffix))
        for suffix, (module, name) in LIBRARY_SWITCHES.items()
    ]

    @web.middleware
    async def switch(request, handler):
        for module, name, value in settings:
            setattr(module, name, value)
        return await handler(request)

    return switch
