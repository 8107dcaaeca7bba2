"""`agentrl rollout --ray` on a real 2-node Ray cluster on this machine.

The cluster is two ``ray start --block`` processes (a head with the ``agentrl_head``
resource, a second node with ``agentrl_node2``), started once for the module and stopped
by the process groups started here. The drivers are the real CLI; the policy is the
scripted SGLang engine in this process, which every node reaches by URL; the sandboxes
are real ``local`` ones running the real Claude Code CLI. The node-kill test runs last:
it takes the second node away.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

import pytest
from ray_support import (
    SessionScript,
    layout,
    rollout_args,
    rows,
    run,
    sandbox_processes,
    start,
    start_local_cluster,
)
from rollout_support import example_task_file

from agentrl.testing.ray_cluster import free_port

pytestmark = pytest.mark.slow

SAMPLES = 3
#: Two rollouts at once on each node: all three in flight, on both nodes.
PER_NODE = ("--concurrency-per-node", "2")
#: What a Ray row says beyond a local one.
RAY_KEYS = {"node_id", "node_ip", "rescheduled"}


async def test_an_address_without_a_cluster_is_one_line_and_ray_loads_only_on_use(
    tmp_path, qwen_tokenizer_dir, scripted_engine
):
    """``--ray HOST:PORT`` where nothing listens (the engine answers, so its check passes):
    exit 1 within seconds naming the address, no traceback; importing the Ray runner does
    not import ``ray``."""
    port = free_port()
    args = rollout_args(
        example_task_file(tmp_path),
        tmp_path / "out",
        scripted_engine.url,
        qwen_tokenizer_dir,
        tmp_path / "sb",
        "--ray",
        f"127.0.0.1:{port}",
    )
    code, _, err = await run(args, tmp_path, timeout=60)
    assert code == 1, err[-3000:]
    assert f"--ray 127.0.0.1:{port}: no Ray cluster answers there" in err
    assert "Traceback" not in err
    probe = "import sys, agentrl.rollout.cluster, agentrl.cli.rollout; print('ray' in sys.modules)"
    code, out, err = await run([sys.executable, "-c", probe], tmp_path, timeout=60)
    assert (code, out.strip()) == (0, "False"), err[-2000:]


@pytest.fixture(scope="module")
def ray_cluster():
    """A head and a second node, up for the whole module; nothing of them left after."""
    cluster = start_local_cluster("node2")
    cluster.names = cluster.node_ids()
    try:
        yield cluster
        assert cluster.alive_actors() == [], "Ray still counts actors of the tests alive"
    finally:
        cluster.stop()
        assert cluster.processes() == [], "raylet/gcs processes of the test cluster remain"


@pytest.fixture
def engine(scripted_engine):
    """The scripted engine, every session playing the textstats solution."""
    scripted_engine.responder = SessionScript()
    return scripted_engine


def _args(tmp_path, out, engine, tokenizer, *extra):
    return rollout_args(
        example_task_file(tmp_path),
        out,
        engine.url,
        tokenizer,
        tmp_path / "sb",
        "-n",
        str(SAMPLES),
        *extra,
    )


async def _assert_nothing_left(ray_cluster, tmp_path):
    """No node actor process (Ray's own view is asked once, at the module's end) and no
    sandbox outlived the driver."""
    for _ in range(100):  # Ray ends a dead driver's actors within moments
        if not ray_cluster.actor_pids():
            break
        await asyncio.sleep(0.1)
    assert ray_cluster.actor_pids() == [], "node actors outlived the driver"
    assert sandbox_processes(tmp_path / "sb") == [], "sandboxes outlived the driver"


async def test_a_ray_run_spreads_over_both_nodes_and_writes_what_a_local_run_does(
    ray_cluster, engine, tmp_path, qwen_tokenizer_dir
):
    """Three rollouts, two slots a node: both nodes run some (their node ids in the rows);
    the output directory has the same files, keys, outcomes and sample rows as a local run
    of the same command (the session files with their turn facts too); no actor and no sandbox is left."""
    local, remote = tmp_path / "local", tmp_path / "ray"
    code, _, err = await run(
        _args(tmp_path, local, engine, qwen_tokenizer_dir, "-c", "2"), tmp_path
    )
    assert code == 0, err[-3000:]
    code, stdout, err = await run(
        _args(
            tmp_path, remote, engine, qwen_tokenizer_dir, "--ray", ray_cluster.address, *PER_NODE
        ),
        tmp_path,
    )
    assert code == 0, err[-3000:]
    assert "solve rate" in stdout and "100.0%" in stdout

    here, there = rows(local / "rollouts.jsonl"), rows(remote / "rollouts.jsonl")
    assert sorted((r["key"], r["outcome"]) for r in there) == sorted(
        (r["key"], r["outcome"]) for r in here
    )
    assert {r["outcome"] for r in there} == {"solved"} and len(there) == SAMPLES
    assert {frozenset(r) - RAY_KEYS for r in there} == {frozenset(r) for r in here}
    assert {r["node_id"] for r in there} == set(ray_cluster.names.values())
    assert all(r["rescheduled"] == [] for r in there)
    assert layout(remote) == layout(local)
    # The node's turn facts come back with the result: sessions/ (agentrl view) matches.
    for path in (local / "sessions").iterdir():
        facts_here = json.loads(path.read_text())["turns"]
        facts_there = json.loads((remote / "sessions" / path.name).read_text())["turns"]
        assert facts_here and len(facts_there) == len(facts_here)
    assert json.loads((remote / "summary.json").read_text())["tokenizer"]
    samples_here, samples_there = rows(local / "samples.jsonl"), rows(remote / "samples.jsonl")
    assert sorted(s["key"] for s in samples_there) == sorted(s["key"] for s in samples_here)
    assert {len(s["tokens"]) for s in samples_there} == {len(s["tokens"]) for s in samples_here}
    await _assert_nothing_left(ray_cluster, tmp_path)


async def test_a_killed_driver_resumes_redoing_only_what_was_not_committed(
    ray_cluster, scripted_engine, tmp_path, qwen_tokenizer_dir
):
    """SIGKILL the driver once two rollouts committed (the third held at its first turn):
    its actors go with it; the re-run redoes only the uncommitted rollout and keeps the
    committed lines as they were."""
    held = {2}
    script = scripted_engine.responder = SessionScript(
        lambda index, first: 20.0 if index in held and first else 0.0
    )
    out = tmp_path / "out"
    args = _args(
        tmp_path, out, scripted_engine, qwen_tokenizer_dir, "--ray", ray_cluster.address, *PER_NODE
    )
    proc = await start(args, tmp_path)
    try:
        for _ in range(1200):
            if len(rows(out / "rollouts.jsonl")) >= 2 and len(set(script.indexes())) == SAMPLES:
                break
            assert proc.returncode is None, (await proc.stderr.read()).decode()[-3000:]
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("two rollouts did not commit")
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    committed = rows(out / "rollouts.jsonl")
    assert sorted(r["sample_index"] for r in committed) == [0, 1]

    before = len(script.sessions)
    code, stdout, err = await run(args, tmp_path)
    assert code == 0, err[-3000:]
    assert "already done (resumed)" in stdout
    assert sorted(script.indexes()[before:]) == sorted(held), "a committed rollout was redone"
    final = rows(out / "rollouts.jsonl")
    assert sorted(r["key"] for r in final) == [f"textstats-1#{i}" for i in range(SAMPLES)]
    assert final[:2] == committed and {r["outcome"] for r in final} == {"solved"}
    assert len(rows(out / "samples.jsonl")) == SAMPLES
    await _assert_nothing_left(ray_cluster, tmp_path)


async def test_ctrl_c_cancels_every_rollout_and_leaves_nothing_behind(
    ray_cluster, scripted_engine, tmp_path, qwen_tokenizer_dir
):
    """SIGINT while every rollout waits on the engine: exit 130 with the resume hint, the
    generations aborted (sessions dropped), nothing committed, no actor and no sandbox."""
    script = scripted_engine.responder = SessionScript(lambda index, first: 60.0)
    out = tmp_path / "out"
    args = _args(
        tmp_path, out, scripted_engine, qwen_tokenizer_dir, "--ray", ray_cluster.address, *PER_NODE
    )
    proc = await start(args, tmp_path)
    try:
        await scripted_engine.wait_for(lambda: len(script.sessions) >= SAMPLES, 180)
        proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), 90)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    stderr = err.decode()
    assert proc.returncode == 130, stderr[-3000:]
    assert "re-run the same command to resume" in stderr and "Traceback" not in stderr
    await scripted_engine.wait_for(lambda: len(scripted_engine.abort_requests) >= SAMPLES, 30)
    assert rows(out / "rollouts.jsonl") == []
    await _assert_nothing_left(ray_cluster, tmp_path)


async def test_a_dead_node_and_a_dead_actor_lose_no_rollout(
    ray_cluster, scripted_engine, tmp_path, qwen_tokenizer_dir
):
    """SIGKILL node2 and the head's actor process while every rollout waits on its first
    turn: Ray restarts the head's actor; every rollout is sent once more, to the head (the
    only node left), and records where it was lost; one line per key in rollouts.jsonl,
    all solved; nothing is left running. (Runs last: node2 stays dead.)"""
    script = scripted_engine.responder = SessionScript(lambda index, first: 5.0 if first else 0.0)
    out = tmp_path / "out"
    # Three slots a node: the head runs all three again at once.
    per_node = ("--concurrency-per-node", "3")
    args = _args(tmp_path, out, scripted_engine, qwen_tokenizer_dir, "--ray", "auto", *per_node)
    os.environ["RAY_ADDRESS"] = ray_cluster.address  # --ray auto finds the cluster by it
    try:
        proc = await start(args, tmp_path)
    finally:
        del os.environ["RAY_ADDRESS"]
    head, node2 = ray_cluster.names["head"], ray_cluster.names["node2"]
    try:
        await scripted_engine.wait_for(lambda: len(script.sessions) >= SAMPLES, 180)
        (actor,) = ray_cluster.actor_pids("head")
        os.kill(actor, signal.SIGKILL)
        ray_cluster.kill_node("node2")
        _, err_text = await asyncio.wait_for(proc.communicate(), 240)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err_text.decode()[-3000:]
    final = rows(out / "rollouts.jsonl")
    assert sorted(r["key"] for r in final) == [f"textstats-1#{i}" for i in range(SAMPLES)]
    assert {r["outcome"] for r in final} == {"solved"}
    assert {r["node_id"] for r in final} == {head}, final
    lost_on = sorted(lost["node_id"] for r in final for lost in r["rescheduled"])
    assert all(len(r["rescheduled"]) == 1 for r in final), final
    assert set(lost_on) == {head, node2}, final
    assert len(rows(out / "samples.jsonl")) == SAMPLES
    await _assert_nothing_left(ray_cluster, tmp_path)
