"""The node side of ``agentrl rollout --ray``: one actor per node that owns its stack.

A :class:`NodeRollouts` actor is placed on one Ray node (hard node affinity) by
``agentrl.rollout.cluster``. It builds that node's :class:`~agentrl.rollout.stack.Stack`
(the middleware and its sessions, the engine client, the sandboxes, the boot limit) on
its first call and runs each rollout it is sent with ``run_rollout`` there; what comes
back to the driver is a :class:`NodeResult`: the rollout's full result (record, samples,
diff and agent log) and where it ran. The actor writes no file: the driver is the only
writer of the output directory.

Leaks: when its stack is up, the actor first has the sandbox backend remove the
sandboxes a dead process of this host left (``sweep_orphans``: a node that starts again
after dying), then tells the driver how to remove its own (``sweep_keywords``: for
``docker``, the daemon's address and the labels of this run and process), so a driver
that loses this node or actor removes them at once.

Nothing here imports ``ray``: the driver wraps the class with ``ray.remote``, so this
module loads on a machine without Ray.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import attrs

from agentrl import plugins
from agentrl.rollout.stack import Stack, StackError, StackOptions
from agentrl.types import Outcome, Task, TurnFact

if TYPE_CHECKING:
    from agentrl.rollout.run import RolloutResult

__all__ = ["NodeResult", "NodeRollouts"]

logger = logging.getLogger(__name__)


@attrs.frozen(kw_only=True)
class NodeResult:
    """A rollout's result as it comes back from a node, with where it ran.

    It has the attributes the runner's write path reads (``samples``, ``outcome``,
    ``remove_sample``, ``diff``, ``agent_log``, ``turn_facts``, ``to_dict``), so it is committed exactly as
    a local ``RolloutResult``; its ``rollouts.jsonl`` line also says ``node_id``,
    ``node_ip`` and ``rescheduled`` (the nodes an earlier dispatch of it was lost on).
    """

    result: RolloutResult
    node_id: str
    node_ip: str
    #: One ``{"node_id", "error"}`` per earlier dispatch of this rollout that was lost.
    rescheduled: tuple[dict[str, str], ...] = ()

    @property
    def samples(self) -> tuple[Any, ...]:
        return self.result.samples

    @property
    def outcome(self) -> Outcome:
        return self.result.outcome

    @property
    def remove_sample(self) -> bool:
        return self.result.remove_sample

    @property
    def diff(self) -> str:
        return self.result.diff

    @property
    def agent_log(self) -> str:
        return self.result.agent_log

    @property
    def turn_facts(self) -> tuple[TurnFact, ...]:
        return self.result.turn_facts

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.result.to_dict(),
            "node_id": self.node_id,
            "node_ip": self.node_ip,
            "rescheduled": [dict(lost) for lost in self.rescheduled],
        }


class NodeRollouts:
    """One node's rollouts: its own stack, ``slots`` rollouts at once (an async actor).

    ``options`` are the driver's, with ``boot_concurrency`` set to ``slots`` (the node's
    boot limit). The stack starts on the first call (``start``, or the first rollout of an
    actor Ray restarted) and closes in ``close``, which first cancels the rollouts still
    running here, so their sandboxes close and their sessions drop.
    """

    def __init__(self, options: StackOptions, *, slots: int, node_id: str, node_ip: str) -> None:
        self.options = attrs.evolve(options, boot_concurrency=slots)
        self.slots = slots
        self.node_id = node_id
        self.node_ip = node_ip
        self._stack: Stack | None = None
        self._starting: asyncio.Lock | None = None
        self._running: set[asyncio.Task[Any]] = set()
        self._closed = False
        #: How another process removes this actor's sandboxes (None: the backend cannot).
        self._sweep: dict[str, Any] | None = None

    async def _ready(self) -> Stack:
        if self._closed:
            raise RuntimeError("this node's stack is closed")
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._stack is None:
                stack = Stack(self.options)
                await stack.__aenter__()
                self._stack = stack
                await self._sweep_orphans(stack)
        return self._stack

    async def _sweep_orphans(self, stack: Stack) -> None:
        """Remove what dead processes of this host left (``sweep_orphans``), and learn how
        the driver removes this actor's sandboxes (``sweep_keywords``)."""
        cls = plugins.get_sandbox(self.options.sandbox)
        orphans = getattr(cls, "sweep_orphans", None)
        if orphans is not None:
            try:
                removed = await orphans(**stack.sandbox_options)
            except Exception:
                logger.exception("node %s: the sweep of orphaned sandboxes failed", self.node_ip)
            else:
                if removed:
                    logger.warning(
                        "node %s: removed %d sandbox(es) a dead process left",
                        self.node_ip,
                        len(removed),
                    )
        keywords = getattr(cls, "sweep_keywords", None)
        self._sweep = keywords(**stack.sandbox_options) if keywords is not None else None

    async def start(self) -> dict[str, Any]:
        """Build the stack; what the driver shows of this node (or the error, as text), and
        ``sweep``: the keywords of the sandbox backend's ``sweep`` that remove exactly this
        actor's sandboxes (None where the backend has no ``sweep_keywords``)."""
        try:
            await self._ready()
        except Exception as exc:  # the driver turns it into one line naming the node
            return {"error": f"{type(exc).__name__}: {exc}"}
        return {
            "node_id": self.node_id,
            "pid": os.getpid(),
            "slots": self.slots,
            "sweep": self._sweep,
        }

    async def check_tasks(self, tasks: Iterable[Task]) -> str | None:
        """``Stack.check_tasks`` on this node: None, or the ``StackError``'s message."""
        stack = await self._ready()
        try:
            stack.check_tasks(tasks)
        except StackError as exc:
            return str(exc)
        return None

    async def rollout(self, task: Task, index: int) -> NodeResult:
        """Run one rollout of ``task`` here; its result (turn facts included, which the
        runner writes to ``sessions/``)."""
        current = asyncio.current_task()
        if current is not None:
            self._running.add(current)
        try:
            stack = await self._ready()
            result = await stack.rollout(task, index)
        finally:
            if current is not None:
                self._running.discard(current)
        return NodeResult(result=result, node_id=self.node_id, node_ip=self.node_ip)

    def where(self) -> dict[str, Any]:
        """This actor's node id and process id (what the fault tests kill)."""
        return {"node_id": self.node_id, "pid": os.getpid()}

    async def close(self) -> None:
        """Cancel the rollouts running here, then close the stack (its sandboxes swept)."""
        self._closed = True
        running = [task for task in self._running if not task.done()]
        for task in running:
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)
        stack, self._stack = self._stack, None
        if stack is not None:
            try:
                await stack.aclose()
            except Exception:
                logger.exception("node %s: the stack did not close cleanly", self.node_ip)
