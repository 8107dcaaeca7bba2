"""SWE-smith records as ``scaleswe`` rows (``eval_cmd``).

A SWE-smith instance is a bug put into a clean repository: the environment image holds the
repository at its commit, ``patch`` is the change that breaks it, and the task is to undo
the breakage. swebench's harness cannot grade it (there is no test patch and no base commit
to build a test spec from, and the swebench grader runs no setup commands), so the row goes
to scaleswe:

- ``pre_commands`` apply the bug and fold it into the repository's last commit, then drop
  the reflog, so neither ``git diff`` nor the history shows the agent the change;
- ``eval_cmd`` runs the instance's FAIL_TO_PASS and PASS_TO_PASS tests by pytest node id in
  the image's ``testbed`` conda environment: exit 0 (every one passed) is solved;
- the gold patch is the bug patch reversed.

Only the pytest datasets (SWE-smith, SWE-smith-py) can be graded this way: a record whose
tests are not pytest node ids is refused.
"""

from __future__ import annotations

import base64
import re
import shlex
from collections.abc import Mapping
from typing import Any

from agentrl.graders.datasets.schema import ColumnError, ImportOptions, Schema, string_list, text

__all__ = ["SWE_SMITH", "reverse_patch", "swesmith_image"]

WORKDIR = "/testbed"
_HUNK = re.compile(r"^@@ -(\d+(?:,\d+)?) \+(\d+(?:,\d+)?) @@(.*)$")
_SWAPPED_HEADERS = (
    ("new file mode ", "deleted file mode "),
    ("rename from ", "rename to "),
    ("copy from ", "copy to "),
    ("old mode ", "new mode "),
)


def swesmith_image(repo: str, namespace: str | None = "jyangballin") -> str:
    """The environment image of a SWE-smith repository mirror ``swesmith/<owner>__<repo>.<commit8>``.

    SWE-smith's ``RepoProfile.image_name``: ``<org>/swesmith.x86_64.<owner>_1776_<repo>.<commit8>``,
    lower-cased (``jyangballin`` is SWE-smith's Docker Hub organisation).
    """
    mirror = repo.rsplit("/", 1)[-1]
    if "__" not in mirror or "." not in mirror:
        raise ColumnError(
            "repo", f"{repo!r} is not a SWE-smith mirror (swesmith/<owner>__<repo>.<commit>)"
        )
    name = f"swesmith.x86_64.{mirror.replace('__', '_1776_', 1)}"
    if namespace and namespace.lower() != "none":
        name = f"{namespace.rstrip('/')}/{name}"
    return name.lower()


def reverse_patch(patch: str) -> str:
    """The unified (git) diff that undoes ``patch``: sides, hunk ranges and modes swapped."""
    out: list[str] = []
    lines = patch.splitlines(keepends=True)
    index = 0
    while index < len(lines):
        line = lines[index]
        body = line.rstrip("\n")
        ending = line[len(body) :]
        if (
            body.startswith("--- ")
            and index + 1 < len(lines)
            and lines[index + 1].startswith("+++ ")
        ):
            new = lines[index + 1].rstrip("\n")
            out.append(f"--- {new[4:]}{ending}")
            out.append(f"+++ {body[4:]}{lines[index + 1][len(new) :]}")
            index += 2
            continue
        hunk = _HUNK.match(body)
        if hunk:
            out.append(f"@@ -{hunk.group(2)} +{hunk.group(1)} @@{hunk.group(3)}{ending}")
            sizes = (_length(hunk.group(1)), _length(hunk.group(2)))
            index = _reverse_hunk_body(lines, index + 1, out, sizes)
            continue
        out.append(_swap_header(body) + ending)
        index += 1
    return "".join(out)


def _length(hunk_range: str) -> int:
    """The line count of a hunk range (``12,3``: 3; ``12``: 1)."""
    return int(hunk_range.split(",")[1]) if "," in hunk_range else 1


def _reverse_hunk_body(lines: list[str], index: int, out: list[str], sizes: tuple[int, int]) -> int:
    """Swap ``+``/``-`` in one hunk; each run of changes puts the new removals first.

    A ``\\ No newline at end of file`` marker stays after the line it follows.
    """
    removed: list[str] = []
    added: list[str] = []
    last = out
    old_left, new_left = sizes

    def flush() -> None:
        out.extend(removed)
        out.extend(added)
        removed.clear()
        added.clear()

    while index < len(lines):
        line = lines[index]
        if line.startswith("\\"):
            last.append(line)
        elif old_left <= 0 and new_left <= 0:
            break
        elif line.startswith("+"):
            removed.append("-" + line[1:])
            last, new_left = removed, new_left - 1
        elif line.startswith("-"):
            added.append("+" + line[1:])
            last, old_left = added, old_left - 1
        else:  # context: " text", or an empty line where an editor dropped the space
            flush()
            out.append(line)
            last, old_left, new_left = out, old_left - 1, new_left - 1
        index += 1
    flush()
    return index


def _swap_header(body: str) -> str:
    if body.startswith("index ") and ".." in body:
        ids, _, mode = body[6:].partition(" ")
        old, _, new = ids.partition("..")
        return f"index {new}..{old}" + (f" {mode}" if mode else "")
    for first, second in _SWAPPED_HEADERS:
        if body.startswith(first):
            return second + body[len(first) :]
        if body.startswith(second):
            return first + body[len(second) :]
    return body


def _is_pytest_id(test: str) -> bool:
    return "::" in test or test.split("[", 1)[0].endswith(".py")


def _pre_commands(instance_id: str, patch: str) -> list[str]:
    encoded = base64.b64encode(patch.encode()).decode()
    bug = "/tmp/agentrl-swesmith-bug.diff"
    return [
        f"printf '%s' {encoded} | base64 -d > {bug}\n"
        f"git apply --whitespace=nowarn {bug}\n"
        f"rm -f {bug}\n"
        "git add -A\n"
        "git -c user.name=swesmith -c user.email=swesmith@anon.com "
        "commit -q --amend --no-edit --allow-empty\n"
        "git reflog expire --expire=now --all\n"
        "git gc -q --prune=now\n"
    ]


def _eval_cmd(tests: list[str]) -> str:
    ids = " ".join(shlex.quote(test) for test in tests)
    return (
        "if [ -f /opt/miniconda3/bin/activate ]; then\n"
        "  source /opt/miniconda3/bin/activate\n"
        "  conda activate testbed\n"
        "fi\n"
        "python -m pytest -p no:cacheprovider --disable-warnings --color=no --tb=short -q "
        f"{ids}"
    )


def swesmith_row(record: Mapping[str, Any], options: ImportOptions) -> dict[str, Any]:
    """A SWE-smith record as a scaleswe ``eval_cmd`` row (see the module docstring)."""
    instance_id = text(record, "instance_id", required=True)
    patch = text(record, "patch", required=True)
    f2p = string_list(record, "FAIL_TO_PASS")
    p2p = string_list(record, "PASS_TO_PASS")
    if not f2p:
        raise ColumnError("FAIL_TO_PASS", "lists no test")
    foreign = [test for test in f2p + p2p if not _is_pytest_id(test)]
    if foreign:
        raise ColumnError(
            "FAIL_TO_PASS" if foreign[0] in f2p else "PASS_TO_PASS",
            f"lists {foreign[0]!r}, which is not a pytest node id: only SWE-smith's pytest "
            "repositories can be graded by an eval command (the others need their "
            "repository profile's test command and log parser)",
        )
    own = text(record, "image_name").strip()
    if own and options.image_namespace is None:
        image = own
    else:
        image = swesmith_image(
            text(record, "repo", required=True),
            options.image_namespace if options.image_namespace is not None else "jyangballin",
        )
    return {
        "prompt": text(record, "problem_statement"),
        "label": instance_id,
        "metadata": {
            "instance_id": instance_id,
            "dataset": "swe-smith",
            "source_repo": text(record, "repo"),
            "created_at": str(record.get("created_at") or ""),
            "image": image,
            "workdir": WORKDIR,
            "pre_commands": _pre_commands(instance_id, patch),
            "eval_cmd": _eval_cmd(list(dict.fromkeys(f2p + p2p))),
            "gold_patch": reverse_patch(patch),
            "FAIL_TO_PASS": f2p,
            "PASS_TO_PASS": p2p,
        },
    }


SWE_SMITH = Schema(
    name="swe-smith",
    grader="scaleswe",
    required=("instance_id", "repo", "patch", "FAIL_TO_PASS", "PASS_TO_PASS", "problem_statement"),
    optional=("image_name", "created_at"),
    convert=swesmith_row,
    source=(
        "huggingface.co/datasets/SWE-bench/SWE-smith dataset card; image names from "
        "SWE-smith's swesmith/profiles/base.py RepoProfile.image_name"
    ),
)
