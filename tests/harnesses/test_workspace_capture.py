"""The agent's diff comes from the private baseline, whatever the agent did to git.

Real sandboxes, real git; every hostile edit is made as the agent user. Each captured diff
is applied with ``git apply -p1`` to a fresh copy of the base on this host and the result
compared with the sandbox's work tree: paths, types, the exec bit, contents, link targets
(``.git`` entries and the problem statement aside: git never holds the former, the
capture leaves out the latter).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrl.harnesses.errors import HarnessError
from agentrl.harnesses.workspace import capture_diff, prepare_workspace
from agentrl.sandboxes.docker import DockerSandbox
from agentrl.sandboxes.local import LocalSandbox
from agentrl.types import Task

pytestmark = pytest.mark.slow

STATEMENT = "PROBLEM_STATEMENT.md"

#: Prints ``{path: [kind, ...]}`` of a tree as JSON (run here and in the sandbox alike).
MANIFEST = r"""
import hashlib, json, os, stat, sys

def manifest(root, skip=()):
    found = {}
    def walk(path, rel):
        for entry in sorted(os.scandir(path), key=lambda e: e.name):
            if entry.name == ".git" or (not rel and entry.name in skip):
                continue
            sub = rel + "/" + entry.name if rel else entry.name
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                found[sub] = ["link", os.readlink(entry.path)]
            elif stat.S_ISDIR(st.st_mode):
                walk(entry.path, sub)
            elif stat.S_ISREG(st.st_mode):
                with open(entry.path, "rb") as f:
                    found[sub] = ["file", bool(st.st_mode & 0o100), hashlib.sha256(f.read()).hexdigest()]
            else:
                found[sub] = ["other"]
    walk(root, "")
    return found

if __name__ == "__main__":
    print(json.dumps(manifest(sys.argv[1], sys.argv[2:])))
"""
_namespace: dict = {}
exec(compile(MANIFEST.replace('__name__ == "__main__"', "False"), "manifest", "exec"), _namespace)
manifest = _namespace["manifest"]

#: Programs a hostile config points git at: each leaves a marker in /tmp if it ever runs.
PROGRAMS = r"""
mkdir -p /tmp/h/hooks
for n in ext tc clean smudge process fsm; do
  printf '#!/bin/sh\ntouch /tmp/pwned-%s\ncat "$@"\n' $n > /tmp/h/$n.sh; chmod +x /tmp/h/$n.sh
done
for hook in pre-commit post-index-change post-checkout reference-transaction pre-auto-gc; do
  printf '#!/bin/sh\ntouch /tmp/pwned-hook\n' > /tmp/h/hooks/$hook; chmod +x /tmp/h/hooks/$hook
done
"""
FILTER = (
    "git config filter.evil.clean /tmp/h/clean.sh && git config filter.evil.smudge "
    "/tmp/h/smudge.sh && git config filter.evil.process /tmp/h/process.sh && "
    "git config filter.evil.required true"
)
GLOBAL = r"""
mkdir -p ~/.config/git
printf '[diff]\n\tnoprefix = true\n\texternal = /tmp/h/ext.sh\n[filter "evil"]\n\tclean = /tmp/h/clean.sh\n[diff "evil"]\n\ttextconv = /tmp/h/tc.sh\n[core]\n\tattributesFile = /tmp/h/attributes\n\tfsmonitor = /tmp/h/fsm.sh\n\thooksPath = /tmp/h/hooks\n' > ~/.gitconfig
printf '* filter=evil diff=evil\n' | tee /tmp/h/attributes > ~/.config/git/attributes
"""
OTHER_REPO = (
    "mkdir -p /tmp/other && git -C /tmp/other init -q && echo other > /tmp/other/o && "
    "git -C /tmp/other add o && git -C /tmp/other -c user.name=a -c user.email=a@b commit -qm o"
)
NESTED = r"""
mkdir -p vendor/lib && git -C vendor/lib init -q && echo lib > vendor/lib/lib.py
git -C vendor/lib add lib.py && git -C vendor/lib -c user.name=a -c user.email=a@b commit -qm lib
mkdir -p vendor/lib/inner && git -C vendor/lib/inner init -q && echo deep > vendor/lib/inner/deep.txt
mkdir -p scratch && git -C scratch init -q && echo s > scratch/s.txt
mkdir -p fake && echo 'gitdir: /nowhere' > fake/.git && echo f > fake/f.txt
git -C pkg init -q
"""
#: A background process of the agent's that keeps writing after the agent is done.
RACER = (
    "setsid sh -c 'while :; do echo x >> racer.txt; sleep 0.01; done' "
    "< /dev/null > /dev/null 2>&1 &"
)

#: attack -> (shell run as the agent before its edits, shell run after them).
HOSTILE = {
    "noprefix": ("git config diff.noprefix true", ""),
    "mnemonic-prefix": ("git config diff.mnemonicPrefix true", ""),
    "relative-sub": ("git config diff.relative sub", ""),
    "external-diff": ("git config diff.external /tmp/h/ext.sh", ""),
    "textconv-gitattributes": (
        "echo '*.py diff=evil' > .gitattributes && git config diff.evil.textconv /tmp/h/tc.sh",
        "",
    ),
    "textconv-info-attributes": (
        "echo '*.py diff=evil' > .git/info/attributes && "
        "git config diff.evil.textconv /tmp/h/tc.sh",
        "",
    ),
    "clean-filter-gitattributes": (f"echo '*.py filter=evil' > .gitattributes && {FILTER}", ""),
    "clean-filter-info-attributes": (
        f"mkdir -p .git/info && echo '*.py filter=evil' > .git/info/attributes && {FILTER}",
        "",
    ),
    "global-config-and-attributes": (GLOBAL, ""),
    "autocrlf-text-eol-crlf": (
        "git config core.autocrlf true && printf '* text eol=crlf\\n' > .gitattributes",
        "",
    ),
    "binary-and-no-diff-attributes": (
        "printf '*.py binary\\n*.md -diff\\n*.txt -text\\n[attr]evil -diff\\n*.sh evil\\n' "
        "> .gitattributes",
        "",
    ),
    "ident-and-encoding": (
        "printf '*.py ident\\n*.txt working-tree-encoding=UTF-16LE\\n' > .gitattributes && "
        "printf '\\377\\376h\\000i\\000\\n\\000' > utf16.txt && printf '$Id$\\n' > ident.py",
        "",
    ),
    "rewritten-baseline-ref": (
        "",
        "c=$(git -c user.name=a -c user.email=a@b commit-tree -m x $(git mktree < /dev/null)) && "
        "git update-ref refs/agentrl/baseline $c && git update-ref HEAD $c",
    ),
    "deleted-git": ("", "rm -rf .git"),
    "replaced-git": ("", f"{OTHER_REPO} && rm -rf .git && echo 'gitdir: /tmp/other/.git' > .git"),
    "worktree-elsewhere": (
        "mkdir -p /tmp/elsewhere && echo x > /tmp/elsewhere/f && "
        "git config core.worktree /tmp/elsewhere",
        "",
    ),
    "hooks-and-fsmonitor": (
        "git config core.hooksPath /tmp/h/hooks && git config core.fsmonitor /tmp/h/fsm.sh && "
        "cp /tmp/h/hooks/* .git/hooks/",
        "",
    ),
    "staged-and-committed": (
        "",
        "git add -A && git -c user.name=a -c user.email=a@b commit -qm mine && "
        "echo later >> pkg/new.py && echo staged > staged.txt && git add staged.txt",
    ),
    "nested-repositories": ("", NESTED),
    "leftover-process": ("", RACER),
}

#: What every scenario's agent does to the base (as the agent user, in the workdir).
EDITS = r"""
set -e
printf 'VALUE = 2\r\n' > pkg/mod.py
printf 'new\n' > pkg/new.py
rm README.md
printf '\000\001\377binary' > data.bin
chmod +x pkg/mod.py
chmod -x run.sh
ln -sfn README.md link
mkdir -p 'dir with space/ünï'
printf 'x\n' > 'dir with space/ünï/名前 .txt'
printf 'odd\n' > "$(printf 'tab\there\nnewline')"
mv sub/deep/notes.txt sub/moved.txt
: > empty.txt
printf 'y\r\n' > crlf.txt
"""


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(cwd),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CEILING_DIRECTORIES": str(cwd.parent),
        "GIT_AUTHOR_NAME": "dev",
        "GIT_AUTHOR_EMAIL": "dev@example.com",
        "GIT_COMMITTER_NAME": "dev",
        "GIT_COMMITTER_EMAIL": "dev@example.com",
    }
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, check=False)


@pytest.fixture
def base(tmp_path) -> Path:
    """A committed repository: text (one file CRLF), binary, an executable, a symlink."""
    repo = tmp_path / "repo"
    for path, data in {
        "pkg/__init__.py": b"",
        "pkg/mod.py": b"VALUE = 1\n",
        "tests/test_mod.py": b"from pkg.mod import VALUE\n\ndef test():\n    assert VALUE == 2\n",
        "README.md": b"hello\r\nworld\n",
        "data.bin": b"\x00\x01\x02binary",
        "run.sh": b"#!/bin/sh\necho run\n",
        "sub/deep/notes.txt": b"notes\n",
    }.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_bytes(data)
    (repo / "run.sh").chmod(0o755)
    (repo / "link").symlink_to("pkg/mod.py")
    for args in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"]):
        assert _run(args, repo).returncode == 0
    assert _run(["git", "commit", "-qm", "base"], repo).returncode == 0
    return repo


def assert_fixed_headers(diff: str) -> None:
    """Every file's header has git's own a/ and b/ prefixes, and binary files a patch."""
    in_header = False
    for line in diff.split("\n"):
        if line.startswith("diff --git "):
            assert line.startswith(("diff --git a/", 'diff --git "a/')), line
            assert " b/" in line or ' "b/' in line, line
            in_header = True
        elif in_header and line.startswith(("@@", "GIT binary patch")):
            in_header = False
        elif in_header and line.startswith("--- "):
            assert line.startswith(("--- a/", '--- "a/', "--- /dev/null")), line
        elif in_header and line.startswith("+++ "):
            assert line.startswith(("+++ b/", '+++ "b/', "+++ /dev/null")), line
        elif in_header:
            assert not line.startswith(("Binary files", "Subproject commit")), line


def applied(base: Path, diff: str, dest: Path) -> dict:
    """The manifest of a fresh copy of ``base`` with ``diff`` applied by ``git apply -p1``."""
    shutil.copytree(base, dest, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    if diff:
        patch = dest.parent / f"{dest.name}.diff"
        patch.write_bytes(diff.encode("utf-8", errors="surrogateescape"))
        done = _run(["git", "apply", "-p1", str(patch)], dest)
        assert done.returncode == 0, done.stderr.decode(errors="replace")
    return manifest(str(dest))


async def sandbox_manifest(box, workdir: str) -> dict:
    listed = await box.exec(f"python3 -c '{MANIFEST}' {workdir} {STATEMENT}", timeout=120)
    assert listed.exit_code == 0, listed.stderr
    return json.loads(listed.stdout)


async def agent(box, script: str, workdir: str = "/workspace") -> None:
    done = await box.exec(script, user="agent", workdir=workdir, timeout=120)
    assert done.exit_code == 0, (script, done.stdout, done.stderr)


async def assert_no_program_ran(box) -> None:
    markers = await box.exec("ls /tmp/pwned-* 2>/dev/null", timeout=30)
    assert markers.stdout == "", f"a program the agent chose ran: {markers.stdout}"


@pytest.mark.parametrize("attack", sorted(HOSTILE))
async def test_a_hostile_repository_cannot_steer_the_diff(base, tmp_path, attack):
    """Attack: the agent's git config, attributes (in the tree, .git/info, its global
    config), refs, hooks, fsmonitor, its .git itself, nested repositories or a process
    left running try to change what the capture runs or prints. Bound: no program of the
    agent's runs, every header has a/ and b/, and the diff applied to a fresh copy of the
    base reproduces the work tree exactly."""
    before, after = HOSTILE[attack]
    async with LocalSandbox(repo=str(base)) as box:
        baseline = await prepare_workspace(box, Task(instance_id=attack, problem_statement="x"))
        await agent(box, PROGRAMS)
        if before:
            await agent(box, before)
        await agent(box, EDITS)
        if after:
            await agent(box, after)
        diff = await capture_diff(box, "/workspace", baseline, (STATEMENT,))
        assert_fixed_headers(diff)
        assert "+VALUE = 2" in diff and "GIT binary patch" in diff
        assert applied(base, diff, tmp_path / "applied") == await sandbox_manifest(
            box, "/workspace"
        )
        await assert_no_program_ran(box)
        if attack == "leftover-process":
            alive = await box.exec("grep -l 'race[r]' /proc/[0-9]*/cmdline 2>/dev/null")
            assert alive.stdout == ""


async def test_files_and_directories_made_unreadable_are_still_captured(base, tmp_path):
    """Attack: the agent changes files, then takes every permission off them, off a
    directory and off the workdir itself (modes git does not keep). Bound: the capture,
    run as the agent, reads them anyway; the diff reproduces the work tree."""
    async with LocalSandbox(repo=str(base)) as box:
        baseline = await prepare_workspace(box, Task(instance_id="modes", problem_statement="x"))
        await agent(box, EDITS)
        await agent(box, "chmod 000 pkg/new.py sub/moved.txt && chmod 000 sub pkg && chmod 000 .")
        diff = await capture_diff(box, "/workspace", baseline, (STATEMENT,))
        assert "+new" in diff and "sub/moved.txt" in diff
        assert applied(base, diff, tmp_path / "applied") == await sandbox_manifest(
            box, "/workspace"
        )


async def test_a_root_agent_is_captured_as_root_and_nothing_is_killed(base, tmp_path):
    """With agent_user="root" there is nothing to protect: root's processes are left
    alone and the diff is still taken (as root)."""
    async with LocalSandbox(repo=str(base)) as box:
        task = Task(instance_id="root", problem_statement="x")
        baseline = await prepare_workspace(box, task, user="root")
        started = await box.exec(f"{RACER} cd /workspace && {EDITS}", workdir="/workspace")
        assert started.exit_code == 0, started.stderr
        diff = await capture_diff(box, "/workspace", baseline, (STATEMENT,), user="root")
        assert "+VALUE = 2" in diff
        alive = await box.exec("grep -l 'race[r]' /proc/[0-9]*/cmdline 2>/dev/null")
        assert alive.stdout != ""


async def test_a_baseline_the_agent_damaged_fails_the_capture_by_name(base):
    """Attack (local only: there the agent shares root's host uid): lock the private
    baseline. Bound: HarnessError naming the baseline, never a diff against something else."""
    async with LocalSandbox(repo=str(base)) as box:
        baseline = await prepare_workspace(box, Task(instance_id="lock", problem_statement="x"))
        await agent(box, "chmod 000 /tmp/agentrl-baseline")
        with pytest.raises(HarnessError, match="private baseline store is gone or damaged"):
            await capture_diff(box, "/workspace", baseline, (STATEMENT,))


# -- the property test ---------------------------------------------------------------------

_NAME = st.text(alphabet=list("abXZ09 _-.éü日\t\n'\"\\"), min_size=1, max_size=5).filter(
    lambda name: name not in (".", "..")
)
#: Without ---/+++ lines (an empty, binary or mode-only file) ``git apply`` splits the
#: ``diff --git`` line itself and cannot where a directory name ends in a space.
_PATH = st.lists(_NAME, min_size=1, max_size=3).map("/".join).filter(lambda p: " /" not in p)
_CONTENT = st.one_of(
    st.just(b""),
    st.binary(max_size=48),
    st.text(alphabet="ab \t\r\né", max_size=40).map(str.encode),
)
#: Link targets no generated path can equal: a link that loops back through the tree
#: (``0 -> 0``, later replaced by a directory) makes ``git apply`` itself fail (ELOOP).
_TARGET = st.sampled_from(["/etc/passwd", "../up", "nowhere/x", "tree dir/ünï"])


@st.composite
def _examples(draw):
    base = draw(
        st.dictionaries(
            _PATH,
            st.one_of(
                st.tuples(st.just("file"), _CONTENT, st.booleans()),
                st.tuples(st.just("link"), _TARGET),
            ),
            min_size=1,
            max_size=6,
        )
    )
    path = st.one_of(st.sampled_from(sorted(base)), _PATH)
    op = st.one_of(
        st.tuples(st.just("write"), path, _CONTENT.map(base64.b64encode).map(bytes.decode)),
        st.tuples(st.just("delete"), path),
        st.tuples(st.just("rename"), path, path),
        st.tuples(st.just("chmod"), path, st.booleans()),
        st.tuples(st.just("link"), path, _TARGET),
        st.tuples(st.just("nested"), path, st.booleans()),
    )
    return base, draw(st.lists(op, max_size=8)), draw(st.booleans()), draw(st.booleans())


#: Applies the ops (JSON on stdin) to the work tree, as the agent; an op that does not fit
#: the tree it finds (a parent that is a file, say) is skipped.
OPS = r"""
import base64, json, os, shutil, subprocess, sys
os.chdir(sys.argv[1])
def clear(p):
    if os.path.islink(p) or os.path.isfile(p): os.unlink(p)
    elif os.path.isdir(p): shutil.rmtree(p)
for op in json.load(sys.stdin):
    kind, p, *rest = op
    try:
        if kind == "write":
            os.makedirs(os.path.dirname(p) or ".", exist_ok=True)
            if os.path.isdir(p) and not os.path.islink(p): continue
            if os.path.islink(p): os.unlink(p)
            with open(p, "wb") as f: f.write(base64.b64decode(rest[0]))
        elif kind == "delete": clear(p)
        elif kind == "rename":
            if os.path.lexists(p) and not os.path.lexists(rest[0]):
                os.makedirs(os.path.dirname(rest[0]) or ".", exist_ok=True); os.rename(p, rest[0])
        elif kind == "chmod":
            if os.path.isfile(p) and not os.path.islink(p): os.chmod(p, 0o755 if rest[0] else 0o644)
        elif kind == "link":
            os.makedirs(os.path.dirname(p) or ".", exist_ok=True); clear(p); os.symlink(rest[0], p)
        elif kind == "nested":
            os.makedirs(p, exist_ok=True)
            with open(os.path.join(p, "inside"), "w") as f: f.write("nested\n")
            subprocess.run(["git", "init", "-q", p], check=True)
            if rest[0]:
                subprocess.run(["git", "-C", p, "add", "-A"], check=True)
                subprocess.run(["git", "-C", p, "-c", "user.name=a", "-c", "user.email=a@b",
                                "commit", "-qm", "n"], check=True)
    except (OSError, subprocess.CalledProcessError):
        pass
"""
COMMIT = "git add -A && git -c user.name=a -c user.email=a@b commit -qm mine || true"
HOSTILE_BUNDLE = (
    PROGRAMS + GLOBAL + "git config diff.noprefix true && git config diff.mnemonicPrefix true && "
    "git config core.autocrlf true && git config diff.external /tmp/h/ext.sh && "
    f"{FILTER} && printf '* text eol=crlf filter=evil diff=evil ident\\n' > .gitattributes && "
    "cp .gitattributes .git/info/attributes"
)


def _materialize(base: dict, root: Path) -> None:
    """Write the example's base tree (entries that collide with an earlier one dropped)."""
    root.mkdir(parents=True)
    for path, entry in sorted(base.items()):
        target = root / path
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            if entry[0] == "link":
                target.symlink_to(entry[1])
            else:
                target.write_bytes(entry[1])
                target.chmod(0o755 if entry[2] else 0o644)
        except OSError:
            continue


def _tar(root: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for child in sorted(root.iterdir()):
            tar.add(child, arcname=child.name)
    return buffer.getvalue()


async def _one_example(box, tmp: Path, number: int, example) -> None:
    base, ops, hostile, commit = example
    host_base = tmp / f"base-{number}"
    _materialize(base, host_base)
    workdir = f"/tmp/ws-{number}"
    await box.write_file(f"/tmp/base-{number}.tar", _tar(host_base))
    unpacked = await box.exec(
        f"mkdir {workdir} && tar --no-same-owner -xf /tmp/base-{number}.tar -C {workdir}"
    )
    assert unpacked.exit_code == 0, unpacked.stderr
    task = Task(instance_id=f"p{number}", problem_statement="x", workdir=workdir)
    baseline = await prepare_workspace(box, task)
    await box.write_file(f"/tmp/ops-{number}.json", json.dumps(ops), user="agent")
    ran = await box.exec(
        f"python3 -c '{OPS}' {workdir} < /tmp/ops-{number}.json", user="agent", timeout=120
    )
    assert ran.exit_code == 0, ran.stderr
    if commit:
        await agent(box, COMMIT, workdir)
    if hostile:
        await agent(box, HOSTILE_BUNDLE, workdir)
    diff = await capture_diff(box, workdir, baseline, (STATEMENT,))
    assert_fixed_headers(diff)
    want = await sandbox_manifest(box, workdir)
    assert applied(host_base, diff, tmp / f"applied-{number}") == want
    await assert_no_program_ran(box)
    await box.exec(f"rm -rf {workdir} /tmp/base-{number}.tar /tmp/h ~agent/.gitconfig", timeout=60)


def test_any_edit_is_captured_exactly(tmp_path):
    """Property: generated edits made as the agent (new, changed and deleted files, renames,
    binary and empty content, the exec bit, symlinks, unicode, space, tab and newline in
    names, nested repositories, committed work), with and without a hostile git config,
    give a diff that applied to a fresh copy of the base reproduces the work tree exactly.
    One sandbox serves every example, each in a fresh workdir."""
    counter = iter(range(10**6))
    with asyncio.Runner() as runner:
        box = LocalSandbox()
        runner.run(box.start())
        try:

            @settings(
                max_examples=25,
                deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture],
            )
            @given(example=_examples())
            def check(example):
                runner.run(_one_example(box, tmp_path, next(counter), example))

            check()
        finally:
            runner.run(box.aclose())


# -- docker --------------------------------------------------------------------------------


async def test_the_capture_in_docker_runs_nothing_of_the_agents_as_root(
    base, tmp_path, docker_options
):
    """Attack, in a real Docker container (where root is root): a clean filter, textconv,
    external diff and noprefix in the agent's config, and a process left running. Bound:
    the capture runs as the agent, kills its processes, runs none of its programs, and the
    diff has a/ b/ headers and reproduces the work tree exactly."""
    async with DockerSandbox(repo=str(base), **docker_options) as box:
        baseline = await prepare_workspace(box, Task(instance_id="d", problem_statement="x"))
        store = await box.exec("stat -c '%U %a' /tmp/agentrl-baseline /tmp/agentrl-baseline/*")
        assert set(store.stdout.split("\n")[:-1]) == {"root 755"}
        await agent(box, PROGRAMS)
        await agent(box, HOSTILE["clean-filter-gitattributes"][0])
        await agent(box, "git config diff.noprefix true && git config diff.external /tmp/h/ext.sh")
        await agent(box, EDITS)
        await agent(box, RACER)
        diff = await capture_diff(box, "/workspace", baseline, (STATEMENT,))
        assert_fixed_headers(diff)
        assert applied(base, diff, tmp_path / "applied") == await sandbox_manifest(
            box, "/workspace"
        )
        await assert_no_program_ran(box)
        left = await box.exec("cat /proc/[0-9]*/status 2>/dev/null | grep -c '^Uid:.1000'")
        assert left.stdout.strip() == "0"
