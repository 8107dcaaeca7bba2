"""Applying an agent's diff in a grading sandbox: apply ladders on a tree the grader owns.

A ladder is a list of commands tried in order, each given the patch file as its last
argument; the first that exits 0 wins. Before the first rung the workdir is snapshotted
into a private git directory (``agentrl.graders.tree``); after a failed rung the tree is
put back exactly from it (a rung such as ``--reject`` or ``--3way`` can leave half a patch
behind), so each rung starts from the same tree. After the rung that applied, the tree is
compared with the snapshot: the paths that really changed, whatever the diff's headers
claimed, are checked against what the grader owns (``agentrl.graders.protection``: the
task's test paths and every task's test infrastructure), and those are put back. The
tree's final change is kept for the suspicious-edit guard (``agentrl.graders.guard``).
"""

from __future__ import annotations

import contextlib
import logging
import re
import shlex
from collections.abc import Iterable, Sequence

import attrs

from agentrl.graders.guard import TEXT_GLOBS
from agentrl.graders.protection import (
    CONFIG_FILES,
    DOTGIT_REASON,
    INSTALLED_REASON,
    Dropped,
    decide,
    is_protected,
    shadow_candidates,
)
from agentrl.graders.tree import Change, TreeStore, raw_changes
from agentrl.sandboxes.base import EXIT_EXEC_TIMEOUT, Sandbox, SandboxError

__all__ = [
    "DEFAULT_TEST_PATTERNS",
    "GIT_ANY_OWNER",
    "SCALESWE_LADDER",
    "SWEBENCH_LADDER",
    "Dropped",
    "PatchOutcome",
    "apply_patch",
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
#: The most bytes of the tree's final change the guard reads.
GUARD_DIFF_LIMIT = 16 * 1024 * 1024
#: Where a hook implementation makes the repository one that ships a pytest plugin.
_PLUGIN_SOURCES = (
    ":(glob)**/*.py",
    ":(exclude,glob)**/conftest.py",
    ":(exclude,glob)**/test_*.py",
    ":(exclude,glob)**/test/**",
    ":(exclude,glob)**/tests/**",
    ":(exclude,glob)**/testing/**",
)
_APPLIED_RE = re.compile(r"^AGENTRL_APPLIED (\d+)$", re.M)
_NO_WORKDIR = 90
_STORE_FAILED = 93


def swebench_ladder() -> tuple[str, ...]:
    """The installed swebench's own ladder (``GIT_APPLY_CMDS``), else ``SWEBENCH_LADDER``."""
    try:
        from swebench.harness.run_evaluation import GIT_APPLY_CMDS
    except Exception:  # swebench missing, or its docker client missing: same commands
        return SWEBENCH_LADDER
    return tuple(GIT_APPLY_CMDS)


@attrs.frozen(kw_only=True)
class PatchOutcome:
    """What happened to one diff: applied or not, by which rung, and what was put back.

    ``dropped`` lists the protected paths the diff changed, each with the reason it was put
    back; ``tree_diff`` is the tree's final change against the snapshot (a git diff with
    fixed ``a/`` ``b/`` prefixes and no context, of the files the guard reads);
    ``pytest_repo`` says the repository is pytest itself or a pytest plugin.
    """

    applied: bool
    method: str | None = None
    log: str = ""
    dropped: tuple[Dropped, ...] = ()
    tree_diff: str = ""
    pytest_repo: bool = False

    @property
    def restored(self) -> tuple[str, ...]:
        """The paths of ``dropped``."""
        return tuple(d.path for d in self.dropped)


def _ladder_script(patch_file: str, ladder: Sequence[str]) -> str:
    """Snapshot the tree, try each rung (the tree put back after a failed one), and compare
    the tree with the snapshot after the rung that applied."""
    q = shlex.quote
    lines = [
        f"P={q(patch_file)}",
        "snapshot || { echo 'could not snapshot the workdir into the grader store' >&2; "
        f"exit {_STORE_FAILED}; }}",
        GIT_ANY_OWNER,
        ": > \"$S/log\"; applied=''",
    ]
    for index, command in enumerate(ladder):
        lines += [
            'if [ -z "$applied" ]; then',
            f'  echo {q("+ " + command)} >> "$S/log"',
            f'  if {command} "$P" >> "$S/log" 2>&1; then applied={index}',
            f'  else revert "$S" && set_aside_revert || exit {_STORE_FAILED}; fi',
            "fi",
        ]
    lines += [
        'cat "$S/log" >&2',
        '[ -n "$applied" ] || exit 1',
        f'set_aside_revert && changed "$S" || exit {_STORE_FAILED}',
        # pytest's own repository, or one shipping a plugin: the guard's pytest patterns
        # are its code (judged on the snapshot, which the diff cannot change)
        'B=$(cat "$S/base")',
        "if g ls-tree -r --name-only \"$B\" | grep -qE '(^|/)_pytest/__init__[.]py$' || "
        'g grep -q -I -e pytest11 "$B" -- setup.py setup.cfg pyproject.toml 2>/dev/null || '
        "g grep -q -I -E '^[[:space:]]*def pytest_[a-z_]+[(]' \"$B\" -- "
        + " ".join(shlex.quote(spec) for spec in _PLUGIN_SOURCES)
        + " 2>/dev/null; then echo AGENTRL_PYTEST_REPO; fi",
        'echo "AGENTRL_APPLIED $applied"',
    ]
    return "\n".join(lines)


def _finish_script(drop_file: str | None) -> str:
    """Put the dropped paths back, compare again, and write the guard's diff."""
    lines = []
    if drop_file:
        lines.append(f'put_back "$S" {shlex.quote(drop_file)} || exit {_STORE_FAILED}')
    globs = " ".join(shlex.quote(f":(glob){glob}") for glob in TEXT_GLOBS)
    lines += [
        f'changed "$S" || exit {_STORE_FAILED}',
        "g diff-index --cached -p -U0 --no-renames --no-ext-diff --no-textconv "
        '--src-prefix=a/ --dst-prefix=b/ "$(cat "$S/base")" -- '
        f'{globs} | head -c {GUARD_DIFF_LIMIT} > "$S/final.diff"',
    ]
    return "\n".join(lines)


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

    The tree is snapshotted first (``agentrl.graders.tree``); a failed rung is undone from
    the snapshot, and after the rung that applied, every path it changed that is protected
    — one of ``protect`` (the task's test paths), test infrastructure of any task
    (``agentrl.graders.protection``), or anything under a ``.git`` — is put back and listed
    in ``PatchOutcome.dropped``. An empty (all-whitespace) diff is a no-op that counts as
    applied. Raises ``SandboxError`` if the sandbox failed (not if the diff did not apply).
    """
    if not diff.strip():
        return PatchOutcome(applied=True, method="empty")
    if not diff.endswith("\n"):
        diff += "\n"
    store = TreeStore(sandbox, workdir, user=user, timeout=timeout)
    patch_file = f"{store.root}.diff"
    await sandbox.write_file(patch_file, diff, user=user)
    try:
        code, stdout, stderr = await store.run(_ladder_script(patch_file, ladder))
        if code == EXIT_EXEC_TIMEOUT:
            raise SandboxError(f"applying the patch took longer than {timeout:g}s")
        if code == _STORE_FAILED:
            raise SandboxError(f"the grader's tree store failed: {stderr[-1000:]}")
        match = _APPLIED_RE.search(stdout)
        if code != 0 or match is None:
            logger.info("patch did not apply in %s:\n%s", workdir, stderr[-2000:])
            return PatchOutcome(applied=False, log=stderr)
        method = ladder[int(match.group(1))]
        dotgit, installed, tampered = await store.set_aside_report()
        if tampered:
            return PatchOutcome(
                applied=False,
                method=method,
                log=f"{stderr}\nthe diff changed what cannot be put back "
                f"({', '.join(tampered)}), so it is not graded",
            )
        dropped_changes = await _drops(store, await store.changes(), tuple(protect))
        drop_file = None
        if dropped_changes:
            drop_file = f"{store.root}/drop"
            await sandbox.write_file(
                drop_file, raw_changes([c for c, _ in dropped_changes]), user=user
            )
        code, _, finish_log = await store.run(_finish_script(drop_file))
        if code != 0:
            raise SandboxError(f"the grader's tree store failed: {finish_log[-1000:]}")
        left = {c.path for c in await store.changes()}
        stuck = [c.path for c, _ in dropped_changes if c.path in left]
        if stuck:
            raise SandboxError(f"could not put back the protected paths {stuck[:5]}")
        tree_diff = (await store.read("final.diff") or b"").decode("utf-8", errors="replace")
    finally:
        with contextlib.suppress(Exception):
            await sandbox.exec(
                f"rm -rf -- {shlex.quote(store.root)} {shlex.quote(patch_file)}",
                user=user,
                timeout=60,
            )
    dropped = (
        *(Dropped(path=p, reason=DOTGIT_REASON) for p in dotgit),
        *(Dropped(path=p, reason=INSTALLED_REASON) for p in installed),
        *(Dropped(path=c.path, reason=reason) for c, reason in dropped_changes),
    )
    if dropped:
        logger.info(
            "grading dropped what the diff changed in protected paths: %s",
            ", ".join(d.path for d in dropped),
        )
    return PatchOutcome(
        applied=True,
        method=method,
        log=stderr,
        dropped=dropped,
        tree_diff=tree_diff,
        pytest_repo="AGENTRL_PYTEST_REPO" in stdout,
    )


async def _drops(
    store: TreeStore, changes: list[Change], protect: tuple[str, ...]
) -> list[tuple[Change, str]]:
    """The changes to drop and why, reading what the decision needs from the store."""
    created = sorted(
        {
            candidate
            for change in changes
            if change.status == "A"
            for candidate in shadow_candidates(change.path)
        }
    )
    shadows_created = set(created) - await store.existed(created)
    configs = [
        c.path for c in changes if c.path.rsplit("/", 1)[-1] in CONFIG_FILES and not c.symlink
    ]
    return decide(
        changes,
        test_patterns=protect,
        shadows_created=shadows_created,
        configs_before=await store.blobs(configs, now=False),
        configs_after=await store.blobs(configs, now=True),
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
