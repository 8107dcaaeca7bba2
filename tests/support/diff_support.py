"""Real diffs for grader tests: ``git diff`` of edits made to a copy of a repository."""

from __future__ import annotations

import pathlib
import shutil
import subprocess


def make_diff(repo: pathlib.Path, scratch: pathlib.Path, edits: dict[str, str | None]) -> str:
    """A real `git diff` of ``edits`` (path -> new content, None deletes) against ``repo``."""
    work = scratch / f"diff-{len(list(scratch.glob('diff-*')))}"
    shutil.copytree(repo, work)

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
            cwd=work,
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "base")
    for name, content in edits.items():
        path = work / name
        if content is None:
            path.unlink()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
    git("add", "-A")
    return git("diff", "--cached")
