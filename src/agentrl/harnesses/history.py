"""Cut the task repository's future out of the agent's workspace before the agent starts.

A task's repository often carries the answer: the fix commit on another branch, in a tag,
a remote-tracking ref, a reflog entry, a stash, or as an unreachable object in a pack, all
readable with ``git log --all`` or ``git fsck``. :func:`scrub_history` leaves only the
history reachable from the task's base commit (``HEAD`` when the task names none): HEAD's
branch (or a detached HEAD) at the base and nothing else. It deletes every other ref
(branches, tags, remote-tracking refs, the stash, notes, replace refs), the remotes, the
reflogs, the pseudo-refs and message files (``FETCH_HEAD``, ``ORIG_HEAD``,
``COMMIT_EDITMSG``, ...), the other worktrees (their checkouts too), the rerere cache, grafts and the
commit-graph; it repacks the reachable objects into one pack (copying those that lived
only in an alternate object store), drops every other pack and loose object, and unlinks
the alternates. Submodules' repositories get the same, each kept at its checked-out
commit. The working tree is not touched; the repository's index is reset to the base.

It runs in the agent's sandbox only: the grading sandbox starts from the task's own
repository, so graders that check out files of the base commit still find them.
"""

from __future__ import annotations

import logging
import shlex

from agentrl.harnesses.errors import HarnessError
from agentrl.sandboxes.base import Sandbox

__all__ = ["scrub_history"]

logger = logging.getLogger(__name__)

#: Git as root in a repository the agent or the task made: any directory, and none of its
#: hooks or fsmonitor command ever runs (the diff capture uses it too).
ROOT_GIT = "git -c safe.directory='*' -c core.fsmonitor=false -c core.hooksPath=/dev/null"
#: ``ROOT_GIT`` with no automatic gc or maintenance, no new reflog entries, replace refs
#: ignored.
_GIT = (
    f"{ROOT_GIT} "
    "-c gc.auto=0 -c maintenance.auto=false -c core.logAllRefUpdates=false "
    "-c core.splitIndex=false -c repack.writeBitmaps=false"
)

#: Files and directories of a git dir that name or hold commits besides the refs.
_LEFTOVERS = (
    "logs FETCH_HEAD ORIG_HEAD MERGE_HEAD MERGE_MSG MERGE_MODE MERGE_AUTOSTASH AUTO_MERGE "
    "CHERRY_PICK_HEAD REVERT_HEAD REBASE_HEAD BISECT_LOG BISECT_START BISECT_TERMS "
    "BISECT_EXPECTED_REV BISECT_ANCESTORS_OK BISECT_NAMES BISECT_RUN SQUASH_MSG "
    "COMMIT_EDITMSG TAG_EDITMSG NOTES_EDITMSG EDIT_DESCRIPTION rebase-merge rebase-apply "
    "sequencer rr-cache lost-found gitk.cache info/refs info/grafts "
    "objects/info/packs "
    "objects/info/commit-graph objects/info/commit-graphs"
)

#: Exit code of the script when the git dir could not be made self-contained.
_REPACK_FAILED = 84

_SCRIPT = r"""
G() { __GIT__ "$@"; }
g() { G --git-dir="$gd" "$@"; }
# scrub GITDIR KEEP: only KEEP's history stays in GITDIR (KEEP '': no commit at all).
scrub() {
  gd=$1 keep=$2
  common=$(cd "$gd" && cd "$(g rev-parse --git-common-dir)" && pwd -P)
  head_ref=$(g symbolic-ref -q HEAD || true)
  g for-each-ref --format='delete %(refname)' | { grep -vxF "delete $head_ref" || true; } \
    | g update-ref --no-deref --stdin
  for r in $(g remote); do g remote remove "$r" >/dev/null 2>&1 || true; done
  here=$(cd "$gd" && pwd -P)
  for w in "$common"/worktrees/*; do
    if [ -d "$w" ] && [ "$(cd "$w" && pwd -P)" != "$here" ]; then rm -rf "$w"; fi
  done
  for d in "$gd" "$common"; do (cd "$d" && rm -rf __LEFTOVERS__); done
  # A kept or promisor pack would survive the repack whole, its unreachable objects too.
  rm -f "$common"/objects/pack/*.keep "$common"/objects/pack/*.promisor \
    "$common"/objects/pack/multi-pack-index*
  rm -rf "$common"/objects/pack/tmp_* "$common"/objects/incoming-*
  if [ -n "$keep" ]; then
    # -a without -l: the reachable objects of an alternate store are copied in.
    g repack -a -d -q || exit __REPACK_FAILED__
    rm -f "$common/objects/info/alternates"
    g cat-file -e "$keep^{tree}" || exit __REPACK_FAILED__
  else
    rm -rf "$common"/objects/pack/*
  fi
  rm -f "$common/objects/info/alternates" "$common/objects/info/http-alternates"
  rm -rf "$common"/objects/pack/tmp_*
  # After `repack -a -d` every reachable object is in the new pack: no loose one is.
  find "$common/objects" -mindepth 1 -maxdepth 1 -type d -name '[0-9a-f][0-9a-f]' \
    -exec rm -rf {} +
}
set -e
cd __WORKDIR__
command -v git >/dev/null || exit 0
G rev-parse --is-inside-work-tree >/dev/null 2>&1 || exit 0
cd "$(G rev-parse --show-toplevel)"
gitdir=$(cd "$(G rev-parse --git-dir)" && pwd -P)
keep=''
if [ -n "__BASE__" ]; then
  keep=$(G rev-parse -q --verify "__BASE__^{commit}" || true)
  if [ -z "$keep" ]; then echo AGENTRL_NO_BASE; fi
fi
if [ -z "$keep" ]; then keep=$(G rev-parse -q --verify 'HEAD^{commit}' || true); fi
if [ -z "$keep" ] && G rev-parse -q --verify HEAD >/dev/null; then
  echo "HEAD names a commit the repository does not have" >&2; exit __REPACK_FAILED__
fi
# `submodule foreach` visits the index's gitlinks (a shell script forking ~100 processes
# in some git versions): without a gitlink there is nothing for it to find.
subs=$({ if G ls-files --stage 2>/dev/null | grep -q '^160000 '; then
  G submodule foreach --quiet --recursive 'git rev-parse --absolute-git-dir' 2>/dev/null \
  || true; fi; find "$gitdir/modules" -name HEAD -type f 2>/dev/null \
  | sed 's,/HEAD$,,'; } | sort -u)
if [ -n "$keep" ]; then
  if [ "$keep" != "$(G rev-parse -q --verify HEAD || true)" ]; then echo AGENTRL_MOVED_HEAD; fi
  G reset -q --mixed "$keep"
fi
here=$(pwd -P)
# The other worktrees' checkouts (of other commits) go, with their directories.
G worktree list --porcelain 2>/dev/null | sed -n 's/^worktree //p' | while read -r w; do
  if [ "$(cd "$w" 2>/dev/null && pwd -P)" != "$here" ]; then
    G worktree remove -f -f "$w" >/dev/null 2>&1 || true
  fi
done
scrub "$gitdir" "$keep"
for s in $subs; do
  if [ -f "$s/HEAD" ] && [ -d "$s/objects" ]; then
    (scrub "$s" "$(G --git-dir="$s" rev-parse -q --verify 'HEAD^{commit}' || true)")
  fi
done
echo AGENTRL_SCRUBBED
"""


def scrub_script(workdir: str, base_commit: str | None = None) -> str:
    """The shell script :func:`scrub_history` runs as root (for tests and debugging)."""
    return (
        _SCRIPT.replace("__GIT__", _GIT)
        .replace("__LEFTOVERS__", _LEFTOVERS)
        .replace("__REPACK_FAILED__", str(_REPACK_FAILED))
        .replace("__WORKDIR__", shlex.quote(workdir))
        .replace("__BASE__", _commit_id(base_commit))
    )


def _commit_id(base_commit: str | None) -> str:
    value = (base_commit or "").strip()
    if value and not all(c in "0123456789abcdefABCDEF" for c in value):
        raise HarnessError(f"the task's base commit {base_commit!r} is not a commit id")
    return value


async def scrub_history(
    sandbox: Sandbox,
    workdir: str,
    *,
    base_commit: str | None = None,
    timeout: float = 600.0,
    instance_id: str = "",
) -> None:
    """Leave only the history reachable from ``base_commit`` (else HEAD) in ``workdir``.

    Runs as root in the agent's sandbox before the agent starts (see the module docstring
    for what goes). A ``base_commit`` that differs from HEAD becomes HEAD (the branch is
    moved there, the working tree stays); one the repository does not have is logged and
    HEAD is kept. A workdir that is not a git repository, or a sandbox without git, is
    left as it is. Raises ``HarnessError`` when the script fails (a repository whose
    objects are missing cannot be repacked).
    """
    result = await sandbox.exec(
        scrub_script(workdir, base_commit),
        user="root",
        env={
            "GIT_CONFIG_NOSYSTEM": "1",
            "HOME": "/tmp/agentrl-workspace",
            "GIT_NO_REPLACE_OBJECTS": "1",
        },
        timeout=timeout,
    )
    label = instance_id or workdir
    if "AGENTRL_NO_BASE" in result.stdout:
        logger.warning(
            "%s: the base commit %s is not in the repository; kept the history of HEAD",
            label,
            base_commit,
        )
    elif "AGENTRL_MOVED_HEAD" in result.stdout:
        logger.info("%s: moved HEAD to the base commit %s", label, base_commit)
    if result.exit_code != 0 or "AGENTRL_SCRUBBED" not in result.stdout:
        if result.exit_code == 0:  # not a repository, or no git: nothing to scrub
            return
        what = "could not be repacked" if result.exit_code == _REPACK_FAILED else "failed"
        raise HarnessError(
            f"removing the repository's other history in {workdir} {what} "
            f"(exit {result.exit_code}): {(result.stderr or result.stdout).strip()[-800:]}"
        )
