"""Applying an agent's diff in a grading sandbox: apply ladders, test-file protection.

A ladder is a list of commands tried in order, each given the patch file as its last
argument; the first that exits 0 wins. After a failed rung every path the diff touches is
put back exactly as it was (a rung such as ``--reject`` or ``--3way`` can leave half a
patch behind), so each rung starts from the same tree. After a successful rung, the
*protected* paths the diff touched (tests, by default) are put back too: a diff that edits
the tests cannot make them pass.
"""

from __future__ import annotations

import fnmatch
import logging
import posixpath
import re
import shlex
import uuid
from collections.abc import Iterable, Sequence

import attrs

from agentrl.sandboxes.base import EXIT_EXEC_TIMEOUT, Sandbox, SandboxError

__all__ = [
    "DEFAULT_TEST_PATTERNS",
    "GIT_ANY_OWNER",
    "SCALESWE_LADDER",
    "SWEBENCH_LADDER",
    "PatchOutcome",
    "apply_patch",
    "diff_paths",
    "ensure_git_baseline",
    "is_protected",
    "swebench_ladder",
]

logger = logging.getLogger(__name__)

#: scaleswe's ladder: three-way merge first, then plain ``git apply``, then ``patch``.
SCALESWE_LADDER: tuple[str, ...] = (
    "git apply --3way --whitespace=nowarn",
    "git apply --whitespace=nowarn",
    "patch -p1 --batch --forward --no-backup-if-mismatch -i",
)

#: swebench's ladder, used when the installed swebench does not expose its own.
SWEBENCH_LADDER: tuple[str, ...] = (
    "git apply --verbose",
    "git apply --verbose --3way",
    "git apply --verbose --reject",
    "patch --batch --forward --fuzz=5 -p1 -i",
)

#: Paths a diff may not change during grading unless a task says otherwise.
DEFAULT_TEST_PATTERNS: tuple[str, ...] = (
    "test/*",
    "tests/*",
    "testing/*",
    "*/test/*",
    "*/tests/*",
    "*/testing/*",
    "test_*.py",
    "*/test_*.py",
    "*_test.py",
    "conftest.py",
    "*/conftest.py",
)

#: Lets git work in a workspace owned by another uid (no global config is written).
GIT_ANY_OWNER = "export GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=safe.directory GIT_CONFIG_VALUE_0='*'"
_APPLIED_RE = re.compile(r"^AGENTRL_APPLIED (\d+)$", re.M)
_RESTORED_RE = re.compile(r"^AGENTRL_RESTORED (.+)$", re.M)
_NO_WORKDIR = 90


def swebench_ladder() -> tuple[str, ...]:
    """The installed swebench's own ladder (``GIT_APPLY_CMDS``), else ``SWEBENCH_LADDER``."""
    try:
        from swebench.harness.run_evaluation import GIT_APPLY_CMDS
    except Exception:  # swebench missing, or its docker client missing: same commands
        return SWEBENCH_LADDER
    return tuple(GIT_APPLY_CMDS)


@attrs.frozen(kw_only=True)
class PatchOutcome:
    """What happened to one diff: applied or not, by which rung, and what was put back."""

    applied: bool
    method: str | None = None
    log: str = ""
    restored: tuple[str, ...] = ()


_QUOTED_ESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\"}


def _unquote(path: str) -> str:
    """Undo git's C-style quoting of a path (``"a/sp ace\\t"``)."""
    if not (len(path) >= 2 and path.startswith('"') and path.endswith('"')):
        return path
    body, out, i = path[1:-1], bytearray(), 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in "01234567" and i + 3 < len(body) + 1:
                out.append(int(body[i + 1 : i + 4], 8))
                i += 4
                continue
            out.extend(_QUOTED_ESCAPES.get(nxt, nxt).encode())
            i += 2
            continue
        out.extend(ch.encode())
        i += 1
    return out.decode("utf-8", errors="replace")


def _strip_prefix(path: str) -> str | None:
    path = _unquote(path.split("\t", 1)[0].strip())
    if not path or path == "/dev/null":
        return None
    if path[:2] in ("a/", "b/"):
        path = path[2:]
    path = posixpath.normpath(path)
    if path.startswith("../") or path == ".." or path.startswith("/"):
        return None
    return path


def diff_paths(diff: str) -> list[str]:
    """Every repository-relative path a unified or git diff touches, in order, once each."""
    seen: dict[str, None] = {}
    for line in diff.splitlines():
        candidates: list[str] = []
        if line.startswith("diff --git "):
            rest = line[len("diff --git ") :]
            if rest.startswith('"'):
                candidates = re.findall(r'"(?:[^"\\]|\\.)*"|\S+', rest)
            else:
                match = re.match(r"a/(.*) b/(.*)$", rest)
                candidates = ["a/" + match.group(1), "b/" + match.group(2)] if match else []
        elif line.startswith(("--- ", "+++ ")):
            candidates = [line[4:]]
        elif line.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
            candidates = [line.split(" ", 2)[2]]
        for candidate in candidates:
            path = _strip_prefix(candidate)
            if path and path != ".":
                seen.setdefault(path, None)
    return list(seen)


def is_protected(path: str, patterns: Iterable[str]) -> bool:
    """Whether ``path`` matches a protected pattern; a bare directory protects its tree."""
    for pattern in patterns:
        pattern = pattern.strip().lstrip("./") if pattern.startswith("./") else pattern.strip()
        if not pattern:
            continue
        if fnmatch.fnmatchcase(path, pattern):
            return True
        directory = pattern.rstrip("/")
        if not any(ch in directory for ch in "*?[") and (
            path == directory or path.startswith(directory + "/")
        ):
            return True
    return False


def _ladder_script(
    workdir: str,
    patch_file: str,
    state: str,
    ladder: Sequence[str],
    paths: Sequence[str],
    protected: Sequence[str],
) -> str:
    """A bash script that tries each rung and prints which one applied and what it restored."""
    q = shlex.quote
    quoted = " ".join(q(p) for p in paths)
    lines = [
        "set -u",
        GIT_ANY_OWNER,
        f"cd {q(workdir)} || exit {_NO_WORKDIR}",
        f"S={q(state)}; P={q(patch_file)}",
        'mkdir -p "$S" && : > "$S/existed" && : > "$S/log"',
        "in_git=0; git rev-parse --is-inside-work-tree >/dev/null 2>&1 && in_git=1",
    ]
    if paths:
        # Keep every touched path as it is now: present ones in a tar, absent ones unlisted.
        lines += [
            f"for p in {quoted}; do",
            '  if [ -e "$p" ] || [ -L "$p" ]; then printf "%s\\n" "$p" >> "$S/existed"; fi',
            "done",
        ]
    lines += [
        'tr "\\n" "\\0" < "$S/existed" | tar -cf "$S/backup.tar" --null -T - 2>>"$S/log"',
        "restore() {",
        '  rm -rf -- "$1" "$1.rej" "$1.orig"',
        '  if grep -qxF -- "$1" "$S/existed"; then tar -xpf "$S/backup.tar" -- "$1"; fi',
        '  if [ "$in_git" = 1 ]; then git reset -q -- "$1" >/dev/null 2>&1; fi',
        "  return 0",
        "}",
        "restore_all() {",
        f'  for p in {quoted}; do restore "$p"; done' if paths else "  :",
        "}",
        "applied=''",
    ]
    for index, command in enumerate(ladder):
        lines += [
            'if [ -z "$applied" ]; then',
            f'  echo {q("+ " + command)} >> "$S/log"',
            f'  if {command} "$P" >> "$S/log" 2>&1; then applied={index}; else restore_all; fi',
            "fi",
        ]
    lines += [
        'cat "$S/log" >&2',
        'if [ -z "$applied" ]; then rm -rf "$S"; exit 1; fi',
        'echo "AGENTRL_APPLIED $applied"',
    ]
    lines += [f"restore {q(p)}; echo AGENTRL_RESTORED {q(p)}" for p in protected]
    lines.append('rm -rf "$S"; exit 0')
    return "\n".join(lines) + "\n"


async def apply_patch(
    sandbox: Sandbox,
    workdir: str,
    diff: str,
    *,
    ladder: Sequence[str] = SCALESWE_LADDER,
    protect: Iterable[str] = (),
    user: str = "root",
    timeout: float = 300,
) -> PatchOutcome:
    """Apply ``diff`` in ``workdir`` with the first ladder rung that works.

    An empty (all-whitespace) diff is a no-op that counts as applied. Paths matching
    ``protect`` are put back to their pre-patch state after the diff applied, and are
    listed in ``PatchOutcome.restored``. Raises ``SandboxError`` if the sandbox failed
    (not if the diff did not apply).
    """
    if not diff.strip():
        return PatchOutcome(applied=True, method="empty")
    if not diff.endswith("\n"):
        diff += "\n"
    paths = diff_paths(diff)
    patterns = tuple(protect)
    protected = [p for p in paths if is_protected(p, patterns)] if patterns else []
    token = uuid.uuid4().hex[:12]
    patch_file = f"/tmp/agentrl-patch-{token}.diff"
    state = f"/tmp/agentrl-patch-{token}"
    await sandbox.write_file(patch_file, diff, user=user)
    script = _ladder_script(workdir, patch_file, state, ladder, paths, protected)
    result = await sandbox.exec(
        f"bash -c {shlex.quote(script)}", user=user, timeout=timeout, idempotent=False
    )
    if result.exit_code == EXIT_EXEC_TIMEOUT:
        raise SandboxError(f"applying the patch took longer than {timeout:g}s")
    if result.exit_code == _NO_WORKDIR:
        raise SandboxError(
            f"the workdir {workdir} does not exist in the grading sandbox; check the task's "
            "workdir and repository"
        )
    match = _APPLIED_RE.search(result.stdout)
    if result.exit_code != 0 or match is None:
        logger.info("patch did not apply in %s:\n%s", workdir, result.stderr[-2000:])
        return PatchOutcome(applied=False, log=result.stderr)
    restored = tuple(_RESTORED_RE.findall(result.stdout))
    if restored:
        logger.info("grading restored protected paths the diff changed: %s", ", ".join(restored))
    return PatchOutcome(
        applied=True, method=ladder[int(match.group(1))], log=result.stderr, restored=restored
    )


async def ensure_git_baseline(
    sandbox: Sandbox, workdir: str, *, user: str = "root", timeout: float = 300
) -> bool:
    """Make ``workdir`` a git repository with one commit when it is not one already.

    Returns True when a baseline was created. The commit's author and date are fixed, so
    the same tree always gets the same commit id in every sandbox.
    """
    q = shlex.quote
    script = "\n".join(
        [
            GIT_ANY_OWNER,
            f"cd {q(workdir)} || exit {_NO_WORKDIR}",
            "git rev-parse --is-inside-work-tree >/dev/null 2>&1 && exit 0",
            "export GIT_AUTHOR_NAME=agentrl GIT_AUTHOR_EMAIL=agentrl@localhost",
            "export GIT_COMMITTER_NAME=agentrl GIT_COMMITTER_EMAIL=agentrl@localhost",
            "export GIT_AUTHOR_DATE='2000-01-01T00:00:00+0000'",
            "export GIT_COMMITTER_DATE='2000-01-01T00:00:00+0000'",
            "git init -q && git add -A && "
            "git -c commit.gpgsign=false commit -q --no-verify --allow-empty -m baseline "
            "|| exit 1",
            "echo AGENTRL_BASELINE",
        ]
    )
    result = await sandbox.exec(f"bash -c {q(script)}", user=user, timeout=timeout)
    if result.exit_code == _NO_WORKDIR:
        raise SandboxError(
            f"the workdir {workdir} does not exist in the sandbox; check the task's workdir "
            "and repository"
        )
    if result.exit_code != 0:
        raise SandboxError(
            f"could not create a git baseline in {workdir} (exit {result.exit_code}): "
            f"{(result.stderr or result.stdout)[-500:]}; is git installed in the sandbox?"
        )
    return "AGENTRL_BASELINE" in result.stdout
