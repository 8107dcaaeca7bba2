"""A grader-owned snapshot of the workdir, kept in a private git directory in the sandbox.

Before a diff is applied, every file and symlink of the workdir (ignored ones included,
``.git`` excluded) is hashed into a git directory under ``/tmp`` with a random name that
only the grader writes. Git runs there with a scrubbed environment and a fixed
configuration: no system or global config, attributes neutralised by
``$GIT_DIR/info/attributes``, no hooks, no fsmonitor, fixed diff prefixes. The repository's
own ``.git`` is never read for this; each ``.git`` of the tree gets its own snapshot (its
packs excepted: they are only checked for change), so a diff that writes into one is seen
and put back.

The listing uses ``find`` and ``git update-index``, not ``git add``: ``add`` treats a
directory holding a ``.git`` file as a nested repository and hides its files, which a diff
could use (``pkg/.git`` plus ``pkg/conftest.py``).

Comparing the tree with the snapshot re-reads only files whose stat data changed, so it
is cheap enough to run after every ladder rung. Putting paths back checks them out of the
snapshot exactly (contents, mode bits git keeps, symlinks), removes files that were not
there, and removes directories the snapshot did not have once they are empty.

All of it is bash text (:data:`LIBRARY`) that ``agentrl.graders.patching`` runs in one
exec with the ladder between; :class:`TreeStore` holds the paths and reads the results.
"""

from __future__ import annotations

import posixpath
import shlex
import uuid

import attrs

from agentrl.sandboxes.base import Sandbox, SandboxError

__all__ = [
    "ATTRIBUTES",
    "GIT_CONFIG",
    "LIBRARY",
    "Change",
    "TreeStore",
    "parse_changes",
]

#: Overrides every in-tree ``.gitattributes`` that could change what git reads or writes.
ATTRIBUTES = "* -text !eol -filter !diff -ident !working-tree-encoding -crlf"

#: The configuration every git command of the store runs with (nothing else is read).
GIT_CONFIG: tuple[str, ...] = (
    "core.autocrlf=false",
    "core.safecrlf=false",
    "core.filemode=true",
    "core.symlinks=true",
    "core.ignorecase=false",
    "core.precomposeunicode=false",
    "core.protectNTFS=false",
    "core.protectHFS=false",
    "core.fsmonitor=false",
    "core.untrackedCache=false",
    "core.splitIndex=false",
    "core.sparseCheckout=false",
    "core.hooksPath=/dev/null",
    "core.attributesFile=/dev/null",
    "core.excludesFile=/dev/null",
    "core.looseCompression=1",
    "core.trustctime=true",
    "core.checkStat=default",
    "diff.external=",
    "diff.noprefix=false",
    "diff.mnemonicPrefix=false",
    "diff.relative=false",
    "diff.renames=false",
    "diff.algorithm=myers",
    "gc.auto=0",
    "maintenance.auto=false",
)

_NO_WORKDIR = 90
_NO_GIT = 91
_NO_TOOLS = 94

#: The bash functions of the store. ``W`` (the workdir) and ``S`` (the store) are set first.
LIBRARY = r"""
set -u
export LC_ALL=C
cd "$W" || exit {no_workdir}
# Executables a diff adds under the workdir never stand in for the grader's tools.
set -f; _p=''; _ifs=$IFS; IFS=:
for _d in $PATH; do
  case "$_d" in /*) ;; *) continue ;; esac
  case "$_d/" in "$W"/*) continue ;; esac
  _p="$_p${{_p:+:}}$_d"
done
IFS=$_ifs; set +f; PATH=${{_p:-/usr/local/bin:/usr/bin:/bin}}; export PATH
GIT=$(command -v git) || {{ echo 'git is not installed in the grading sandbox' >&2; exit {no_git}; }}
{{ find . -maxdepth 0 -printf '' && sort -z < /dev/null && comm -z /dev/null /dev/null; }} \
  > /dev/null 2>&1 || exit {no_tools}
WT=$W; IDX=$S/index; DG=''
g() {{
  env -i PATH="$PATH" HOME="$S/home" XDG_CONFIG_HOME="$S/home" LC_ALL=C \
    GIT_DIR="$S/git" GIT_WORK_TREE="$WT" GIT_INDEX_FILE="$IDX" \
    GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null GIT_OPTIONAL_LOCKS=0 \
    GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=safe.directory GIT_CONFIG_VALUE_0='*' \
    "$GIT" {config} "$@"
}}
# What a store holds of the tree in $PWD: files and symlinks (dirs: directories), without
# .git and installed packages (compared apart); in a git dir (DG set), without its objects.
_skip() {{
  if [ -n "$DG" ]; then find . \( -path '*/objects/pack' -o -path '*/objects/[0-9a-f][0-9a-f]' \) "$@"
  else find . \( -name .git -o -name node_modules -o -name site-packages -o -name dist-packages \) "$@"; fi
}}
files() {{ _skip -prune -o \( -type f -o -type l \) -printf '%P\0' | sort -z; }}
dirs() {{ _skip -prune -o -type d -printf '%P\0' | sort -z; }}
# A git dir's object files, and installed packages: never rewritten by git or a fix, so
# compared by a listing (inode, size, type; installed files also by mtime), not stored.
objects() {{
  [ -z "$DG" ] || find . \( -path '*/objects/pack/*' -o -path '*/objects/[0-9a-f][0-9a-f]/*' \) \
    -type f -printf '%i %s %P\n' | sort
}}
installed_roots() {{
  find . -name .git -prune -o \( -name node_modules -o -name site-packages -o -name dist-packages \) \
    -printf '%P\0' -prune | sort -z
}}
installed() {{ xargs -0r sh -c 'exec find "$@" -printf "%i %s %y %T@ %p\\n"' _ < "$S/installed.roots" | sort; }}
# take D: snapshot the tree in $PWD into store directory D (IDX=D/index).
take() {{
  files | g update-index --add -z --stdin || return 1
  g write-tree > "$1/base" && cp "$1/index" "$1/index.base" && dirs > "$1/dirs" && objects > "$1/objects"
}}
# changed D: the index follows the tree (only files whose stat data changed are read),
# then D/changes holds every difference from the snapshot (diff-index --raw -z).
changed() {{
  files > "$1/now"
  g ls-files -z | sort -z | comm -z -23 - "$1/now" | g update-index --force-remove -z --stdin &&
  g update-index --add --replace -z --stdin < "$1/now" &&
  g diff-index --cached --no-renames --raw --abbrev=40 -z "$(cat "$1/base")" > "$1/changes"
}}
# put_back D LIST: the paths of LIST (diff-index --raw -z) go back to the snapshot of D.
put_back() {{
  : > "$1/rm"; : > "$1/co"
  while IFS= read -r -d '' _st && IFS= read -r -d '' _path; do
    if [ "${{_st##* }}" = A ]; then printf '%s\0' "$_path" >> "$1/rm"; else printf '%s\0' "$_path" >> "$1/co"; fi
  done < "$2"
  xargs -0r rm -f -- < "$1/rm"
  IDX=$1/index.base g checkout-index -f -z --stdin < "$1/co" || return 1
  dirs > "$1/dirs.now"
  comm -z -13 "$1/dirs" "$1/dirs.now" | sort -rz | xargs -0r rmdir -- 2>/dev/null
  comm -z -23 "$1/dirs" "$1/dirs.now" | xargs -0r mkdir -p --
  return 0
}}
# revert D: the whole tree back to the snapshot of D; a path moved out of the way (a
# symlink over a directory) can hide others, so compare again until nothing differs.
revert() {{
  for _round in 1 2 3; do
    changed "$1" || return 1
    [ -s "$1/changes" ] || return 0
    put_back "$1" "$1/changes" || return 1
  done
  changed "$1" && [ ! -s "$1/changes" ]
}}
# The .git entries of the tree (directories, gitfiles, links), one store each under $S/dg.
gitdirs() {{ find . -name .git -printf '%P\0' -prune | sort -z; }}
dotgit_take() {{
  gitdirs > "$S/dg/roots"; _n=0
  while IFS= read -r -d '' _r; do
    _n=$((_n + 1)); mkdir "$S/dg/$_n" || return 1
    if [ -d "$_r" ] && [ ! -L "$_r" ]; then
      (cd "$_r" && WT=$PWD IDX=$S/dg/$_n/index DG=1 && take "$S/dg/$_n") || return 1
    else
      cp -P -- "$_r" "$S/dg/$_n/entry" || return 1
    fi
  done < "$S/dg/roots"
}}
_same_entry() {{
  if [ -L "$2" ]; then [ -L "$1" ] && [ "$(readlink -- "$1")" = "$(readlink -- "$2")" ]
  else [ -f "$1" ] && [ ! -L "$1" ] && cmp -s -- "$1" "$2"; fi
}}
# set_aside_revert: every .git back to its snapshot, new .git and installed-package
# directories removed; what the diff wrote there (not git's own index) is listed in
# $S/report.git and $S/report.installed, what cannot be put back (an object file of git,
# an installed package changed) in $S/tampered.
set_aside_revert() {{
  : > "$S/report.git"; : > "$S/report.installed"
  installed_roots | comm -z -13 "$S/installed.roots" - > "$S/installed.new"
  while IFS= read -r -d '' _r; do rm -rf -- "$_r"; printf '%s\0' "$_r" >> "$S/report.installed"; done < "$S/installed.new"
  installed | cmp -s - "$S/installed" || printf 'installed packages\n' >> "$S/tampered"
  gitdirs | comm -z -13 "$S/dg/roots" - > "$S/dg/new"
  while IFS= read -r -d '' _r; do rm -rf -- "$_r"; printf '%s\0' "$_r" >> "$S/report.git"; done < "$S/dg/new"
  _n=0
  while IFS= read -r -d '' _r; do
    _n=$((_n + 1)); _d=$S/dg/$_n
    if [ -e "$_d/entry" ] || [ -L "$_d/entry" ]; then
      _same_entry "$_r" "$_d/entry" && continue
      rm -rf -- "$_r"; cp -P -- "$_d/entry" "$_r" || return 1
      printf '%s\0' "$_r" >> "$S/report.git"; continue
    fi
    if [ -L "$_r" ] || [ ! -d "$_r" ]; then
      rm -f -- "$_r"; mkdir -- "$_r" || return 1; printf '%s\0' "$_r" >> "$S/report.git"
    fi
    (
      cd "$_r" && WT=$PWD IDX=$_d/index DG=1 || exit 1
      changed "$_d" || exit 1
      while IFS= read -r -d '' _st && IFS= read -r -d '' _path; do
        [ "$_path" = index ] && continue
        printf '%s\0' "$_r/$_path" >> "$S/report.git"
      done < "$_d/changes"
      objects | comm -23 "$_d/objects" - | grep -q . && printf '%s objects\n' "$_r" >> "$S/tampered"
      revert "$_d"
    ) || return 1
  done < "$S/dg/roots"
}}
# snapshot: the store, the tree's snapshot, every .git's, the installed packages' listing.
snapshot() {{
  mkdir -m 700 -- "$S" && mkdir -- "$S/home" "$S/dg" || return 1
  g init -q --template= >/dev/null || return 1
  mkdir -p -- "$S/git/info" && printf '%s\n' '{attributes}' > "$S/git/info/attributes" || return 1
  installed_roots > "$S/installed.roots" && installed > "$S/installed" || return 1
  take "$S" && dotgit_take
}}
""".format(
    no_workdir=_NO_WORKDIR,
    no_git=_NO_GIT,
    no_tools=_NO_TOOLS,
    config=" ".join(f"-c {shlex.quote(item)}" for item in GIT_CONFIG),
    attributes=ATTRIBUTES,
)


@attrs.frozen(kw_only=True)
class Change:
    """One path that differs between the tree and the snapshot.

    ``status`` is git's letter (``A`` added, ``M`` modified, ``D`` deleted, ``T`` type
    changed); the modes are git's (``100644``, ``100755``, ``120000`` for a symlink,
    ``000000`` where there is none).
    """

    status: str
    path: str
    old_mode: str = "000000"
    new_mode: str = "000000"

    @property
    def symlink(self) -> bool:
        """Whether the path is a symlink now."""
        return self.new_mode == "120000"


def parse_changes(raw: bytes) -> list[Change]:
    """``git diff-index --raw -z`` output as Changes (paths decoded from UTF-8)."""
    fields = raw.split(b"\0")
    if fields and fields[-1] == b"":
        fields.pop()
    changes = []
    for i in range(0, len(fields) - 1, 2):
        old_mode, new_mode, _, _, status = fields[i].decode().lstrip(":").split(" ")
        changes.append(
            Change(
                status=status[:1], path=_decode(fields[i + 1]), old_mode=old_mode, new_mode=new_mode
            )
        )
    return changes


def raw_changes(changes: list[Change]) -> bytes:
    """``changes`` back in the ``--raw -z`` shape the store's ``put_back`` reads."""
    zero = "0" * 40
    return b"".join(
        f":{c.old_mode} {c.new_mode} {zero} {zero} {c.status}".encode()
        + b"\0"
        + _encode(c.path)
        + b"\0"
        for c in changes
    )


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", errors="surrogateescape")


def _encode(path: str) -> bytes:
    return path.encode("utf-8", errors="surrogateescape")


class TreeStore:
    """Where one grading sandbox keeps the snapshot of ``workdir``: the shell to reach it,
    and the reads of what it found."""

    def __init__(self, sandbox: Sandbox, workdir: str, *, user: str, timeout: float) -> None:
        self.sandbox = sandbox
        self.workdir = posixpath.normpath(workdir)
        self.user = user
        self.timeout = timeout
        self.root = f"/tmp/agentrl-tree-{uuid.uuid4().hex}"

    def script(self, body: str) -> str:
        """``body`` after the store's variables and functions (:data:`LIBRARY`)."""
        return f"W={shlex.quote(self.workdir)}\nS={shlex.quote(self.root)}\n{LIBRARY}\n{body}\n"

    async def run(self, body: str) -> tuple[int, str, str]:
        """Run ``body`` with the store's functions; ``(exit code, stdout, stderr)``.

        Raises ``SandboxError`` for a missing workdir, a sandbox without git, or a command
        past the timeout.
        """
        result = await self.sandbox.exec(
            f"bash -c {shlex.quote(self.script(body))}",
            user=self.user,
            timeout=self.timeout,
            idempotent=False,
        )
        if result.exit_code == _NO_WORKDIR:
            raise SandboxError(
                f"the workdir {self.workdir} does not exist in the grading sandbox; check the "
                "task's workdir and repository"
            )
        if result.exit_code == _NO_GIT:
            raise SandboxError("git is not installed in the grading sandbox; grading needs it")
        if result.exit_code == _NO_TOOLS:
            raise SandboxError(
                "the grading sandbox lacks GNU find or coreutils (find -printf, sort -z, "
                "comm -z), which grading needs to snapshot the workdir; use an image with them"
            )
        return result.exit_code, result.stdout, result.stderr

    async def read(self, name: str, missing: bytes | None = b"") -> bytes | None:
        """A file the store's scripts wrote (``changes``, ``tampered``, …), or ``missing``."""
        try:
            data = await self.sandbox.read_file(f"{self.root}/{name}", user=self.user, text=False)
        except FileNotFoundError:
            return missing
        return data if isinstance(data, bytes) else data.encode()

    async def write_list(self, name: str, items: list[str]) -> str:
        """Write ``items`` NUL-separated into the store; returns the file's path."""
        path = f"{self.root}/{name}"
        await self.sandbox.write_file(
            path, b"".join(_encode(i) + b"\0" for i in items), user=self.user
        )
        return path

    async def changes(self) -> list[Change]:
        """What the last ``changed "$S"`` found."""
        return parse_changes(await self.read("changes") or b"")

    async def set_aside_report(self) -> tuple[list[str], list[str], list[str]]:
        """What the rung wrote where the store does not look: ``(paths under a .git, new
        installed-package directories, what could not be put back)``."""
        git = [_decode(p) for p in (await self.read("report.git") or b"").split(b"\0") if p]
        installed = [
            _decode(p) for p in (await self.read("report.installed") or b"").split(b"\0") if p
        ]
        tampered = (await self.read("tampered") or b"").decode(errors="replace").splitlines()
        return list(dict.fromkeys(git)), installed, list(dict.fromkeys(tampered))

    async def blobs(self, paths: list[str], *, now: bool) -> dict[str, bytes | None]:
        """The content git holds for each of ``paths``: in the snapshot, or (``now``) in the
        tree as last compared (a symlink's is its target). None where there is no file."""
        if not paths:
            return {}
        listing = await self.write_list("wanted", paths)
        where = '""' if now else '"$(cat "$S/base")"'
        body = (
            'rm -rf "$S/blobs" && mkdir "$S/blobs" && _i=0\n'
            "while IFS= read -r -d '' _path; do _i=$((_i + 1))\n"
            f'  g cat-file blob {where}":$_path" > "$S/blobs/$_i" 2>/dev/null '
            '|| rm -f "$S/blobs/$_i"\n'
            f"done < {shlex.quote(listing)}"
        )
        await self.run(body)
        found: dict[str, bytes | None] = {}
        for index, path in enumerate(paths, start=1):
            data = await self.read(f"blobs/{index}", missing=None)
            found[path] = data
        return found

    async def existed(self, paths: list[str]) -> set[str]:
        """Which of ``paths`` (files or directories) the snapshot had."""
        if not paths:
            return set()
        listing = await self.write_list("probe", paths)
        body = (
            "while IFS= read -r -d '' _path; do\n"
            '  if [ -n "$(g ls-tree --name-only "$(cat "$S/base")" -- "$_path")" ]; then '
            "printf '%s\\0' \"$_path\"; fi\n"
            f'done < {shlex.quote(listing)} > "$S/probe.out"'
        )
        await self.run(body)
        return {_decode(p) for p in (await self.read("probe.out")).split(b"\0") if p}

    async def close(self) -> None:
        """Remove the store from the sandbox (best effort: the sandbox goes away anyway)."""
        await self.sandbox.exec(
            f"rm -rf -- {shlex.quote(self.root)}", user=self.user, timeout=60, idempotent=True
        )
