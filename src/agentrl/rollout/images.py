"""The rollout's image pre-check: every task's image is on the backend before a sandbox starts.

Without it a task whose image is missing costs every one of its rollouts a full boot loop
(each retry asks the daemon again) before an ``infra_error``. The backend is asked once
for all tasks (``Sandbox.image_report``: the ``docker`` sandbox lists its daemon's images),
with the options a ``Stack`` gives its sandboxes, so the image named here is the image a
boot would take.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from agentrl import plugins
from agentrl.rollout.stack import StackError, StackOptions, merge_sandbox_options
from agentrl.sandboxes.base import SandboxError
from agentrl.sandboxes.images import ImageReport
from agentrl.types import Task
from agentrl.wording import count

__all__ = ["ImageCheck", "MissingImagesError", "check_images"]


class MissingImagesError(StackError):
    """Some tasks' images are not on the sandbox backend; ``report`` says which."""

    def __init__(self, report: ImageReport, task_files: Sequence[str] = ()) -> None:
        self.report = report
        missing = len(report.missing_tasks())
        files = " ".join(task_files) or "TASKS"
        needs = "needs" if missing == 1 else "need"
        super().__init__(
            f"{count(missing, 'task')} {needs} images the {report.backend} "
            f"daemon at {report.where} does not hold (nothing was started):\n"
            f"{report.describe_missing()}\n"
            f"get them with: agentrl images pull {files}\n"
            "or leave those tasks out with --skip-missing-images"
        )


@attrs.frozen(kw_only=True)
class ImageCheck:
    """What the pre-check decided: the ``tasks`` to roll out and the ``skipped`` ones
    (their image missing); ``report`` is None for a backend that holds no images."""

    tasks: tuple[Task, ...] = attrs.field(converter=tuple)
    skipped: tuple[Task, ...] = attrs.field(converter=tuple, default=())
    report: ImageReport | None = None


async def check_images(
    options: StackOptions,
    tasks: Sequence[Task],
    *,
    skip_missing: bool = False,
    task_files: Sequence[str] = (),
) -> ImageCheck:
    """Ask ``options.sandbox``'s backend, once, for the images of ``tasks``.

    Raises ``MissingImagesError`` naming every missing image and the tasks needing it
    (``task_files`` go into the ``agentrl images pull`` it suggests), unless
    ``skip_missing``: those tasks are then returned as ``skipped``. A backend that
    cannot be asked is a ``StackError``.
    """
    sandbox_cls = plugins.get_sandbox(options.sandbox)
    sandbox_options = merge_sandbox_options(
        dict(getattr(sandbox_cls, "with_host_python", {})) if options.host_python else {},
        options.sandbox_options,
    )
    try:
        report = await sandbox_cls.image_report(tasks, **sandbox_options)
    except (SandboxError, ValueError, TypeError) as exc:
        raise StackError(f"cannot check the tasks' images before the run: {exc}") from None
    if report is None or not report.missing:
        return ImageCheck(tasks=tasks, report=report)
    if not skip_missing:
        raise MissingImagesError(report, task_files)
    missing = report.missing_tasks()
    return ImageCheck(
        tasks=[task for task in tasks if task.instance_id not in missing],
        skipped=[task for task in tasks if task.instance_id in missing],
        report=report,
    )
