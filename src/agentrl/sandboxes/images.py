"""Which images a run's tasks need, and which of them the sandbox backend lacks.

A backend whose sandboxes boot from images it must already hold (``docker``) answers
``Sandbox.image_report(tasks, **options)`` with one question to where it keeps them (one
listing of the daemon's images), deciding each task's image with ``Sandbox.task_images``,
the function its boot uses too. ``agentrl rollout`` refuses to start while an image is
missing (``--skip-missing-images`` leaves those tasks out instead), ``agentrl
check-tasks`` reports them, and ``agentrl images`` lists and pulls them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import attrs

from agentrl.wording import count

__all__ = ["ImageNeed", "ImageReport", "group_needs"]

#: How a task that names no image (and gets no default) is shown in a report.
NO_IMAGE = "(no image: the task names none and the sandbox has no default image)"


@attrs.frozen(kw_only=True)
class ImageNeed:
    """One image some tasks need: its ``candidates`` in the backend's order (the first
    present one runs), the ids of the ``tasks`` needing it, and the candidate the backend
    holds (``present``; None when it holds none of them)."""

    candidates: tuple[str, ...] = attrs.field(converter=tuple)
    tasks: tuple[str, ...] = attrs.field(converter=tuple)
    present: str | None = None

    @property
    def missing(self) -> bool:
        return self.present is None

    @property
    def name(self) -> str:
        """The image that runs, else every candidate ("a or b"), else ``NO_IMAGE``."""
        if self.present is not None:
            return self.present
        return " or ".join(self.candidates) or NO_IMAGE


@attrs.frozen(kw_only=True)
class ImageReport:
    """The images ``needs`` of a set of tasks on one backend (``where``: its daemon)."""

    backend: str
    where: str
    needs: tuple[ImageNeed, ...] = attrs.field(converter=tuple)

    @property
    def missing(self) -> tuple[ImageNeed, ...]:
        return tuple(need for need in self.needs if need.missing)

    def missing_tasks(self) -> frozenset[str]:
        """The ids of the tasks whose image is missing."""
        return frozenset(task for need in self.missing for task in need.tasks)

    def need_of(self, instance_id: str) -> ImageNeed | None:
        """The image task ``instance_id`` needs (None when the report does not hold it)."""
        return next((need for need in self.needs if instance_id in need.tasks), None)

    def problem_of(self, instance_id: str) -> str | None:
        """Why task ``instance_id`` cannot boot here (its image is missing), or None."""
        need = self.need_of(instance_id)
        if need is None or not need.missing:
            return None
        if not need.candidates:
            return (
                f"{NO_IMAGE}: set the row's image, or the {self.backend} sandbox's "
                'default_image (--sandbox-options \'{"default_image": "IMAGE"}\')'
            )
        return (
            f"image not present on the {self.backend} daemon at {self.where}: {need.name}; "
            "get it with `agentrl images pull TASKS` (or build it)"
        )

    def describe_missing(self, *, max_tasks: int = 5) -> str:
        """One line per missing image: its name and the tasks needing it."""
        lines = []
        for need in self.missing:
            shown = ", ".join(need.tasks[:max_tasks])
            more = f", … ({len(need.tasks)} in all)" if len(need.tasks) > max_tasks else ""
            lines.append(f"  {need.name}  ({count(len(need.tasks), 'task')}: {shown}{more})")
        return "\n".join(lines)


def group_needs(
    task_images: Iterable[tuple[str, tuple[str, ...]]],
    present: Callable[[str], bool],
) -> tuple[ImageNeed, ...]:
    """The ``ImageNeed`` of each distinct candidate tuple among ``(task id, candidates)``
    pairs, in first-seen order; ``present(name)`` says whether the backend holds an image."""
    tasks: dict[tuple[str, ...], list[str]] = {}
    for instance_id, candidates in task_images:
        ids = tasks.setdefault(tuple(candidates), [])
        if instance_id not in ids:
            ids.append(instance_id)
    return tuple(
        ImageNeed(
            candidates=candidates,
            tasks=ids,
            present=next((name for name in candidates if present(name)), None),
        )
        for candidates, ids in tasks.items()
    )
