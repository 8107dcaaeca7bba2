"""E2B under a hostile network: lost create answers never leak a sandbox.

Against the E2B double (``agentrl.testing.e2b_server``) through the real e2b SDK. Each
test names the fault and the bound it asserts: how many sandboxes are alive afterwards,
how many were ever created, and a wall-clock bound on the whole scenario.
"""

from __future__ import annotations

import asyncio
import random
import socket

import pytest

from agentrl.retry import RetryPolicy
from agentrl.sandboxes.boot import Booter, BootError
from agentrl.sandboxes.e2b import E2BSandbox
from agentrl.testing.e2b_server import E2BServer
from agentrl.types import Task

API_KEY = "e2b_hostile_key"
#: Every scenario here finishes well within this many seconds.
BOUND_SEC = 20.0
TASK = Task(instance_id="t", problem_statement="", image="registry/task:1")


@pytest.fixture
async def server():
    async with E2BServer(api_key=API_KEY) as srv:
        yield srv


@pytest.fixture
def options(server):
    """Sandbox options aimed at the double, with tiny backoffs and no host environment."""
    return {
        "api_key": API_KEY,
        "api_url": server.url,
        "sandbox_url": server.url,
        "image_metadata_key": "image",
        "backoff_base_sec": 0.002,
        "backoff_cap_sec": 0.01,
        "rpc_retries": 2,
        "environ": {},
        "owner": "hostile-test",
        "run_id": "run-now",
    }


def _factory(options):
    return lambda task: E2BSandbox(task.image, rng=random.Random(3), **options)


def _booter() -> Booter:
    return Booter(policy=RetryPolicy(attempts=3, base=0.001, cap=0.001))


async def test_every_create_answer_lost_through_the_booter_leaks_nothing(server, options):
    """Attack: the network drops every create answer, for every re-send and every boot
    attempt. Bound: the boot fails with BootError, 0 sandboxes are alive afterwards, and at
    most one sandbox was created per boot attempt (the key dedups the re-sends)."""
    server.lose_creates()
    with pytest.raises(BootError, match="killed 1 sandbox"):
        await asyncio.wait_for(_booter().boot(_factory(options), TASK), BOUND_SEC)
    assert server.live_sandboxes() == []
    assert len(server.sandboxes) == 3
    assert len(server.calls_to("create")) == 9


async def test_a_burst_of_boots_under_lost_answers_holds_one_sandbox_each(server, options):
    """Attack: 8 concurrent boots while the first 8 create answers are lost. Bound: every
    boot ends with exactly one live sandbox of its own, no extra sandbox is alive, and after
    the close and the run's sweep nothing is alive."""
    server.lose_creates(times=8)
    booter = _booter()
    boots = [booter.boot(_factory(options), TASK) for _ in range(8)]
    sandboxes = await asyncio.wait_for(asyncio.gather(*boots), BOUND_SEC)
    live = {r.sandbox_id for r in server.live_sandboxes()}
    assert live == {s.sandbox_id for s in sandboxes} and len(live) == 8
    for sandbox in sandboxes:
        await sandbox.aclose()
    assert await E2BSandbox.sweep(**options) == []
    assert server.live_sandboxes() == []


async def test_lost_answers_and_a_broken_list_api_are_caught_by_the_close_sweep(server, options):
    """Attack: create answers are lost and the list API fails too, so the failed start
    cannot find its sandbox. Bound: start raises, and the run's sweep at close (once the
    API answers) leaves 0 sandboxes alive."""
    server.lose_creates()
    server.inject("list", "status", times=3, status=503)
    with pytest.raises(Exception, match="failed after 3 attempts"):
        await asyncio.wait_for(E2BSandbox("registry/task:1", **options).start(), BOUND_SEC)
    assert len(server.live_sandboxes()) == 1
    killed = await E2BSandbox.sweep(**options)
    assert len(killed) == 1 and server.live_sandboxes() == []


async def test_a_crashed_run_s_sandboxes_are_swept_on_restart_and_nothing_else(server, options):
    """Attack: a run crashes (its process is gone) leaving live sandboxes, next to a look-
    alike sandbox that only copies the run label and another deployment's sandbox. Bound:
    the restart with ``sweep_stale`` kills exactly the crashed run's sandboxes."""
    from e2b import AsyncSandbox

    params = {"api_key": API_KEY, "api_url": server.url, "sandbox_url": server.url, "retries": 0}
    dead = f"{socket.gethostname()}:999999999:1"
    crashed = [
        (
            await AsyncSandbox.create(
                metadata={
                    "agentrl-owner": "hostile-test",
                    "agentrl-run": "crashed",
                    "agentrl-process": dead,
                },
                **params,
            )
        ).sandbox_id
        for _ in range(3)
    ]
    look_alike = (
        await AsyncSandbox.create(metadata={"agentrl-run": "crashed"}, **params)
    ).sandbox_id
    other = (
        await AsyncSandbox.create(
            metadata={"agentrl-owner": "other", "agentrl-run": "x", "agentrl-process": dead},
            **params,
        )
    ).sandbox_id
    async with E2BSandbox("registry/task:1", sweep_stale=True, **options) as sandbox:
        live = {r.sandbox_id for r in server.live_sandboxes()}
        assert live == {look_alike, other, sandbox.sandbox_id}
    assert all(not server.sandboxes[i].alive for i in crashed)


@pytest.mark.parametrize("owner", ["team a&b=c", "100%/ü?#"])
async def test_owner_labels_with_url_syntax_are_listed_exactly(server, options, owner):
    """Attack: an owner label full of URL syntax (``&``, ``=``, ``%``, ``?``, ``#``,
    non-ASCII) could widen or break the metadata filter. Bound: the sweep kills exactly
    that owner's sandbox and not the one of a prefix-sharing owner."""
    mine = E2BSandbox("registry/task:1", **{**options, "owner": owner})
    near = E2BSandbox("registry/task:1", **{**options, "owner": owner[:4]})
    await mine.start()
    await near.start()
    assert await E2BSandbox.sweep(**{**options, "owner": owner}) == [mine.sandbox_id]
    assert [r.sandbox_id for r in server.live_sandboxes()] == [near.sandbox_id]
    await near.aclose()


async def test_a_huge_file_is_read_capped_never_whole(server, options):
    """Attack: the agent leaves a file far larger than read_file's cap (its log, say).
    Bound: text comes back as head + marker (counting exactly what was dropped) + tail
    within the cap, read through the SDK's stream and stopped at the cap; bytes raise
    naming the cap."""
    sandbox = E2BSandbox(TASK.image, rng=random.Random(3), **options)
    async with sandbox:
        sandbox.read_file_max_bytes = 4096
        body = b"H" * 3000 + b"M" * 200_000 + b"T" * 3000
        await sandbox.write_file("/tmp/huge.log", body)
        text = await sandbox.read_file("/tmp/huge.log")
        with pytest.raises(Exception, match="larger than read_file's cap of 4096 bytes"):
            await sandbox.read_file("/tmp/huge.log", text=False)
    head, marker, tail = text.partition("\n[agentrl: ")
    assert head == "H" * 2048
    assert marker and tail.endswith("T" * 2048) and "bytes of output truncated]" in tail
    dropped = int(tail.split(" bytes", 1)[0])
    assert dropped == len(body) - 2048 - 2048
