"""A bounded soak: mixed rollouts, hostile policies and injected faults at once.

Eleven rollouts of the textstats task run four at a time through one middleware: the real
Claude Code CLI in real local sandboxes, the scripted SGLang engine as the policy (its
replies are what a Qwen3 policy would sample, in the ``hermes`` format). Some solve the
task, some attack (kill every process, remove ``.git``, race the control area with symlinks
to a host canary, flood their output, fill ``/dev/shm``, send the middleware a
10,000-deep body and a 30 MB count_tokens with their own token), and some meet a fault the policy
did not cause (the engine failing a turn, a sandbox that cannot boot). Each rollout must end
in its own outcome class, and afterwards the host is back where it started: no descriptor,
process, session, state directory, staging directory or cgroup left, the canary untouched,
resident memory within a stated bound.
"""

from __future__ import annotations

import asyncio
import gc
import os
import pathlib
import re
import time

import pytest
from rollout_support import CLI_DIR, SANDBOX_PORT, claude_solution, textstats_task, tool_call

from agentrl.graders.scaleswe import ScaleSWEGrader
from agentrl.harnesses.claude_code import ClaudeCodeHarness
from agentrl.rollout import RolloutConfig, run_rollout
from agentrl.sandboxes.local import LocalSandbox, launcher, processes_in_namespace
from agentrl.sandboxes.local.proc import STATE_PREFIX
from agentrl.types import Outcome

pytestmark = pytest.mark.slow

#: Resident memory the process may keep after the soak, over its level after a warm-up.
RSS_BOUND_MB = 120
#: The whole soak, warm-up included, must end within this.
SOAK_BOUND_S = 170


def _bash(command: str) -> str:
    return tool_call("Bash", command=command, description="Run a command")


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _children() -> list[int]:
    """Live processes whose parent is this one (a leaked CLI, socat or launcher)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] not in ("Z", "X"):
            found.append(int(entry))
    return found


def _race_control_area(canary: pathlib.Path) -> str:
    """A background loop replacing every file it can reach under /.agentrl with symlinks to
    the host canary's path (and to /etc/shadow), while the CLI goes on."""
    return (
        "(for i in $(seq 400); do for f in /.agentrl/out/* /.agentrl/ctl/req/*/*; do "
        f'ln -sfn {canary} "$f" 2>/dev/null; ln -sfn /etc/shadow "$f" 2>/dev/null; done; '
        "sleep 0.01; done) > /dev/null 2>&1 & echo racing"
    )


#: From inside, with the session's own token: a 10,000-deep JSON body and a 30 MB
#: count_tokens at the middleware (each answered with a 4xx, neither stalls the others).
_HIT_MIDDLEWARE = (
    'python3 -c "import os, urllib.request as u, urllib.error as e\n'
    "url = os.environ['ANTHROPIC_BASE_URL']\n"
    "hdr = {'Authorization': 'Bearer ' + os.environ['ANTHROPIC_AUTH_TOKEN'],"
    " 'content-type': 'application/json'}\n"
    "for path, body in (('/v1/messages', b'[' * 10000 + b']' * 10000),"
    " ('/v1/messages/count_tokens', b'{\\\"messages\\\": \\\"' + b'x' * 30000000 + b'\\\"}')):\n"
    "    try: print(u.urlopen(u.Request(url + path, body, hdr), timeout=30).status)\n"
    "    except e.HTTPError as err: print(err.code)\n"
    "    except e.URLError as err: print(type(err.reason).__name__)\n"
    '    except Exception as err: print(type(err).__name__)"'
)

SCRIPTS = {
    # name -> (the policy's replies, the outcome, whether it trains)
    "solve-1": (claude_solution(), Outcome.SOLVED),
    "solve-2": (claude_solution(), Outcome.SOLVED),
    "kill-all": ([_bash("kill -9 -1"), "Done."], Outcome.AGENT_ERROR),
    # The diff is taken from the private baseline: still there, empty.
    "remove-git": ([_bash("rm -rf /workspace/.git"), "Done."], Outcome.UNSOLVED),
    "flood-output": ([_bash("yes | head -c 30000000; echo"), "Done."], Outcome.UNSOLVED),
    "hit-middleware": ([_bash(_HIT_MIDDLEWARE), "Done."], Outcome.UNSOLVED),
    "fill-shm": (
        [_bash("head -c 100000000 /dev/zero > /dev/shm/x; df /dev/shm"), "Done."],
        Outcome.UNSOLVED,
    ),
}


async def test_soak_mixed_hostile_rollouts_end_in_their_class_and_leave_nothing(
    tmp_path, agentrl_middleware, agentrl_scripted_engine
):
    """Eleven rollouts (two solving, six hostile, two infra faults, one warm-up) four at a
    time. Bound: each ends in its outcome class (trainable for the policy's doings,
    infra_error with remove_sample for faults it did not cause); afterwards descriptors
    are within 8 of the warm-up level, no child process, session, state directory, staging
    directory or cgroup is left, the canary is unchanged, RSS grows by under
    ``RSS_BOUND_MB`` and the whole soak takes under ``SOAK_BOUND_S`` s."""
    started = time.monotonic()
    middleware, engine = agentrl_middleware, agentrl_scripted_engine
    if not (CLI_DIR / "bin" / "claude").exists():
        pytest.fail(f"the agent CLIs are not installed in {CLI_DIR}; run agentrl install-clis")
    task = textstats_task()
    canary = tmp_path / "canary"
    canary.write_text("host canary\n")
    state_dir = tmp_path / "state"
    binds, cli_path = ClaudeCodeHarness.host_install(CLI_DIR)
    options = {
        "services": {SANDBOX_PORT: middleware.unix_path},
        "ro_binds": binds,
        "host_python": True,
        "state_dir": state_dir,
        "shm_size_mb": 16,
    }
    built: list[LocalSandbox] = []

    def factory(task, **extra):
        built.append(LocalSandbox.from_task(task, **{**options, **extra}))
        return built[-1]

    harness = ClaudeCodeHarness(
        cli_path=cli_path, extra_args=(), extra_env={"CLAUDE_CODE_MAX_RETRIES": "0"}
    )
    config = RolloutConfig(
        agent_time_budget=40, eval_timeout=60, middleware_port=SANDBOX_PORT, boot_backoff=0.01
    )
    semaphore = asyncio.Semaphore(4)

    async def one(name: str, replies=(), *, fault: str | None = None, boot_fails=False):
        sid = f"soak-{name}"
        if fault == "engine":
            engine.queue(_bash("echo first"), session=sid)
            engine.fail_next(500, "CUDA error: an illegal memory access", session=sid)
        for reply in replies:
            engine.queue(reply, session=sid)
        make = (lambda t: factory(t, bwrap="/nonexistent/bwrap")) if boot_fails else factory
        async with semaphore:
            return name, await run_rollout(
                task,
                harness=harness,
                grader=ScaleSWEGrader(),
                sandbox_factory=make,
                middleware=middleware,
                config=config,
                session_id=sid,
            )

    # Children that were there before the soak (a session-wide daemon another test started).
    children_before = set(_children())
    # Warm-up: the first rollout loads the tokenizer's caches, the CLI's pages and so on.
    _, warm = await one("warm-up", claude_solution())
    assert warm.outcome is Outcome.SOLVED, warm.error
    gc.collect()
    fds, rss = _fds(), _rss_mb()

    jobs = [one(name, replies) for name, (replies, _) in SCRIPTS.items()]
    jobs += [
        one("race-ctl", [_bash(_race_control_area(canary)), _bash("sleep 2; echo ok"), "Done."]),
        one("engine-fault", fault="engine"),
        one("boot-fault", boot_fails=True),
    ]
    results = dict(await asyncio.gather(*jobs))

    expected = {name: outcome for name, (_, outcome) in SCRIPTS.items()}
    for name, outcome in expected.items():
        result = results[name]
        assert result.outcome is outcome, (name, result.error, result.agent_log[-800:])
        assert result.remove_sample is not outcome.trainable, name
    assert results["race-ctl"].outcome.trainable, results["race-ctl"].error
    # The middleware answered the deep body with 400 and refused the oversized count from
    # its headers: a 413, or, since urllib writes the whole body before reading and the
    # middleware ends a connection whose body it refused unread, a reset mid-body.
    # The tool result, as the agent's JSON log holds it: the two answers on two lines.
    hit = results["hit-middleware"].agent_log
    answers = r"400\\n(413|ConnectionResetError|BrokenPipeError)\b"
    assert re.search(answers, hit), hit[-1500:]
    for name in ("engine-fault", "boot-fault"):
        assert results[name].outcome is Outcome.INFRA_ERROR, (name, results[name].error)
        assert results[name].remove_sample, name
    assert all(results[n].reward == 1.0 for n in ("solve-1", "solve-2"))
    assert canary.read_text() == "host canary\n"
    for name, result in results.items():
        assert "host canary" not in result.agent_log + result.diff, name

    # Back to baseline.
    gc.collect()
    await asyncio.sleep(0.5)
    assert len(middleware._sessions) == 0
    assert set(_children()) - children_before == set()
    for sandbox in built:
        assert sandbox._closed or sandbox.state is None  # never started (the boot fault)
        if sandbox.pid_namespace is not None:
            # Killed with the namespace's init; on a busy machine the last ones may still be
            # exiting, so they are counted until gone (10 s): a leak outlives that.
            for _ in range(100):
                if not processes_in_namespace(sandbox.pid_namespace):
                    break
                await asyncio.sleep(0.1)
            assert processes_in_namespace(sandbox.pid_namespace) == []
        if sandbox.limits is not None:
            assert not sandbox.limits.dirs
            for parent in sandbox.limits.parents:
                assert not list(parent.glob(f"{STATE_PREFIX}{os.getpid()}-*"))
    assert not list(state_dir.glob(f"{STATE_PREFIX}*"))
    if os.geteuid() == 0:
        assert not list(launcher.stage_base().glob(f"{STATE_PREFIX}{os.getpid()}-*"))
    assert _fds() <= fds + 8
    assert _rss_mb() - rss < RSS_BOUND_MB
    assert time.monotonic() - started < SOAK_BOUND_S
