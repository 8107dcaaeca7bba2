"""The ``local`` sandbox against real bubblewrap: isolation, limits, workspace, lifecycle."""

from __future__ import annotations

import asyncio
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tarfile
import time

import pytest
from aiohttp import web

from agentrl.plugins import get_sandbox
from agentrl.sandboxes.base import EXIT_EXEC_TIMEOUT, SandboxError, SandboxGoneError
from agentrl.sandboxes.local import LocalSandbox, host_python_options, proc, processes_in_namespace
from agentrl.sandboxes.local import fs as _local_fs
from agentrl.sandboxes.local import limits as _local_limits
from agentrl.types import Task


def _git(cwd: pathlib.Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture
def repo(tmp_path) -> pathlib.Path:
    """A small git repository on the host."""
    path = tmp_path / "repo"
    path.mkdir()
    (path / "hello.py").write_text("print('hello')\n")
    (path / "README.md").write_text("demo\n")
    _git(path, "init", "-q")
    _git(path, "-c", "user.name=t", "-c", "user.email=t@e", "add", ".")
    _git(path, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "init")
    return path


@pytest.fixture
def state_dir(tmp_path) -> pathlib.Path:
    """Where this test's sandboxes keep their host-side state."""
    return tmp_path / "state"


@pytest.fixture
async def middleware(tmp_path):
    """An aiohttp server on a unix socket (the middleware) plus the same app on a host TCP port."""

    async def handle(request: web.Request) -> web.Response:
        return web.json_response({"path": request.path, "method": request.method})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    sock = tmp_path / "mw.sock"
    await web.UnixSite(runner, str(sock)).start()
    tcp = web.TCPSite(runner, "127.0.0.1", 0)
    await tcp.start()
    port = tcp._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield sock, port
    await runner.cleanup()


def _assert_gone(sandbox: LocalSandbox, ns: int | None) -> None:
    assert ns is not None
    deadline = time.monotonic() + 5
    while processes_in_namespace(ns) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_in_namespace(ns) == []
    assert sandbox.state is not None and not sandbox.state.exists()
    assert sandbox.limits is not None and sandbox.limits.dirs == []


async def _wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


def _dead_pid() -> int:
    """The pid of a process that has exited."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    return dead.pid


def _minimal_image(root: pathlib.Path, *, skip: tuple[str, ...] = ()) -> pathlib.Path:
    """A tiny root filesystem: dash as /bin/sh, a few coreutils, their shared libraries."""
    (root / "bin").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc" / "image-marker").write_text("minimal-image\n")
    libs: set[str] = set()
    for tool in ("dash", "cat", "ls", "id", "mkdir", "unshare", "setsid", "mv", "dirname"):
        if tool in skip:
            continue
        src = shutil.which(tool)
        assert src, f"{tool} is needed to build the test image"
        name = "sh" if tool == "dash" else tool
        shutil.copy2(os.path.realpath(src), root / "bin" / name)
        out = subprocess.run(["ldd", src], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            parts = [p for p in line.split() if p.startswith("/")]
            libs.update(parts[:1])
    for lib in libs:
        target = root / lib.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath(lib), target)
    return root


# -- tools and isolation ----------------------------------------------------------------------


async def test_registered_and_built_from_task(repo, state_dir):
    """`local` is a registered plugin and from_task takes image, repo and workdir from the task."""
    assert get_sandbox("local") is LocalSandbox
    task = Task(instance_id="t", problem_statement="p", repo=str(repo), workdir="/testbed")
    async with LocalSandbox.from_task(task, state_dir=state_dir) as sb:
        result = await sb.exec("pwd; cat hello.py")
    assert result.stdout == "/testbed\nprint('hello')\n"


@pytest.mark.parametrize("user", ["root", "agent"])
async def test_node_python_git_work_inside(repo, state_dir, user):
    """node, python and git run inside, and git sees the workspace's repository and edits."""
    async with LocalSandbox(repo=str(repo), state_dir=state_dir) as sb:
        node = await sb.exec("node -e 'console.log(6*7)'", user=user)
        py = await sb.exec("python3 -c 'import sys; print(sys.version_info[0])'", user=user)
        edit = await sb.exec("echo \"print('bye')\" >> hello.py && git diff --stat", user=user)
        log = await sb.exec("git log --oneline | wc -l", user=user)
    assert (node.exit_code, node.stdout) == (0, "42\n")
    assert (py.exit_code, py.stdout) == (0, "3\n")
    assert edit.exit_code == 0, edit.stderr
    assert "hello.py | 1 +" in edit.stdout
    assert log.stdout.strip() == "1"


async def test_users_and_capabilities(state_dir):
    """root is uid 0, agent an unprivileged uid 1000 with a passwd entry; neither has host caps."""
    async with LocalSandbox(state_dir=state_dir) as sb:
        agent = await sb.exec(
            "id -u; id -un; echo $HOME; grep CapEff /proc/self/status", user="agent"
        )
        root = await sb.exec("id -u; echo $HOME", user="root")
        bad = sb.exec("true", user="nobody")
        with pytest.raises(SandboxError, match="unknown user 'nobody'"):
            await bad
    assert agent.stdout.splitlines()[:3] == ["1000", "agent", "/home/agent"]
    assert agent.stdout.split()[-1] == "0000000000000000"
    assert root.stdout.split() == ["0", "/root"]


@pytest.mark.parametrize("user", ["root", "agent"])
async def test_host_secrets_unreadable(state_dir, user):
    """/root, /home and /etc/shadow of the host are not readable inside, for either user."""
    async with LocalSandbox(state_dir=state_dir) as sb:
        shadow = await sb.exec("cat /etc/shadow", user=user)
        roots = await sb.exec("ls -A /root; ls -A /home", user=user)
        proc1 = await sb.exec("cat /proc/1/cmdline | tr '\\0' ' '", user=user)
    assert shadow.exit_code != 0 and shadow.stdout == ""
    assert "Permission denied" in shadow.stderr
    assert roots.stdout.split() == ["agent"]  # an empty /root, and only the sandbox's home
    assert "bwrap" in proc1.stdout  # pid 1 is the sandbox's own init, not the host's


@pytest.mark.parametrize("user", ["root", "agent"])
async def test_writes_outside_workspace_fail(repo, state_dir, user):
    """Writes to /, /usr, /etc and /home fail; the workspace, /tmp and the home are writable."""
    async with LocalSandbox(repo=str(repo), state_dir=state_dir) as sb:
        for path in ("/newfile", "/usr/newfile", "/etc/newfile", "/home/newfile", "/bin/sh"):
            result = await sb.exec(f"echo x > {path}", user=user)
            assert result.exit_code != 0, path
            assert "Read-only file system" in result.stderr, (path, result.stderr)
        home = "/root" if user == "root" else "/home/agent"
        ok = await sb.exec(
            f"echo a > /workspace/n && echo b > /tmp/n && echo c > {home}/n", user=user
        )
        assert ok.exit_code == 0, ok.stderr
    assert not (repo / "n").exists()


async def test_network_only_the_middleware(state_dir, middleware):
    """External addresses and host TCP ports are unreachable; the middleware is, via url_for."""
    sock, host_port = middleware
    probe = (
        "python3 -c 'import socket,sys; socket.create_connection((sys.argv[1], int(sys.argv[2])),"
        " timeout=3)' {} {}"
    )
    async with LocalSandbox(state_dir=state_dir, services={18080: sock}) as sb:
        url = sb.url_for("127.0.0.1", 18080)
        fetch = await sb.exec(
            f'python3 -c \'import urllib.request; print(urllib.request.urlopen("{url}/v1/messages",'
            ' data=b"{}").read().decode())\'',
            user="agent",
        )
        external = await sb.exec(probe.format("1.1.1.1", 443), user="agent")
        host_tcp = await sb.exec(probe.format("127.0.0.1", host_port), user="agent")
        with pytest.raises(SandboxError, match="no service is bound for port 9999"):
            sb.url_for("127.0.0.1", 9999)
    assert url == "http://127.0.0.1:18080"
    assert fetch.exit_code == 0, fetch.stderr
    assert fetch.stdout.strip() == '{"path": "/v1/messages", "method": "POST"}'
    assert external.exit_code != 0 and "Network is unreachable" in external.stderr
    assert host_tcp.exit_code != 0 and "Connection refused" in host_tcp.stderr


async def test_host_python_option_binds_this_interpreter(state_dir):
    """host_python=True makes this interpreter and its packages run inside, first on PATH,
    with pytest plugin autoloading off; explicit env wins; an image root ignores it."""
    options = host_python_options()
    assert all(not p.startswith(("/usr/", "/etc/")) for p in options["ro_binds"])
    async with LocalSandbox(state_dir=state_dir) as plain:
        without = await plain.exec(f"test -e {sys.executable}", user="agent")
    async with LocalSandbox(state_dir=state_dir, host_python=True) as sb:
        inside = await sb.exec(
            "python -c 'import sys, attrs; print(sys.executable)'; "
            "echo $PYTEST_DISABLE_PLUGIN_AUTOLOAD",
            user="agent",
        )
    assert inside.exit_code == 0, inside.stderr
    # PATH names the directory it was started from, resolved (a linked venv directory).
    started = pathlib.Path(sys.executable).parent.resolve() / pathlib.Path(sys.executable).name
    assert inside.stdout == f"{started}\n1\n"
    # Visible without the option exactly when it lives under the host's system directories.
    assert (without.exit_code == 0) == (not options["ro_binds"])
    mine = LocalSandbox(host_python=True, env={"PATH": "/bin"}, ro_binds={"/x": "/y"})
    assert mine.env["PATH"] == "/bin" and mine.env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] == "1"
    assert mine.ro_binds == {**options["ro_binds"], "/x": "/y"}
    imaged = LocalSandbox(image="/some/image", host_python=True)
    assert (imaged.env, imaged.ro_binds) == ({}, {})


# -- limits -----------------------------------------------------------------------------------


async def test_fork_bomb_contained(state_dir):
    """A fork bomb hits the process limit, is killed at its timeout, and the sandbox recovers:
    its processes are gone (counted until they are, within 10 s: the group's last members may
    still be exiting when the timed-out exec returns on a busy machine)."""
    async with LocalSandbox(state_dir=state_dir, pids=64) as sb:
        started = time.monotonic()
        bomb = await sb.exec("b() { b | b & }; b; sleep 30", user="agent", timeout=3)
        took = time.monotonic() - started
        assert bomb.exit_code == EXIT_EXEC_TIMEOUT
        after = await sb.exec("echo alive", timeout=30)
        deadline = time.monotonic() + 10
        while True:
            count = int((await sb.exec("ls -d /proc/[0-9]* | wc -l")).stdout)
            if count < 20 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
    assert took < 15
    assert after.stdout == "alive\n"
    assert count < 20
    assert sb.limits is not None and sb.limits.mode in ("cgroup-v1", "cgroup-v2", "rlimit")


async def test_memory_hog_contained(state_dir):
    """A process allocating past the memory limit is killed; the sandbox stays usable."""
    async with LocalSandbox(state_dir=state_dir, memory_mb=128) as sb:
        hog = await sb.exec(
            "python3 -c 'x = bytearray(600 * 1024 * 1024); print(len(x))'", user="agent", timeout=60
        )
        after = await sb.exec("echo alive")
    assert hog.exit_code != 0
    assert "629145600" not in hog.stdout
    assert after.stdout == "alive\n"


async def test_tmpfs_size_limit(state_dir):
    """/tmp is a tmpfs of the configured size: writing past it fails with ENOSPC."""
    async with LocalSandbox(state_dir=state_dir, tmp_size_mb=8) as sb:
        fill = await sb.exec("head -c 20000000 /dev/zero > /tmp/big", user="agent")
        size = await sb.exec("stat -c %s /tmp/big")
    assert fill.exit_code != 0 and "No space left on device" in fill.stderr
    assert int(size.stdout) <= 8 * 1024 * 1024


# -- workspace --------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", ["auto", "never"])
async def test_workspace_isolated_from_source_and_siblings(repo, state_dir, overlay):
    """Edits never reach the source repo, and two sandboxes of one repo don't see each other."""
    async with (
        LocalSandbox(repo=str(repo), state_dir=state_dir, overlay=overlay) as one,
        LocalSandbox(repo=str(repo), state_dir=state_dir, overlay=overlay) as two,
    ):
        await one.exec("echo one > hello.py && echo new > added.txt && rm README.md", user="agent")
        seen_by_two = await two.exec("cat hello.py; ls")
        diff = await one.exec("git status --porcelain | sort")
        if overlay == "never":
            assert one.workspace_mode == "copy"
    assert seen_by_two.stdout == "print('hello')\nREADME.md\nhello.py\n"
    assert diff.stdout.split("\n")[:3] == [" D README.md", " M hello.py", "?? added.txt"]
    assert (repo / "hello.py").read_text() == "print('hello')\n"
    assert (repo / "README.md").exists() and not (repo / "added.txt").exists()


async def test_repo_tarball_and_image_directory_and_tarball(tmp_path, repo, state_dir, monkeypatch):
    """A repo tarball becomes the workspace; an image directory or tarball becomes the root."""
    repo_tar = tmp_path / "repo.tar.gz"
    with tarfile.open(repo_tar, "w:gz") as tar:
        tar.add(repo, arcname=".")
    image = _minimal_image(tmp_path / "image")
    image_tar = tmp_path / "image.tar"
    with tarfile.open(image_tar, "w") as tar:
        tar.add(image, arcname=".")
    monkeypatch.setenv("AGENTRL_CACHE_DIR", str(tmp_path / "cache"))
    for root in (image, image_tar):
        async with LocalSandbox(image=str(root), repo=str(repo_tar), state_dir=state_dir) as sb:
            inside = await sb.exec("cat /etc/image-marker; cat hello.py; ls /bin | wc -l")
            no_python = await sb.exec("ls /usr/bin/python3")
            as_agent = await sb.exec("id -u; echo hi > f; cat f", user="agent")
        assert inside.stdout.splitlines()[:2] == ["minimal-image", "print('hello')"], inside
        assert no_python.exit_code != 0
        assert as_agent.stdout == "1000\nhi\n", as_agent


# -- files, env, timeouts ---------------------------------------------------------------------


async def test_write_and_read_files(tmp_path, state_dir):
    """str, bytes and a streamed host Path round-trip; parents are created; perms are enforced."""
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(3 * 1024 * 1024))
    async with LocalSandbox(state_dir=state_dir) as sb:
        await sb.write_file("/workspace/a/b/text.txt", "héllo\n", user="agent")
        await sb.write_file("/tmp/raw.bin", b"\x00\xff\xfe", user="root")
        await sb.write_file("/workspace/big.bin", big)
        assert await sb.read_file("/workspace/a/b/text.txt", user="agent") == "héllo\n"
        assert await sb.read_file("/tmp/raw.bin", text=False) == b"\x00\xff\xfe"
        assert await sb.read_file("/tmp/raw.bin") == "\x00\ufffd\ufffd"
        assert await sb.read_file("/workspace/big.bin", text=False) == big.read_bytes()
        with pytest.raises(SandboxError, match="could not write /usr/x as agent"):
            await sb.write_file("/usr/x", "no", user="agent")
        with pytest.raises(FileNotFoundError, match="no such file in the sandbox: /nope"):
            await sb.read_file("/nope")
        await sb.exec("echo secret > /tmp/private && chmod 0 /tmp/private", user="agent")
        with pytest.raises(SandboxError, match="could not read /tmp/private as agent"):
            await sb.read_file("/tmp/private", user="agent")
        with pytest.raises(FileNotFoundError, match="not a file on the host"):
            await sb.write_file("/tmp/x", tmp_path / "missing")


async def test_env_workdir_check_and_state_between_execs(state_dir):
    """env and workdir apply per exec; files and background processes persist between execs."""
    async with LocalSandbox(state_dir=state_dir, env={"BASE": "b"}) as sb:
        env = await sb.exec('echo "$BASE $X"; pwd', env={"X": "it's $x"}, workdir="/tmp")
        await sb.exec("mkdir -p /tmp/d && (sleep 30 & echo $! > /tmp/d/pid)", user="agent")
        alive = await sb.exec("kill -0 $(cat /tmp/d/pid) && echo running")
        with pytest.raises(SandboxError, match="exited with code 3"):
            await sb.exec("exit 3", check=True)
    assert env.stdout == "b it's $x\n/tmp\n"
    assert alive.stdout == "running\n"


async def test_command_timeout_is_a_result(state_dir):
    """A command past its timeout is killed (with its children) and gives exit code 124."""
    async with LocalSandbox(state_dir=state_dir) as sb:
        started = time.monotonic()
        result = await sb.exec("echo before; sleep 60 & echo $! > /tmp/bg; sleep 60", timeout=1)
        took = time.monotonic() - started
        left = await sb.exec("kill -0 $(cat /tmp/bg) 2>/dev/null && echo alive || echo gone")
    assert result.exit_code == EXIT_EXEC_TIMEOUT
    assert result.stdout == "before\n"
    assert "timed out after 1s" in result.stderr
    assert took < 10
    assert left.stdout == "gone\n"


async def test_kill_before_the_command_is_recorded_still_kills_it(state_dir):
    """A timeout that fires before the spawner recorded the command's process group (here
    timeout=0) still kills it at once; a kill for a finished request is harmless."""
    survivors = (
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done"
        " | grep -c '^sleep 30'; true"
    )
    async with LocalSandbox(state_dir=state_dir) as sb:
        started = time.monotonic()
        results = [await sb.exec("sleep 30; echo late", timeout=0) for _ in range(3)]
        took = time.monotonic() - started
        left = await sb.exec(survivors)
        sb._channel.send("kill 0123456789abcdef")  # no such request (any more)
        after = await sb.exec("echo alive")
    assert [r.exit_code for r in results] == [EXIT_EXEC_TIMEOUT] * 3
    assert all(r.stdout == "" for r in results)
    assert took < 5
    assert left.stdout == "0\n"
    assert after.stdout == "alive\n"


async def test_output_is_capped(state_dir):
    """Exec output beyond max_output_bytes is truncated with a visible marker; binary decodes."""
    async with LocalSandbox(state_dir=state_dir, max_output_bytes=1000) as sb:
        big = await sb.exec("head -c 100000 /dev/zero | tr '\\0' a; head -c 3000 /dev/urandom >&2")
    assert len(big.stdout) < 1100
    assert "[agentrl: 99000 bytes of output truncated]" in big.stdout
    assert big.stdout.startswith("a" * 500) and big.stdout.endswith("a" * 500)
    assert "bytes of output truncated" in big.stderr


async def test_an_exec_costs_the_sandbox_two_processes(state_dir):
    """``exec("true")`` creates two processes (the supervisor and the command), as agent
    and as root: the sandbox's pid namespace hands its pids out one by one."""
    async with LocalSandbox(state_dir=state_dir) as sb:
        for user in ("agent", "root"):
            first = int((await sb.exec("echo $$", user=user)).stdout)
            for _ in range(10):
                assert (await sb.exec("true", user=user)).ok
            last = int((await sb.exec("echo $$", user=user)).stdout)
            assert (last - first) / 11 == 2, user


async def test_long_commands_and_the_shell_that_runs_them(state_dir):
    """A command over the inline limit runs from a file, a short one as ``bash -c``; either
    way it sees the same environment and exit code, and ``$0`` names the shell."""
    long = "x=" + "y" * (proc.MAX_INLINE_COMMAND + 10) + "; echo ${#x}; exit 7"
    async with LocalSandbox(state_dir=state_dir, env={"FOO": "bar"}) as sb:
        short = await sb.exec("echo $0 $FOO; exit 7", user="agent")
        big = await sb.exec(long, user="agent")
    assert (short.exit_code, short.stdout) == (7, "bash bar\n")
    assert (big.exit_code, big.stdout) == (7, f"{proc.MAX_INLINE_COMMAND + 10}\n")


async def test_root_enters_a_workdir_the_agent_uid_cannot(state_dir):
    """Root changes directory once in its own user namespace, so a workdir the agent made
    unreadable (mode 000) is still root's; the agent gets cd's error and exit 1."""
    async with LocalSandbox(state_dir=state_dir) as sb:
        await sb.exec("mkdir /workspace/locked && chmod 000 /workspace/locked", user="agent")
        root = await sb.exec("pwd; id -u", user="root", workdir="/workspace/locked")
        agent = await sb.exec("pwd", user="agent", workdir="/workspace/locked")
    assert (root.exit_code, root.stdout) == (0, "/workspace/locked\n0\n")
    assert agent.exit_code == 1 and "can't cd" in agent.stderr


# -- lifecycle and bad input ------------------------------------------------------------------


async def test_no_process_survives_the_context(state_dir):
    """Background, setsid'd and double-forked processes all die when the context exits."""
    sb = LocalSandbox(state_dir=state_dir)
    async with sb:
        await sb.exec("sleep 300 &", user="agent")
        await sb.exec("setsid sh -c 'sleep 300 & sleep 300' > /dev/null 2>&1 &")
        await sb.exec("(setsid sleep 300 &) ; nohup sleep 300 > /dev/null 2>&1 &", user="agent")
        ns = sb.pid_namespace
        assert ns is not None and len(processes_in_namespace(ns)) >= 6
    _assert_gone(sb, ns)
    with pytest.raises(SandboxGoneError, match="closed"):
        await sb.exec("true")


async def test_context_exit_on_error_cleans_up(state_dir):
    """An exception inside the context still destroys the sandbox and its processes."""
    sb = LocalSandbox(state_dir=state_dir)
    with pytest.raises(RuntimeError, match="boom"):
        async with sb:
            await sb.exec("sleep 300 &")
            ns = sb.pid_namespace
            raise RuntimeError("boom")
    _assert_gone(sb, ns)


async def test_sandbox_killed_mid_run_is_a_clear_error(state_dir):
    """A sandbox that dies while a command runs raises SandboxGoneError and leaks nothing."""
    sb = LocalSandbox(state_dir=state_dir)
    async with sb:
        ns = sb.pid_namespace
        running = asyncio.ensure_future(sb.exec("sleep 60", timeout=60))
        await asyncio.sleep(0.3)
        assert sb._process is not None
        os.killpg(sb._process.pid, signal.SIGKILL)
        with pytest.raises(SandboxGoneError, match="died while a command was running"):
            await running
        with pytest.raises(SandboxGoneError, match="exited"):
            await sb.exec("true")
    _assert_gone(sb, ns)


async def test_agent_killing_the_spawner_is_a_clear_error(state_dir):
    """If a command kills the sandbox's init from inside, the next exec fails clearly."""
    sb = LocalSandbox(state_dir=state_dir)
    async with sb:
        ns = sb.pid_namespace
        with pytest.raises(SandboxGoneError, match="died while a command was running"):
            await sb.exec(
                "for p in /proc/[0-9]*; do grep -q init.sh $p/cmdline 2>/dev/null && "
                "kill -9 ${p#/proc/}; done; sleep 5",
                user="agent",
                timeout=10,
            )
        with pytest.raises(SandboxGoneError, match="exited"):
            await sb.exec("true")
    _assert_gone(sb, ns)


async def test_cancelled_while_leaving_still_tears_everything_down(state_dir):
    """A task cancelled in its body, then again during teardown, leaves nothing behind, and
    the state directory goes only once every process in the sandbox is dead."""
    sb = LocalSandbox(state_dir=state_dir)
    entered = asyncio.Event()

    async def hold() -> None:
        async with sb:
            await sb.exec("setsid sleep 300 > /dev/null 2>&1 &", user="agent")
            entered.set()
            await asyncio.sleep(3600)

    task = asyncio.create_task(hold())
    await entered.wait()
    ns = sb.pid_namespace
    assert ns is not None and sb.state is not None
    task.cancel()
    await asyncio.sleep(0)  # the task is now inside aclose
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    state = sb.state
    await _wait_for(lambda: not state.exists(), timeout=15)
    assert processes_in_namespace(ns) == []
    assert sb.limits is not None and sb.limits.dirs == []


async def test_killed_owner_takes_the_sandbox_down_and_its_state_is_swept(state_dir):
    """When the owning process is SIGKILLed the sandbox dies with it (--die-with-parent), and
    the next sandbox started sweeps the state directory and cgroups it left."""
    owner_script = (
        "import asyncio, sys\n"
        "from agentrl.sandboxes.local import LocalSandbox\n"
        "async def main():\n"
        "    sb = LocalSandbox(state_dir=sys.argv[1])\n"
        "    await sb.start()\n"
        "    await sb.exec('setsid sleep 300 > /dev/null 2>&1 &')\n"
        "    print(sb.pid_namespace, sb.state.name, flush=True)\n"
        "    await asyncio.sleep(300)\n"
        "asyncio.run(main())\n"
    )
    owner = await asyncio.create_subprocess_exec(
        sys.executable, "-c", owner_script, str(state_dir), stdout=asyncio.subprocess.PIPE
    )
    assert owner.stdout is not None
    try:
        line = await asyncio.wait_for(owner.stdout.readline(), 60)
    finally:
        owner.kill()
        await owner.wait()
    ns_text, name = line.decode().split()
    ns = int(ns_text)
    await _wait_for(lambda: processes_in_namespace(ns) == [])
    assert (state_dir / name).is_dir()  # left behind by the dead owner
    async with LocalSandbox(state_dir=state_dir) as sb:
        assert sb.limits is not None
        parents = list(sb.limits.parents)
    assert not (state_dir / name).exists()
    assert [p / name for p in parents if (p / name).exists()] == []


@pytest.mark.parametrize("field", ["image", "repo"])
async def test_missing_image_or_repo_is_a_clear_error(tmp_path, state_dir, field):
    """A nonexistent image or repository fails before launching and leaves nothing behind."""
    sb = LocalSandbox(state_dir=state_dir, **{field: str(tmp_path / "nope")})
    with pytest.raises(SandboxError, match=f"the task's {field} .*nope.* does not exist"):
        async with sb:
            pass
    leftovers = list(state_dir.iterdir()) if state_dir.exists() else []
    assert leftovers == []


async def test_unwritable_workdir_parent_is_a_clear_error(tmp_path, state_dir, repo):
    """A workdir that cannot be created under the read-only root fails with bubblewrap's reason."""
    sb = LocalSandbox(state_dir=state_dir, repo=str(repo), workdir="/usr/nonexistent/ws")
    with pytest.raises(SandboxError, match="failed to start"):
        await sb.start()
    assert sb.state is not None and not sb.state.exists()


async def test_image_without_required_tools_is_a_clear_error(tmp_path, state_dir, middleware):
    """An image lacking setsid, or socat when a service is bound, fails at start and says so."""
    no_setsid = _minimal_image(tmp_path / "no-setsid", skip=("setsid",))
    with pytest.raises(SandboxError, match="has no 'setsid'"):
        async with LocalSandbox(image=str(no_setsid), state_dir=state_dir):
            pass
    sock, _ = middleware
    no_socat = _minimal_image(tmp_path / "no-socat")
    sb = LocalSandbox(image=str(no_socat), state_dir=state_dir, services={8000: sock})
    with pytest.raises(SandboxError, match="socat is not installed"):
        await sb.start()
    assert sb.state is not None and not sb.state.exists()


async def test_missing_service_socket_is_a_clear_error(tmp_path, state_dir):
    """A service whose unix socket does not exist is reported before anything starts."""
    sb = LocalSandbox(state_dir=state_dir, services={8000: tmp_path / "nobody-listens.sock"})
    with pytest.raises(SandboxError, match="service socket for port 8000 does not exist"):
        await sb.start()
    assert sb.state is None


async def test_cancelled_exec_kills_its_command(state_dir):
    """Cancelling an exec kills the command it started."""
    async with LocalSandbox(state_dir=state_dir) as sb:
        task = asyncio.ensure_future(sb.exec("echo $$ > /tmp/pid; exec sleep 60"))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            check = await sb.exec("kill -0 $(cat /tmp/pid) 2>/dev/null && echo alive || echo gone")
            if check.stdout == "gone\n":
                break
            await asyncio.sleep(0.1)
    assert check.stdout == "gone\n"


async def test_concurrent_execs(state_dir):
    """Many execs at once on one sandbox each get their own output and exit code."""
    async with LocalSandbox(state_dir=state_dir) as sb:
        results = await asyncio.gather(
            *(sb.exec(f"sleep 0.{i % 3}; echo {i}; exit {i}", user="agent") for i in range(12))
        )
    assert [(r.exit_code, r.stdout) for r in results] == [(i, f"{i}\n") for i in range(12)]


async def test_rlimit_fallback_caps_memory(state_dir, monkeypatch):
    """Without a writable cgroup, limits fall back to rlimits and still stop a memory hog."""
    monkeypatch.setattr(_local_limits, "_CGROUP_ROOT", pathlib.Path("/nonexistent"))
    async with LocalSandbox(state_dir=state_dir, memory_mb=256) as sb:
        hog = await sb.exec("python3 -c 'x = bytearray(600 * 1024 * 1024)'", user="agent")
        small = await sb.exec("python3 -c 'x = bytearray(50 * 1024 * 1024); print(len(x))'")
    assert sb.limits is not None and sb.limits.mode == "rlimit"
    assert hog.exit_code != 0 and "MemoryError" in hog.stderr
    assert small.stdout == "52428800\n"


async def test_overlay_require_without_overlayfs_is_a_clear_error(repo, state_dir, monkeypatch):
    """overlay='require' on a machine where overlayfs cannot mount says so and what to use."""
    monkeypatch.setattr(_local_fs, "overlay_supported", lambda scratch, metacopy=False: False)
    sb = LocalSandbox(state_dir=state_dir, repo=str(repo), overlay="require")
    with pytest.raises(SandboxError, match="overlay='require' but overlayfs cannot be mounted"):
        await sb.start()


async def test_stale_state_of_dead_owners_is_swept(state_dir):
    """State left by a sandbox whose owning process died is removed by the next start."""
    state_dir.mkdir(parents=True)
    stale = state_dir / f"agentrl-local-{_dead_pid()}-abc"
    (stale / "workspace").mkdir(parents=True)
    live = state_dir / f"agentrl-local-{os.getppid()}-abc"
    live.mkdir()
    async with LocalSandbox(state_dir=state_dir):
        pass
    assert not stale.exists()
    assert live.exists()


async def test_commands_do_not_hold_the_control_fifos(state_dir):
    """A command (and its children) holds no descriptor on the request or completion FIFOs."""
    async with LocalSandbox(state_dir=state_dir) as sb:
        result = await sb.exec(
            "sleep 5 & ls -l /proc/self/fd /proc/$!/fd | grep -c -e queue -e done; true",
            user="agent",
        )
    assert result.stdout == "0\n"
