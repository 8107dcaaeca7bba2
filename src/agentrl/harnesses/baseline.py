"""The private baseline store: the workspace as the agent received it, out of its reach.

The agent's diff is taken against a git directory of our own, never against the
repository in the workdir (whose config, attributes, hooks, refs and objects the agent
can rewrite). :func:`store_script` builds it as root before the agent runs, under
``STORE_ROOT`` — a root-owned, mode 0755 directory in the sticky ``/tmp``, so an
unprivileged agent can read it but neither write, rename nor remove anything in it: a
fresh git dir (``HEAD``, ``objects``, ``refs``, nothing else: no config file), the
baseline tree's objects in one pack, the index the snapshot left (its stat data spares
the capture a rehash of unchanged files) and the work tree's path. Stat data can only
hide a change (an agent that forges a file's mtime back within the second the baseline
was taken), never make one up.

:func:`capture_script` runs as the agent user after :func:`kill_script` (as root) has
killed every process of that user and made a fresh scratch directory for it: a new git
dir there reads the store's objects through ``GIT_ALTERNATE_OBJECT_DIRECTORIES`` and
writes the work tree's new blobs to its own object dir. Every git command of both runs
with :data:`PINNED_CONFIG` on its command line, no system, global or XDG configuration,
our own ``HOME``, no ``GIT_*`` variable but ours, and ``info/attributes`` neutralising
every attribute that converts content or picks a diff driver (``info/attributes`` takes
precedence over every ``.gitattributes``), so nothing the agent wrote decides what git
runs or how it prints paths. Content is taken byte for byte (no EOL conversion, filter,
``ident`` or re-encoding).

The snapshot is ``git add -A`` of the work tree (its ``.gitignore`` files, the
``ignore`` patterns and the excluded paths apply to untracked files only). A directory
holding its own ``.git`` (a submodule checkout, a repository the agent made) is taken as
ordinary files: a placeholder index entry makes git walk into it instead of recording a
gitlink (a ``.git`` entry itself is never part of a tree); the diff never shows gitlinks.
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Sequence

__all__ = [
    "CAPTURE_EXITS",
    "PINNED_CONFIG",
    "SCRATCH_PREFIX",
    "STORE_ROOT",
    "capture_script",
    "kill_script",
    "store_path",
    "store_script",
]

#: Where the stores live: one per workdir, made by root before the agent runs.
STORE_ROOT = "/tmp/agentrl-baseline"
#: Each capture's scratch directory (its git dir, index, new objects and the diff).
SCRATCH_PREFIX = "/tmp/agentrl-capture."

#: Given to every git command with ``-c`` (the highest precedence there is).
PINNED_CONFIG: tuple[tuple[str, str], ...] = (
    ("safe.directory", "*"),
    ("core.autocrlf", "false"),
    ("core.safecrlf", "false"),
    ("core.eol", "lf"),
    ("core.fileMode", "true"),
    ("core.symlinks", "true"),
    ("core.ignoreCase", "false"),
    ("core.precomposeUnicode", "false"),
    ("core.quotePath", "false"),
    ("core.hooksPath", "/dev/null"),
    ("core.fsmonitor", "false"),
    ("core.untrackedCache", "false"),
    ("core.splitIndex", "false"),
    ("core.sparseCheckout", "false"),
    ("core.trustctime", "true"),
    ("core.checkStat", "default"),
    ("core.attributesFile", "/dev/null"),
    ("core.excludesFile", "/dev/null"),
    ("core.bigFileThreshold", "512m"),
    ("core.logAllRefUpdates", "false"),
    ("index.sparse", "false"),
    ("feature.manyFiles", "false"),
    ("add.ignoreErrors", "false"),
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
    ("diff.noprefix", "false"),
    ("diff.mnemonicPrefix", "false"),
    ("diff.relative", "false"),
    ("diff.renames", "false"),
    ("diff.ignoreSubmodules", "all"),
)

#: ``$GIT_DIR/info/attributes``: outranks every ``.gitattributes`` of the work tree.
NEUTRAL_ATTRIBUTES = "* -text !eol -filter !diff -ident !working-tree-encoding !crlf\n"

#: The diff's fixed form: a/ b/ prefixes, whole ids, binary patches, no renames, no
#: external diff or textconv, no gitlinks (``--no-relative`` is ``diff.relative=false``
#: above: the option is newer than some images' git).
DIFF_OPTIONS = (
    "--cached --binary --full-index --no-color --no-ext-diff --no-textconv --no-renames "
    "--src-prefix=a/ --dst-prefix=b/ --ignore-submodules=all --unified=3"
)

_WORKDIR_GONE, _STORE_GONE, _TOO_DEEP, _SURVIVORS, _NO_SCRATCH = 81, 83, 84, 86, 87
#: Exit codes of the kill and capture scripts, and what they mean.
CAPTURE_EXITS = {
    _WORKDIR_GONE: "the workdir is gone or cannot be entered",
    _STORE_GONE: "the private baseline store is gone or damaged",
    _TOO_DEEP: "the workspace nests git repositories too deep",
    _SURVIVORS: "processes of the agent user survived being killed",
    _NO_SCRATCH: "the capture's scratch directory is not usable",
}
#: How many levels of nested repositories the snapshot walks into.
MAX_NESTING = 64

_GIT = "git " + " ".join(f"-c {shlex.quote(f'{key}={value}')}" for key, value in PINNED_CONFIG)

#: Prints an index-info record (a placeholder file, ``$0`` the empty blob) for each nested
#: repository ``dir/`` among the NUL-separated untracked paths it gets...
_SEED = 'for p do case $p in */) printf "100644 %s\\t%s\\0" "$0" "$p.agentrl-nested";; esac; done'
#: ... and for each tracked path that is now a directory (git takes one holding a
#: repository for a gitlink, and fails on one without a commit).
_SEED_TRACKED = (
    'for p do [ -d "$p" ] && [ ! -L "$p" ] && '
    'printf "100644 %s\\t%s\\0" "$0" "$p/.agentrl-nested"; done; true'
)
#: Prints the path of each gitlink among NUL-separated ``ls-files -s`` records.
_GITLINKS = 'for e do case $e in 160000\\ *) printf "%s\\0" "${e#*\t}";; esac; done'


def store_path(workdir: str) -> str:
    """The store of the workspace at ``workdir``."""
    key = workdir.rstrip("/") or "/"
    return f"{STORE_ROOT}/{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def _pathspec(excludes: Sequence[str]) -> str:
    specs = ["."] + [f":(exclude){p}" for p in excludes if p]
    return " ".join(shlex.quote(s) for s in specs)


def _git_env(git_dir: str, index: str, home: str) -> str:
    """Shell that leaves git only our variables (``$top``: the work tree)."""
    return (
        "unset $(env | sed -n 's/^\\(GIT_[A-Za-z0-9_]*\\)=.*/\\1/p') 2>/dev/null\n"
        f'export GIT_DIR="{git_dir}" GIT_WORK_TREE="$top" GIT_INDEX_FILE="{index}" '
        f'HOME="{home}" XDG_CONFIG_HOME="{home}" GIT_CONFIG_NOSYSTEM=1 '
        "GIT_CONFIG_GLOBAL=/dev/null GIT_ATTR_NOSYSTEM=1 GIT_NO_REPLACE_OBJECTS=1 "
        "GIT_OPTIONAL_LOCKS=0 GIT_TERMINAL_PROMPT=0 LC_ALL=C\n"
        f'G() {{ {_GIT} "$@"; }}\n'
    )


def _git_dir(path: str, ignore: Sequence[str]) -> str:
    """Shell that makes a fresh git dir at ``path`` (it must not exist)."""
    patterns = "\n".join(ignore)
    return (
        f'mkdir "{path}" "{path}/objects" "{path}/refs" "{path}/info" || exit 1\n'
        f'echo "ref: refs/heads/baseline" > "{path}/HEAD"\n'
        f'printf %s {shlex.quote(NEUTRAL_ATTRIBUTES)} > "{path}/info/attributes"\n'
        f'printf "%s\\n" {shlex.quote(patterns)} > "{path}/info/exclude"\n'
    )


def _snapshot(tmp: str, excludes: Sequence[str]) -> str:
    """Shell that brings the index up to the work tree (``G``: our git)."""
    spec = _pathspec(excludes)
    return (
        f"empty=$(G hash-object -w --stdin < /dev/null)\n"
        "rounds=0\n"
        "while :; do\n"
        f"  {{ G ls-files -o -z --exclude-standard -- {spec} "
        f'| xargs -0 sh -c {shlex.quote(_SEED)} "$empty"\n'
        f"    G ls-files -z -- {spec} "
        f'| xargs -0 sh -c {shlex.quote(_SEED_TRACKED)} "$empty"\n'
        f'  }} > "{tmp}/seed"\n'
        f'  [ -s "{tmp}/seed" ] || break\n'
        f'  G update-index -z --index-info < "{tmp}/seed"\n'
        f"  rounds=$((rounds + 1)); [ $rounds -lt {MAX_NESTING} ] || exit {_TOO_DEEP}\n"
        "done\n"
        f"G add -A -- {spec}\n"
    )


def store_script(workdir: str, repo_git: str, problem_file: str, ignore: Sequence[str]) -> str:
    """Root's script that (re)builds the store of ``workdir`` and prints its tree id.

    ``repo_git`` runs git in the task's repository (still the task's: the agent has not
    run). The index starts from the repository's HEAD (tracked files stay tracked even
    where ignored), without its gitlinks; HEAD's objects are borrowed while the snapshot
    runs, then everything the tree needs is packed into the store.
    """
    store = store_path(workdir)
    return "".join(
        (
            "set -e\n",
            f"cd {shlex.quote(workdir)}\n",
            f'top=$({repo_git} rev-parse --show-toplevel); cd "$top"; top=$(pwd -P)\n',
            f"head=$({repo_git} rev-parse -q --verify 'HEAD^{{tree}}' || true)\n",
            f'objects=$(cd "$({repo_git} rev-parse --git-path objects)" && pwd -P)\n',
            "umask 022\n",
            f"R={store}\n",
            f"mkdir -p {STORE_ROOT}\n",
            # The agent could have made it in an earlier run of this sandbox: take it back.
            f"[ -O {STORE_ROOT} ] || {{ rm -rf {STORE_ROOT}; mkdir -m 0755 {STORE_ROOT}; }}\n",
            f"chmod 0755 {STORE_ROOT}\n",
            'rm -rf "$R"; mkdir -m 0755 "$R" "$R/home"\n',
            _git_dir("$R/git", ignore),
            _git_env("$R/git", "$R/index", "$R/home"),
            'export GIT_ALTERNATE_OBJECT_DIRECTORIES="$objects"\n',
            'if [ -n "$head" ]; then\n',
            '  G read-tree "$head"\n',
            f"  G ls-files -s -z | xargs -0 sh -c {shlex.quote(_GITLINKS)} sh ",
            "| G update-index -z --force-remove --stdin\n",
            "fi\n",
            _snapshot("$R", (problem_file,)),
            "tree=$(G write-tree)\n",
            'G rev-list --objects "$tree" ',
            '| G pack-objects -q --window=0 "$R/git/objects/pack/pack" > /dev/null\n',
            "unset GIT_ALTERNATE_OBJECT_DIRECTORIES\n",
            'rm -rf "$R"/git/objects/?? "$R/seed"\n',
            'G cat-file -e "$tree^{tree}"\n',
            'printf "%s\\n" "$top" > "$R/worktree"\n',
            'chmod -R a+rX,go-w "$R"\n',
            'echo "$tree"\n',
        )
    )


def kill_script(user: str) -> str:
    """Root's script that kills every process of ``user`` in the sandbox, then makes the
    capture's scratch directory for it (printed).

    Where root and the agent are one uid (a user namespace of one id: the ``local``
    backend, where every process shows the same uid), the agent's processes are those
    outside the session of pid 1 (the sandbox's own init, its exec supervisors and
    relays live there). Only shell builtins read ``/proc``: nothing the agent wrote runs.
    """
    q = shlex.quote(user)
    return (
        # Root's processes are the sandbox's own: an agent that is root has no leftovers
        # that could be told from them (and nothing to gain from a race).
        f"uid=''; [ {q} = root ] || uid=$(id -u {q} 2>/dev/null) || uid=''\n"
        'shared=0; read -r _ _ n 2>/dev/null < /proc/self/uid_map && [ "$n" = 1 ] && shared=1\n'
        "sid_of() { read -r l 2>/dev/null < /proc/$1/stat || return 1; "
        "set -- ${l##*) }; echo $4; }\n"
        'mine=$(sid_of $$); init=$(sid_of 1); spare=" 1 "; p=$$\n'
        'while [ "$p" -gt 1 ] 2>/dev/null; do spare="$spare$p "; '
        "read -r l 2>/dev/null < /proc/$p/stat || break; set -- ${l##*) }; p=$2; done\n"
        "rounds=0\n"
        'while [ -n "$uid" ]; do\n'
        "  found=''\n"
        "  for d in /proc/[0-9]*; do\n"
        '    p=${d#/proc/}; case $spare in *" $p "*) continue;; esac\n'
        '    read -r l 2>/dev/null < "$d/stat" || continue; set -- ${l##*) }\n'
        '    case $1 in Z|X|x) continue;; esac; [ "$4" = "$mine" ] && continue\n'
        '    if [ $shared = 1 ]; then [ "$4" = "$init" ] && continue\n'
        "    else u=''; while read -r k v _; do [ \"$k\" = Uid: ] && u=$v && break; done "
        '2>/dev/null < "$d/status"; [ "$u" = "$uid" ] || continue; fi\n'
        '    kill -KILL "$p" 2>/dev/null && found=1\n'
        "  done\n"
        '  [ -n "$found" ] || break\n'
        f"  rounds=$((rounds + 1)); [ $rounds -lt 200 ] || exit {_SURVIVORS}\n"
        "  sleep 0.05 2>/dev/null || sleep 1\n"
        "done\n"
        f"rm -rf {SCRATCH_PREFIX}* 2>/dev/null\n"
        f"S=$(mktemp -d {SCRATCH_PREFIX}XXXXXXXX) || exit {_NO_SCRATCH}\n"
        f'chown {q} "$S" 2>/dev/null\n'
        'echo "$S"\n'
    )


def capture_script(
    workdir: str, scratch: str, tree: str, excludes: Sequence[str], ignore: Sequence[str]
) -> str:
    """The agent user's script: the work tree against the store's ``tree`` into
    ``scratch/agent.diff``; prints the diff's size in bytes."""
    store = shlex.quote(store_path(workdir))
    s = shlex.quote(scratch)
    return "".join(
        (
            f"R={store}; S={s}\n",
            f'IFS= read -r top 2>/dev/null < "$R/worktree" || exit {_STORE_GONE}\n',
            # Modes git does not record: unreadable files and unenterable directories of
            # the agent's own are made readable again (the x bit git keeps is untouched).
            'chmod u+rx "$top" 2>/dev/null\n',
            f'cd "$top" 2>/dev/null || exit {_WORKDIR_GONE}\n',
            f'[ -d "$S" ] && [ -w "$S" ] || exit {_NO_SCRATCH}\n',
            "find . -name .git -prune -o -type d ! -perm -500 -exec chmod u+rx {} \\; ",
            "-o -type f ! -perm -400 -exec chmod u+r {} + 2>/dev/null\n",
            f'[ -r "$R/index" ] || exit {_STORE_GONE}\n',
            "set -e\n",
            # A re-sent exec (a backend retries an idempotent one) starts over.
            'rm -rf "$S/git" "$S/home"\n',
            _git_dir("$S/git", ignore),
            'mkdir "$S/home"\n',
            # With its own mtime: git re-reads every file changed in the second the
            # index was written ("racily clean"); a copy dated now would trust their stat.
            'cp "$R/index" "$S/index"\n',
            'touch -r "$R/index" "$S/index"\n',
            _git_env("$S/git", "$S/index", "$S/home"),
            'export GIT_ALTERNATE_OBJECT_DIRECTORIES="$R/git/objects"\n',
            f"G cat-file -e {shlex.quote(tree + '^{tree}')} 2>/dev/null || exit {_STORE_GONE}\n",
            _snapshot("$S", excludes),
            f'G diff {DIFF_OPTIONS} {shlex.quote(tree)} > "$S/agent.diff"\n',
            'wc -c < "$S/agent.diff"\n',
        )
    )
