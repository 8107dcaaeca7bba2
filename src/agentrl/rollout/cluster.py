"""The driver side of ``agentrl rollout --ray``: rollouts spread over a Ray cluster's nodes.

::

    async with RayCluster(options, address="auto", slots_per_node=4) as cluster:
        runner = Runner(cluster.rollout, out, concurrency=cluster.slots, decode=cluster.decode)
        await runner.run(runner.plan(tasks, samples_per_task))

On entering, it connects to the cluster (``ray.init(address)``) and places one
:class:`~agentrl.rollout.ray_node.NodeRollouts` actor on every alive node (hard node
affinity, no CPU reserved), each owning that node's stack: middleware, engine client,
sandboxes and the boot limit. A node runs ``agentrl_slots`` rollouts at once when it
advertises that custom resource, else ``slots_per_node``. ``rollout(task, index)`` sends a
rollout to the least busy node with a free slot and returns its ``NodeResult``, which the
caller (the runner) commits: the driver is the only writer.

Faults: a dispatch lost to a dead node or a dead actor (Ray restarts an actor up to
``max_restarts`` times on its node) is sent once more, to another node where there is one;
the result then says ``rescheduled``. A rollout lost twice raises, and the runner commits
it as an ``infra_error``: never twice. Leaving (also on Ctrl-C) cancels what is in flight,
closes every node's stack (sandboxes swept, sessions dropped) and kills the actors.

Leaks: each actor says on start how its sandboxes are removed from elsewhere (its
``sweep`` keywords: for ``docker``, its daemon and the labels of its run and process).
When a node is gone, or its actor comes back as a new process, the driver removes the
lost actor's sandboxes at once through the backend's ``sweep`` (a ``docker`` daemon on
another host's unix socket is out of reach: that host's next start removes them).

``ray`` is imported only here, when a cluster is entered (the ``agentrl[ray]`` extra).
"""

from __future__ import annotations

import asyncio
import logging
import pathlib
import socket
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import attrs

from agentrl import plugins
from agentrl.extras import install_hint
from agentrl.rollout.ray_node import NodeResult, NodeRollouts
from agentrl.rollout.runner import RolloutJob, Runner, RunSummary
from agentrl.rollout.stack import StackError, StackOptions
from agentrl.types import Task

__all__ = ["RayCluster", "RolloutLost", "run_on_cluster"]

logger = logging.getLogger(__name__)

#: The custom resource a node may advertise to say how many rollouts it runs at once.
SLOTS_RESOURCE = "agentrl_slots"
#: The Ray namespace of the node actors (named ``rollouts-RUN-NODE``).
ACTOR_NAMESPACE = "agentrl"
#: Seconds a restarted actor has to answer before its node counts as gone.
RECOVER_TIMEOUT = 180.0
#: Sends of one rollout that may find its actor restarting, before it counts as lost.
MAX_UNDELIVERED = 20
#: Seconds each node has to close its stack when the run ends.
CLOSE_TIMEOUT = 60.0


class RolloutLost(RuntimeError):
    """A rollout was lost with its node or actor on both dispatches."""


@attrs.define(eq=False)
class _Node:
    node_id: str
    ip: str
    slots: int
    actor: Any = None
    running: int = 0
    alive: bool = True
    #: While its actor restarts after a lost dispatch: nothing is sent there.
    recovering: asyncio.Future[None] | None = None
    #: The sandbox backend's ``sweep`` keywords that remove its actor's sandboxes.
    sweep: dict[str, Any] | None = None


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """Raise ``StackError`` when nothing listens at a ``HOST:PORT`` address (``ray.init``
    would retry for minutes); other addresses (``auto``, ``ray://…``) are Ray's to judge."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "/" in host:
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as exc:
        raise StackError(f"--ray {address}: no Ray cluster answers there ({exc})") from None


def portable_options(options: StackOptions) -> StackOptions:
    """``options`` with this machine's relative paths made absolute (nodes resolve them
    in their own working directory)."""
    changes: dict[str, Any] = {}
    for name in ("tokenizer", "model_path", "cli_dir"):
        value = getattr(options, name)
        if value and pathlib.Path(value).exists():
            changes[name] = str(pathlib.Path(value).resolve())
    return attrs.evolve(options, **changes)


class RayCluster:
    """Node actors on a Ray cluster and the dispatch of rollouts to them."""

    def __init__(
        self,
        options: StackOptions,
        *,
        address: str = "auto",
        slots_per_node: int = 2,
        max_restarts: int = 3,
    ) -> None:
        if slots_per_node < 1:
            raise ValueError(f"slots_per_node must be >= 1, got {slots_per_node}")
        self.options = portable_options(options)
        self.address = address
        self.slots_per_node = slots_per_node
        self.max_restarts = max_restarts
        self.nodes: list[_Node] = []
        self._ray: Any = None
        self._connected = False
        self._tokenizer: Any = None
        self._free: asyncio.Condition | None = None
        self._in_flight: set[Any] = set()
        self._sweeps: set[asyncio.Task[None]] = set()
        self._run_id = uuid.uuid4().hex[:8]

    @property
    def slots(self) -> int:
        """Rollouts the alive nodes run at once, together."""
        return sum(node.slots for node in self.nodes if node.alive)

    # -- lifecycle ---------------------------------------------------------
    async def __aenter__(self) -> RayCluster:
        try:
            await self._start()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _start(self) -> None:
        from agentrl.tokenizers import load_tokenizer

        try:
            import ray
        except ImportError:
            raise StackError(f"--ray needs Ray: {install_hint('ray')}") from None
        self._ray = ray
        self._free = asyncio.Condition()
        await asyncio.to_thread(check_reachable, self.address)
        try:
            # Workers' output stays in the cluster's logs: the driver's terminal shows progress.
            ray.init(address=self.address, log_to_driver=False, logging_level=logging.WARNING)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise StackError(
                f"--ray {self.address}: cannot connect to a Ray cluster: {exc}"
            ) from None
        self._connected = True
        self.nodes = [
            _Node(
                node_id=info["NodeID"],
                ip=info.get("NodeManagerAddress", ""),
                slots=int(info.get("Resources", {}).get(SLOTS_RESOURCE, 0)) or self.slots_per_node,
            )
            for info in ray.nodes()
            if info.get("Alive")
        ]
        if not self.nodes:
            raise StackError(f"--ray {self.address}: the cluster has no alive node")
        for node in self.nodes:
            node.actor = self._actor(node)
        # The driver's tokenizer (to decode sample rows) loads while the nodes start.
        tokenizer = asyncio.to_thread(
            load_tokenizer, self.options.tokenizer or self.options.model_path
        )
        *started, self._tokenizer = await asyncio.gather(
            *(node.actor.start.remote() for node in self.nodes), tokenizer
        )
        for node, info in zip(self.nodes, started, strict=True):
            if "error" in info:
                raise StackError(f"node {node.ip} ({node.node_id[:12]}): {info['error']}")
            node.sweep = info.get("sweep")
        logger.info(
            "ray: %d nodes, %d rollout slots: %s",
            len(self.nodes),
            self.slots,
            ", ".join(f"{n.ip}/{n.node_id[:8]}×{n.slots}" for n in self.nodes),
        )

    def _actor(self, node: _Node) -> Any:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        remote = self._ray.remote(NodeRollouts)
        return remote.options(
            # Named, so an operator (or a test) can find this run's actors.
            name=f"rollouts-{self._run_id}-{node.node_id[:16]}",
            namespace=ACTOR_NAMESPACE,
            num_cpus=0,
            max_restarts=self.max_restarts,
            max_task_retries=0,  # a lost rollout is re-sent by the driver, to another node
            max_concurrency=node.slots + 8,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node.node_id, soft=False),
        ).remote(self.options, slots=node.slots, node_id=node.node_id, node_ip=node.ip)

    async def aclose(self) -> None:
        """Cancel what is in flight, close every node's stack, kill the actors, disconnect."""
        ray = self._ray
        if ray is None:
            return
        for ref in list(self._in_flight):
            ray.cancel(ref)
        for node in self.nodes:
            if node.recovering is not None:
                node.recovering.cancel()
        actors = [node.actor for node in self.nodes if node.actor is not None]
        closing = [actor.close.remote() for actor in actors]
        if closing:
            done, _ = await asyncio.wait(
                [asyncio.ensure_future(_as_future(ref)) for ref in closing],
                timeout=CLOSE_TIMEOUT,
            )
            for future in done:
                if future.exception() is not None:
                    logger.debug("a node's stack did not close cleanly: %s", future.exception())
        for actor in actors:
            ray.kill(actor, no_restart=True)
        if self._sweeps:
            await asyncio.wait(set(self._sweeps), timeout=CLOSE_TIMEOUT)
        for node in self.nodes:
            node.actor = None
        if self._connected:
            ray.shutdown()
            self._connected = False
        self._ray = None

    # -- the work ----------------------------------------------------------
    async def check_tasks(self, tasks: Iterable[Task]) -> None:
        """``Stack.check_tasks`` on one node (they share the options): ``StackError``."""
        node = next(node for node in self.nodes if node.alive)
        error = await node.actor.check_tasks.remote(list(tasks))
        if error:
            raise StackError(error)

    def decode(self, ids: Iterable[int]) -> str:
        """The text of token ``ids``, special tokens kept (the runner's sample rows)."""
        return self._tokenizer.decode(list(ids), skip_special_tokens=False)

    async def rollout(self, task: Task, index: int) -> NodeResult:
        """Run one rollout on a node; sent once more, elsewhere, if its node or actor is lost."""
        lost: list[dict[str, str]] = []
        undelivered = 0
        while len(lost) < 2 and undelivered < MAX_UNDELIVERED:
            node = await self._acquire(avoid={entry["node_id"] for entry in lost})
            try:
                result = await self._dispatch(node, task, index)
            except _Lost as exc:
                # The one reschedule sent to a node that was already gone (found out only
                # now) ran nowhere: it is sent again, not counted as a second loss.
                if exc.delivered and not (exc.gone and lost):
                    lost.append({"node_id": node.node_id, "error": exc.reason})
                else:
                    undelivered += 1  # it never ran: sending it again is no reschedule
                    await asyncio.sleep(min(0.25 * undelivered, 2.0))
                await self._judge(node, gone=exc.gone)
                continue
            finally:
                await self._release(node)
            return attrs.evolve(result, rescheduled=tuple(lost)) if lost else result
        raise RolloutLost(
            f"rollout {task.instance_id}#{index} was lost {len(lost)} times: "
            + "; ".join(f"{entry['node_id'][:12]}: {entry['error']}" for entry in lost)
        )

    async def _dispatch(self, node: _Node, task: Task, index: int) -> NodeResult:
        ray = self._ray
        exceptions = ray.exceptions
        lost_errors = (
            exceptions.RayActorError,  # the actor died (Ray restarts it) or is unreachable
            exceptions.ActorUnschedulableError,  # its node is gone: it cannot come back
            exceptions.NodeDiedError,
            exceptions.WorkerCrashedError,
            exceptions.ObjectLostError,  # the result died with the node before it came here
        )
        ref = node.actor.rollout.remote(task, index)
        self._in_flight.add(ref)
        try:
            return await ref
        except asyncio.CancelledError:
            ray.cancel(ref)
            raise
        except lost_errors as exc:
            reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            logger.warning(
                "rollout %s#%d lost on node %s: %s", task.instance_id, index, node.ip, reason
            )
            # Ray says so when it did not send the call: the actor was restarting.
            delivered = not (
                isinstance(exc, exceptions.ActorUnavailableError) and "restarting" in str(exc)
            )
            gone = isinstance(exc, exceptions.ActorUnschedulableError)
            raise _Lost(reason, gone=gone, delivered=delivered) from exc
        finally:
            self._in_flight.discard(ref)

    async def _acquire(self, avoid: set[str]) -> _Node:
        """A free slot: the least busy alive node, one not in ``avoid`` where there is one."""
        assert self._free is not None
        async with self._free:
            while True:
                alive = [node for node in self.nodes if node.alive]
                if not alive:
                    raise RolloutLost("no node of the cluster is left alive")
                preferred = [node for node in alive if node.node_id not in avoid] or alive
                free = [
                    node
                    for node in preferred
                    if node.running < node.slots and node.recovering is None
                ]
                if free:
                    node = min(free, key=lambda n: n.running / n.slots)
                    node.running += 1
                    return node
                await self._free.wait()

    async def _release(self, node: _Node) -> None:
        assert self._free is not None
        async with self._free:
            node.running -= 1
            self._free.notify_all()

    async def _judge(self, node: _Node, *, gone: bool = False) -> None:
        """After a lost dispatch: no rollout goes to ``node`` until its actor answers again
        (Ray restarts it); a node that is gone (or whose actor does not come back) is out."""
        if not node.alive:
            return
        if gone:
            await self._retire(node)
            return
        if node.recovering is None:
            node.recovering = asyncio.ensure_future(self._recover(node))
        await asyncio.shield(node.recovering)

    async def _recover(self, node: _Node) -> None:
        exceptions = self._ray.exceptions
        deadline = asyncio.get_running_loop().time() + RECOVER_TIMEOUT
        try:
            while asyncio.get_running_loop().time() < deadline:
                try:
                    info = await node.actor.start.remote()
                except exceptions.ActorUnavailableError:
                    await asyncio.sleep(0.5)  # restarting
                except (exceptions.RayActorError, exceptions.ActorUnschedulableError):
                    break  # dead for good: past its restarts, or its node is gone
                else:
                    if "error" in info:
                        logger.warning("node %s: its actor is back but: %s", node.ip, info["error"])
                        break
                    logger.warning("node %s: its actor is back", node.ip)
                    if info.get("sweep") != node.sweep:
                        # A new process: the old one's sandboxes are nobody's now.
                        self._sweep_lost(node, "its actor died")
                        node.sweep = info.get("sweep")
                    return
            await self._retire(node)
        finally:
            assert self._free is not None
            async with self._free:
                node.recovering = None
                self._free.notify_all()

    async def _retire(self, node: _Node) -> None:
        if node.alive:
            logger.warning(
                "node %s (%s) is gone: its rollouts go elsewhere", node.ip, node.node_id[:12]
            )
            self._sweep_lost(node, "it is gone")
        assert self._free is not None
        async with self._free:
            node.alive = False
            self._free.notify_all()

    def _sweep_lost(self, node: _Node, why: str) -> None:
        """Remove, in the background, the sandboxes ``node``'s lost actor left."""
        keywords, node.sweep = node.sweep, None
        if keywords is None:
            return
        task = asyncio.ensure_future(self._sweep(node, keywords, why))
        self._sweeps.add(task)
        task.add_done_callback(self._sweeps.discard)

    async def _sweep(self, node: _Node, keywords: dict[str, Any], why: str) -> None:
        try:
            sweep = plugins.get_sandbox(self.options.sandbox).sweep
            removed = await sweep(**keywords)
        except Exception:
            logger.exception("node %s: the sweep of its sandboxes failed", node.ip)
            return
        logger.warning(
            "node %s (%s): %s; removed %d sandbox(es) it left",
            node.ip,
            node.node_id[:12],
            why,
            len(removed),
        )


class _Lost(Exception):
    """A dispatch lost with its node or actor (``reason`` says how)."""

    def __init__(self, reason: str, *, gone: bool = False, delivered: bool = True) -> None:
        super().__init__(reason)
        self.reason = reason
        #: False when the actor never got the call (it was restarting).
        self.delivered = delivered
        #: The node can never run the actor again.
        self.gone = gone


async def _as_future(ref: Any) -> Any:
    return await ref


async def run_on_cluster(
    options: StackOptions,
    tasks: Sequence[Task],
    out: str | pathlib.Path,
    *,
    address: str,
    slots_per_node: int,
    samples_per_task: int = 1,
    evaluation: bool = False,
    keep_failed: bool = False,
    run_jobs: Callable[[Runner, Sequence[RolloutJob]], Awaitable[RunSummary]] | None = None,
) -> RunSummary:
    """Every job not yet done in ``out``, run on the cluster at ``address`` and committed
    here by the runner (same files and resume as a local run). ``run_jobs(runner, jobs)``
    runs them (the CLI's progress display); by default ``runner.run(jobs)``."""
    async with RayCluster(options, address=address, slots_per_node=slots_per_node) as cluster:
        runner = Runner(
            cluster.rollout,
            out,
            concurrency=cluster.slots,
            evaluation=evaluation,
            decode=cluster.decode,
            keep_failed=keep_failed,
            tokenizer=options.tokenizer or options.model_path,
        )
        jobs = runner.plan(tasks, samples_per_task)
        await cluster.check_tasks({job.task.instance_id: job.task for job in jobs}.values())
        if run_jobs is None:
            return await runner.run(jobs)
        return await run_jobs(runner, jobs)
