"""Rollouts per minute with a real agent CLI, and where each rollout's CPU goes.

    python benchmarks/rollout.py [--quick] [--concurrency 1,4,8] [--rollouts N]
                                 [--prewarm on|off] [--long wait|poll]

Goal: a rollout's fixed cost (the sandbox, its execs, git, grading) stays small beside the
agent's own, so rollouts/min is bound by the agent CLI, not by agentrl. Each rollout is the
real Claude Code CLI (``.cache/clis``, ``AGENTRL_CLI_DIR``) in the real ``local``
sandbox, driven by the scripted SGLang engine through the real middleware, on the bundled
textstats example task (read, edit, run the tests, finish; the scaleswe grader runs the
tests again in a fresh sandbox): everything real but the model. ``--quick``: concurrency
1, 2 rollouts.

It prints, each with its goal:

- **exec('true')**: the processes the sandbox creates for one exec, counted from its own
  pid namespace (whose pids are handed out one by one); goal ≤ 2 (the supervisor and the
  command, the floor for a command whose exit code must outlive it); its wall time and CPU
  (in the sandbox, and ours).
- **one rollout** (the warm-up, run alone): its execs and the processes created in its
  sandboxes (counted from their pid namespaces by an ``echo $$`` probe after each phase,
  the probes' own left out), by phase.
- **rollouts/min** at each concurrency (first start to last end), CPU seconds per rollout
  (everything, and ours), execs per rollout, and agentrl's share of the CPU: its process
  (goal ≤ 10%) and the exec plumbing, execs × an exec's cost (goal ≤ 5%).
- **per phase** (boot, prepare, install, agent, diff, teardown, grade, finish): the median
  wall time and the execs a rollout ran in it; at concurrency 1 also the CPU seconds, ours
  and the children's (the CLI, bubblewrap, the sandbox's shells, git, pytest). CPU comes from a cpuacct cgroup this
  benchmark moves itself into (every child inherits it), else from ``getrusage`` (children
  counted once reaped). Phases overlap at concurrency > 1: there only totals are CPU.
- **agent phase wall** at concurrency 1, each rollout's beside the CLI's own
  ``duration_ms``: how long after the CLI's end its exit is seen (``--long poll``
  measures ``exec_and_wait`` polling its marker, as a backend that cannot wait does:
  the phase then ends on the next poll, 1 s apart once the command runs past 0.75 s).
- **grade start**: seconds from the grade phase's start to the grading sandbox's first
  command: its boot, unless the sandbox was prewarmed while the agent ran
  (``--prewarm off`` measures without); goal ≤ 0.1 s.

The baseline: ``MAIN_BASELINE`` (main before this work); run this file with
``PYTHONPATH=<main checkout>/src`` to measure main itself in the same conditions. On a
shared machine compare runs made back to back, and trust the exec cost (a micro-figure)
over rollouts/min.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import json
import os
import pathlib
import resource
import statistics
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from _driver import goal_line

from agentrl.graders.scaleswe import ScaleSWEGrader
from agentrl.graders.tasks import load_tasks
from agentrl.harnesses.claude_code import ClaudeCodeHarness
from agentrl.rollout import RolloutConfig, run_rollout
from agentrl.rollout import phases as phases_module
from agentrl.sandboxes.local import LocalSandbox

REPO = pathlib.Path(__file__).resolve().parents[1]

#: Figures of main before this work (commit 6cde69f): the issue's (57 rollouts/min at
#: concurrency 8, 1.68 CPU-s a rollout, measured on a calmer machine) and this benchmark's
#: own, run against main's source (``PYTHONPATH=main/src``) on a shared 2-core machine at
#: load 6-18, interleaved with runs of this branch (exec cost; grade start at concurrency 1).
MAIN_BASELINE = {
    "rollouts/min at 8": 57.0,
    "cpu s/rollout at 8": 1.68,
    "forks per exec": 5.0,
    "exec cpu ms": 13.5,
    "grade start s": 0.18,
}
#: The port the middleware's unix socket is relayed to in each sandbox.
SANDBOX_PORT = 18001
CORE = "/workspace/textstats/core.py"
BUGGY = (
    '    for token in text.split(" "):\n'
    "        token = token.strip(_PUNCTUATION).lower()\n"
    "        result.append(token)"
)
FIXED = (
    "    for token in text.split():\n"
    "        token = token.strip(_PUNCTUATION).lower()\n"
    "        if token:\n"
    "            result.append(token)"
)
RUN_TESTS = "python -m pytest -q -p no:cacheprovider tests"
PHASES = ("boot", "prepare", "install", "agent", "diff", "teardown", "grade", "finish")


def tool_call(name: str, **arguments: object) -> str:
    call = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{call}\n</tool_call>"


def solution() -> list[str]:
    """Read the file, fix it with Edit, run the tests with Bash, finish (as in the tests)."""
    return [
        "Let me look at how words are split.\n" + tool_call("Read", file_path=CORE),
        tool_call("Edit", replace_all=False, file_path=CORE, old_string=BUGGY, new_string=FIXED),
        tool_call("Bash", command=RUN_TESTS, description="Run the tests"),
        "The whitespace handling in `words` is fixed and the tests pass.",
    ]


# -- CPU accounting -----------------------------------------------------------------------------


class CpuMeter:
    """CPU seconds of this process, and of this process plus every descendant.

    The total comes from a cpuacct cgroup this process moves itself into (descendants
    inherit it: the local sandbox moves its processes only in the memory and pids
    hierarchies); without one, from ``getrusage`` (children counted once reaped).
    """

    def __init__(self) -> None:
        self.cgroup: pathlib.Path | None = None
        base = pathlib.Path("/sys/fs/cgroup/cpuacct")
        with contextlib.suppress(OSError):
            if (base / "cpuacct.usage").exists():
                group = base / f"agentrl-bench-{os.getpid()}"
                group.mkdir()
                (group / "cgroup.procs").write_text(str(os.getpid()))
                self.cgroup = group

    @property
    def source(self) -> str:
        return "cpuacct cgroup" if self.cgroup else "getrusage (children once reaped)"

    def read(self) -> tuple[float, float]:
        """(ours, everything) in CPU seconds."""
        me = resource.getrusage(resource.RUSAGE_SELF)
        ours = me.ru_utime + me.ru_stime
        if self.cgroup is not None:
            return ours, int((self.cgroup / "cpuacct.usage").read_text()) / 1e9
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return ours, ours + kids.ru_utime + kids.ru_stime

    def close(self) -> None:
        if self.cgroup is None:
            return
        with contextlib.suppress(OSError):
            pathlib.Path("/sys/fs/cgroup/cpuacct/cgroup.procs").write_text(str(os.getpid()))
            # Reaped processes leave the group; wait for the last sandbox's to go.
            for _ in range(50):
                with contextlib.suppress(OSError):
                    self.cgroup.rmdir()
                    break
                time.sleep(0.1)


#: The phase the current task is in (set by ``PhaseClock``'s timer): execs are counted by it.
CURRENT_PHASE: contextvars.ContextVar[str] = contextvars.ContextVar("phase", default="other")


class PhaseClock:
    """Wall and CPU time per phase, recorded by wrapping ``State.timed`` (the phases' own
    timer); CPU is attributed to a phase only when one rollout runs at a time. While
    ``probe`` is set (one rollout at a time), each phase's end counts the processes the
    rollout's sandboxes created in it (``Sandboxes.count_processes``)."""

    def __init__(self, meter: CpuMeter) -> None:
        self.meter = meter
        self.wall: dict[str, list[float]] = defaultdict(list)
        self.cpu: dict[str, list[tuple[float, float]]] = defaultdict(list)
        self.phase_started: dict[tuple[str, str], float] = {}
        self.probe: Sandboxes | None = None
        self.processes: dict[str, int] = defaultdict(int)
        self._original = phases_module.State.timed

    def install(self) -> None:
        clock = self

        @contextlib.contextmanager
        def timed(state: Any, phase: str) -> Iterator[None]:
            wall0, (ours0, all0) = time.monotonic(), clock.meter.read()
            clock.phase_started[(state.sid, phase)] = wall0
            token = CURRENT_PHASE.set(phase)
            try:
                with clock._original(state, phase):
                    yield
            finally:
                CURRENT_PHASE.reset(token)
            ours1, all1 = clock.meter.read()
            clock.wall[phase].append(time.monotonic() - wall0)
            clock.cpu[phase].append((ours1 - ours0, (all1 - all0) - (ours1 - ours0)))
            if clock.probe is not None:
                clock.probe.pending_probe.append((phase, len(clock.probe.built)))

        phases_module.State.timed = timed  # type: ignore[method-assign]

    def uninstall(self) -> None:
        phases_module.State.timed = self._original  # type: ignore[method-assign]


# -- the stack ----------------------------------------------------------------------------------


class NotPrewarmed(LocalSandbox):
    """The local sandbox with its grading sandbox booted after the agent (``--prewarm off``)."""

    prewarm_grading = False


class Polled(LocalSandbox):
    """The local sandbox as a backend that cannot wait: ``exec_and_wait`` launches the
    command detached and polls its marker (``--long poll``)."""

    async def run_long(self, request: Any, **kw: Any) -> None:
        return None


class PolledNotPrewarmed(Polled, NotPrewarmed):
    """Both of the above."""


class Sandboxes:
    """The rollouts' sandbox factory: records when each sandbox ran its first command, and
    counts execs (``run_exec``, and ``run_long`` where the backend waits) by phase.

    ``count_processes`` (one rollout at a time): the processes each sandbox created, read
    from its own pid namespace (pids are handed out one by one there): an ``echo $$``
    probe after each phase in which the sandbox ran something (and after its boot), and
    before it closes; each probe's own two processes (supervisor, shell) are not counted.
    """

    def __init__(self, options: dict[str, Any], *, prewarm: bool = True, wait: bool = True) -> None:
        self.options = options
        self.cls = {
            (True, True): LocalSandbox,
            (False, True): NotPrewarmed,
            (True, False): Polled,
            (False, False): PolledNotPrewarmed,
        }[prewarm, wait]
        self.first_exec: dict[int, float] = {}
        self.built: list[LocalSandbox] = []
        self.execs = 0
        self.by_phase: dict[str, int] = defaultdict(int)
        self.clock: PhaseClock | None = None
        #: Phases ended whose processes are not counted yet, each with how many sandboxes
        #: were built by its end (``PhaseClock`` adds them).
        self.pending_probe: list[tuple[str, int]] = []
        self._last_pid: dict[int, int] = {}
        self._dirty: set[int] = set()
        self._probes: dict[int, Any] = {}

    def __call__(self, task: Any) -> LocalSandbox:
        sandbox = self.cls.from_task(task, **self.options)
        self.built.append(sandbox)
        first = self.first_exec
        original = sandbox.run_exec
        original_long = getattr(sandbox, "run_long", None)
        original_close = sandbox.aclose
        self._probes[id(sandbox)] = original

        def count() -> None:
            first.setdefault(id(sandbox), time.monotonic())
            self.execs += 1
            self.by_phase[CURRENT_PHASE.get()] += 1
            self._dirty.add(id(sandbox))

        async def run_exec(request: Any) -> Any:
            await self._count_pending()
            count()
            return await original(request)

        async def run_long(request: Any, **kw: Any) -> Any:
            await self._count_pending()
            result = await original_long(request, **kw)  # type: ignore[misc]
            if result is not None:  # else exec_and_wait polls: those execs count themselves
                count()
            return result

        async def aclose() -> None:
            await self._count_pending()
            if self.clock is not None and self.clock.probe is self and id(sandbox) in self._dirty:
                await self._probe(sandbox, CURRENT_PHASE.get())
            await original_close()

        sandbox.run_exec = run_exec  # type: ignore[method-assign]
        if original_long is not None:
            sandbox.run_long = run_long  # type: ignore[method-assign]
        sandbox.aclose = aclose  # type: ignore[method-assign]
        return sandbox

    async def _count_pending(self) -> None:
        """Probe the live sandboxes for the phases that ended since the last call."""
        pending, self.pending_probe = self.pending_probe, []
        for phase, built in pending:
            for sandbox in self.built[:built]:
                started = sandbox.pid_namespace is not None and not sandbox._closed
                booted = phase == "boot" and id(sandbox) not in self._last_pid
                if started and (id(sandbox) in self._dirty or booted):
                    await self._probe(sandbox, phase)

    async def _probe(self, sandbox: LocalSandbox, phase: str) -> None:
        from agentrl.sandboxes.base import ExecRequest

        result = await self._probes[id(sandbox)](ExecRequest(cmd="echo $$", user="agent"))
        pid = int(result.stdout)
        assert self.clock is not None
        self.clock.processes[phase] += pid - self._last_pid.get(id(sandbox), 0) - 2
        self._last_pid[id(sandbox)] = pid
        self._dirty.discard(id(sandbox))


def textstats_task() -> Any:
    rows = load_tasks(REPO / "examples/tasks/scaleswe.jsonl", grader=ScaleSWEGrader())
    return next(row.task for row in rows if row.task.instance_id == "textstats-1")


async def exec_cost(meter: CpuMeter, runs: int = 30) -> dict[str, float]:
    """What one ``exec("true")`` costs: processes created (from the sandbox's pid
    namespace, whose pids are handed out one by one), wall and CPU milliseconds."""
    async with LocalSandbox() as sandbox:
        for _ in range(3):
            await sandbox.exec("true", user="agent")
        first = int((await sandbox.exec("echo $$", user="agent")).stdout)
        (ours0, all0), started = meter.read(), time.monotonic()
        for _ in range(runs):
            await sandbox.exec("true", user="agent")
        (ours1, all1), wall = meter.read(), time.monotonic() - started
        last = int((await sandbox.exec("echo $$", user="agent")).stdout)
    return {
        "forks": (last - first) / (runs + 1),
        "wall_ms": wall / runs * 1000,
        "ours_ms": (ours1 - ours0) / runs * 1000,
        "children_ms": ((all1 - all0) - (ours1 - ours0)) / runs * 1000,
    }


async def batch(
    concurrency: int,
    rollouts: int,
    *,
    middleware: Any,
    engine: Any,
    sandboxes: Sandboxes,
    harness: Any,
    task: Any,
    config: RolloutConfig,
    clock: PhaseClock,
) -> dict[str, Any]:
    gate = asyncio.Semaphore(concurrency)
    results: list[Any] = []
    grade_waits: list[float] = []
    agent_walls: list[tuple[float, float | None]] = []

    async def one() -> None:
        async with gate:
            sid = f"bench-{uuid.uuid4().hex[:12]}"
            for reply in solution():
                engine.queue(reply, session=sid)
            before = len(sandboxes.built)
            result = await run_rollout(
                task,
                harness=harness,
                grader=ScaleSWEGrader(),
                sandbox_factory=sandboxes,
                middleware=middleware,
                config=config,
                session_id=sid,
            )
            results.append(result)
            agent_walls.append((result.timings.get("agent", 0.0), cli_duration(result.agent_log)))
            grading = [s for s in sandboxes.built[before:] if id(s) in sandboxes.first_exec]
            started = clock.phase_started.get((sid, "grade"))
            if started is not None:
                firsts = [sandboxes.first_exec[id(s)] for s in grading]
                after = [t - started for t in firsts if t >= started]
                if after:
                    grade_waits.append(min(after))

    ours0, all0 = clock.meter.read()
    execs0 = sandboxes.execs
    clock.wall.clear(), clock.cpu.clear(), sandboxes.by_phase.clear()
    started = time.monotonic()
    await asyncio.gather(*(one() for _ in range(rollouts)))
    wall = time.monotonic() - started
    ours1, all1 = clock.meter.read()
    solved = sum(1 for r in results if r.outcome.value == "solved")
    if solved != rollouts:
        bad = next(r for r in results if r.outcome.value != "solved")
        raise SystemExit(f"a rollout did not solve the task: {bad.outcome} {bad.error}")
    return {
        "wall": wall,
        "per_min": rollouts / wall * 60,
        "ours": (ours1 - ours0) / rollouts,
        "all": (all1 - all0) / rollouts,
        "grade_wait": statistics.median(grade_waits) if grade_waits else float("nan"),
        "execs": (sandboxes.execs - execs0) / rollouts,
        "execs_by_phase": {k: v / rollouts for k, v in sandboxes.by_phase.items()},
        "agent_walls": sorted(agent_walls),
    }


def cli_duration(log: str) -> float | None:
    """Seconds of the CLI's own run (its stream-json result's ``duration_ms``)."""
    for line in reversed(log.splitlines()):
        if line.startswith("{") and '"type":"result"' in line:
            with contextlib.suppress(ValueError, TypeError, KeyError):
                return json.loads(line)["duration_ms"] / 1000
    return None


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="concurrency 1, 2 rollouts")
    parser.add_argument("--concurrency", default="1,4,8")
    parser.add_argument("--rollouts", type=int, default=0, help="per concurrency (default 2×)")
    parser.add_argument("--prewarm", choices=["on", "off"], default="on")
    parser.add_argument(
        "--long", choices=["wait", "poll"], default="wait", help="how exec_and_wait waits"
    )
    args = parser.parse_args()
    levels = [1] if args.quick else [int(c) for c in args.concurrency.split(",")]

    from transformers import AutoTokenizer

    from agentrl.engines.sglang import SGLangEngine
    from agentrl.testing.scripted_engine import ScriptedEngine
    from agentrl.testing.stack import started_middleware
    from agentrl.tokenizers import qwen_tokenizer_dir

    cli_dir = pathlib.Path(os.environ.get("AGENTRL_CLI_DIR", REPO / ".cache" / "clis"))
    if not (cli_dir / "bin" / "claude").exists():
        print(f"rollout benchmark SKIPPED: no Claude Code in {cli_dir} (agentrl install-clis)")
        return
    binds, cli_path = ClaudeCodeHarness.host_install(cli_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir()), local_files_only=True)
    task = textstats_task()
    meter = CpuMeter()
    clock = PhaseClock(meter)
    print("rollout benchmark: Claude Code + scripted engine + local sandbox, textstats task")
    print(f"  agentrl from {pathlib.Path(phases_module.__file__).parents[2]}")
    print(f"  prewarm {args.prewarm}, long commands: {args.long}, CPU from {meter.source}")
    cost = await exec_cost(meter)
    print(
        f"  exec('true'): {cost['forks']:.1f} processes (goal <= 2; "
        f"main: {MAIN_BASELINE['forks per exec']:.0f}), {cost['wall_ms']:.1f} ms wall, "
        f"CPU {cost['children_ms']:.1f} ms in the sandbox (main: "
        f"{MAIN_BASELINE['exec cpu ms']:.1f}) + {cost['ours_ms']:.1f} ms ours"
    )
    forks = f"{cost['forks']:.1f} (main {MAIN_BASELINE['forks per exec']:.0f})"
    print(goal_line("rollout: processes per exec('true')", forks, "<= 2", cost["forks"] <= 2))
    config = RolloutConfig(
        agent_time_budget=180,
        eval_timeout=120,
        middleware_port=SANDBOX_PORT,
    )
    harness = ClaudeCodeHarness(cli_path=cli_path, extra_args=(), extra_env={})
    try:
        async with ScriptedEngine(tokenizer) as scripted:
            engine = SGLangEngine(scripted.url)
            with tempfile.TemporaryDirectory(prefix="agentrl-bench-") as scratch:
                async with started_middleware(
                    engine, tokenizer, unix_path=f"{scratch}/mw.sock"
                ) as middleware:
                    sandboxes = Sandboxes(
                        {
                            "services": {SANDBOX_PORT: middleware.unix_path},
                            "ro_binds": binds,
                            "host_python": True,
                            "state_dir": pathlib.Path(scratch) / "sandboxes",
                        },
                        prewarm=args.prewarm == "on",
                        wait=args.long == "wait",
                    )
                    kw = dict(
                        middleware=middleware,
                        engine=scripted,
                        sandboxes=sandboxes,
                        harness=harness,
                        task=task,
                        config=config,
                        clock=clock,
                    )
                    clock.install()
                    # One rollout warms the page cache and counts each phase's processes.
                    clock.probe, sandboxes.clock = sandboxes, clock
                    warm = await batch(1, 1, **kw)
                    clock.probe = None
                    processes(warm, clock)
                    for level in levels:
                        n = args.rollouts or (2 if args.quick else 2 * level)
                        report(level, n, await batch(level, n, **kw), clock, cost)
                    clock.uninstall()
            await engine.aclose()
    finally:
        meter.close()


def processes(warm: dict[str, Any], clock: PhaseClock) -> None:
    """The processes and execs of one rollout, by phase (the warm-up rollout's)."""
    by_phase = warm["execs_by_phase"]
    total = sum(clock.processes.values())
    execs = sum(by_phase.values())
    print(
        f"  one rollout: {execs:.0f} execs, {total} processes created in its sandboxes "
        f"(pid namespaces; {total / max(execs, 1):.1f} a exec, the commands' own included)"
    )
    cells = [
        f"{phase} {by_phase.get(phase, 0):.0f}/{clock.processes.get(phase, 0)}"
        for phase in PHASES
        if by_phase.get(phase) or clock.processes.get(phase)
    ]
    print("    execs/processes by phase: " + ", ".join(cells))


def report(
    level: int, n: int, f: dict[str, Any], clock: PhaseClock, cost: dict[str, float]
) -> None:
    base = MAIN_BASELINE.get(f"rollouts/min at {level}")
    print(
        f"  concurrency {level}: {n} rollouts in {f['wall']:.1f}s = {f['per_min']:.1f} "
        f"rollouts/min" + (f" (main: {base:.0f})" if base else "") + f"; CPU s/rollout "
        f"{f['all']:.2f} (ours {f['ours']:.2f}); {f['execs']:.0f} execs/rollout; "
        f"grade start {f['grade_wait']:.3f}s (goal <= 0.1; main: "
        f"{MAIN_BASELINE['grade start s']:.2f})"
    )
    plumbing = f["execs"] * (cost["children_ms"] + cost["ours_ms"]) / 1000
    label = f"rollout c={level}:"
    print(
        goal_line(
            f"{label} grade start", f"{f['grade_wait']:.3f} s", "<= 0.1 s", f["grade_wait"] <= 0.1
        )
    )
    print(
        goal_line(
            f"{label} agentrl's process share of CPU",
            f"{f['ours'] / f['all']:.0%}",
            "<= 10%",
            f["ours"] / f["all"] <= 0.10,
        )
    )
    print(
        goal_line(
            f"{label} exec plumbing share of CPU",
            f"{plumbing / f['all']:.0%}",
            "<= 5%",
            plumbing / f["all"] <= 0.05,
        )
    )
    print(
        goal_line(
            f"{label} rollouts/min",
            f"{f['per_min']:.1f}",
            f"(main {base:.0f})" if base else "(none)",
            None,
        )
    )
    print(
        f"    agentrl's share of the CPU: its process {f['ours'] / f['all']:.0%} (goal <= 10%), "
        f"the sandbox's exec plumbing ~{plumbing / f['all']:.0%} (goal <= 5%)"
    )
    # CPU is a phase's own only when one rollout runs at a time.
    split = level == 1
    if split:
        walls = " ".join(
            f"{wall:.2f}" + (f" ({cli:.2f})" if cli is not None else "")
            for wall, cli in f["agent_walls"]
        )
        print(f"    agent phase wall s (the CLI's own duration_ms): {walls}")
    head = f"    {'phase':<9} {'wall s':>7} {'execs':>6}" + (
        f" {'ours cpu':>9} {'children cpu':>13}" if split else ""
    )
    print(head)
    for phase in PHASES:
        if phase not in clock.wall:
            continue
        execs = f["execs_by_phase"].get(phase, 0)
        line = f"    {phase:<9} {statistics.median(clock.wall[phase]):7.3f} {execs:6.1f}"
        if split:
            ours = statistics.median(c[0] for c in clock.cpu[phase])
            kids = statistics.median(c[1] for c in clock.cpu[phase])
            line += f" {ours:9.3f} {kids:13.3f}"
        print(line)


if __name__ == "__main__":
    asyncio.run(main())
