"""The grader contract: parse a task row, say if it can be graded, grade a diff."""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from agentrl.sandboxes.base import Sandbox
from agentrl.types import Grade, Task

__all__ = ["Grader", "SandboxFactory"]

#: Builds a fresh (not yet started) sandbox for a task; graders never reuse the agent's.
SandboxFactory = Callable[[Task], Sandbox]


class Grader(abc.ABC):
    """Grades an agent's diff in a fresh sandbox built from the task's image."""

    name: ClassVar[str]

    @abc.abstractmethod
    def parse_task(self, row: Mapping[str, Any]) -> Task:
        """Parse one JSONL row into a Task; raise ``ValueError`` naming the bad field."""

    def check(self, task: Task) -> str | None:
        """Why ``task`` cannot be graded, or ``None`` when it can."""
        return None

    @abc.abstractmethod
    async def grade(self, task: Task, diff: str, sandbox_factory: SandboxFactory) -> Grade:
        """Apply ``diff`` in a fresh sandbox and grade it; errors become ``Grade.error``."""
