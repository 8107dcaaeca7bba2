"""The ``docker`` sandbox: one container per sandbox on a Docker daemon, through aiodocker.

Start: the first candidate image present on the daemon (never a pull: a missing one is a
``MissingImageError`` naming it), a container created by ``container.create_config``
(no network, limits, read-only root, labels, the ``agent`` account of ``users``), the
task's repository copied into its workspace volume, then started and read until its main
process says it is ready. Every exec is a Docker exec (``execs``); files move through
an exec's stdin and stdout, capped like every output. Close force-removes the container
and its volume; the run's and dead processes' leftovers are swept (``labels``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pathlib
import shlex
import shutil
import socket
import tempfile
from collections.abc import Iterable, Mapping
from typing import Any

from agentrl.sandboxes.base import (
    EXIT_TIME_BUDGET_EXCEEDED,
    READ_FILE_MAX_BYTES,
    ExecRequest,
    Sandbox,
    SandboxError,
    SandboxGoneError,
)
from agentrl.sandboxes.base import max_output_bytes as _resolve_max_output
from agentrl.sandboxes.docker import execs, images, labels, users
from agentrl.sandboxes.docker.client import (
    MissingImageError,
    connect,
    image_present,
    sandbox_error,
)
from agentrl.sandboxes.docker.container import (
    AGENT_HOME,
    READY_LINE,
    create_config,
    repo_tarball,
    seed_archive,
)
from agentrl.sandboxes.docker.options import DockerOptions
from agentrl.sandboxes.images import ImageReport
from agentrl.types import ExecResult, Task

__all__ = ["DockerSandbox"]

logger = logging.getLogger(__name__)

_EXIT_MISSING = 44
#: Daemons (by address) whose dead processes' containers this process already swept.
_swept: set[str] = set()


class DockerSandbox(Sandbox):
    """A container on a Docker daemon, configured by ``DockerOptions``' keywords.

    ``url_for`` returns ``127.0.0.1:port`` for a port bound through ``services``;
    ``env`` (each exec's environment) may be changed between execs.
    """

    name = "docker"
    reaches_middleware_over_unix_socket = True
    task_parameters = frozenset({"image", "repo", "workdir", "images"})

    def __init__(self, **options: Any) -> None:
        self.options = DockerOptions.from_keywords(options)
        self.env = dict(self.options.env)
        self.max_output = _resolve_max_output(self.options.max_output_bytes)
        self.read_file_max_bytes = max(READ_FILE_MAX_BYTES, self.max_output)
        self.image: str | None = None
        self.container_id: str | None = None
        self._docker: Any = None
        self._container: Any = None
        self._state: pathlib.Path | None = None
        self._started = False
        self._closed = False

    @property
    def workdir(self) -> str:
        return self.options.workdir

    @property
    def services(self) -> dict[int, pathlib.Path]:
        return self.options.services

    @property
    def agent_uid(self) -> int:
        return self.options.agent_uid

    @classmethod
    def option_names(cls) -> frozenset[str]:
        """Every ``DockerOptions`` field but those ``from_task`` fills from the task."""
        return DockerOptions.names() - cls.task_parameters

    @classmethod
    def from_task(cls, task: Task, **options: Any) -> DockerSandbox:
        """A sandbox of the first present of ``task.metadata["docker_images"]`` (the images a
        grader prefers, such as swebench's locally built instance image), then ``task.image``."""
        extra = task.metadata.get("docker_images") or ()
        images = tuple(name for name in extra if isinstance(name, str))
        return cls(image=task.image, images=images, repo=task.repo, workdir=task.workdir, **options)

    @classmethod
    def check_task(cls, task: Task, **options: Any) -> None:
        """The task names an image (or ``default_image`` is set) and its host repository
        exists; whether the daemon holds the image is ``image_report``'s question."""
        sandbox = cls.from_task(task, **options)
        if not sandbox.options.candidates():
            raise SandboxError(
                f"task {task.instance_id} names no image and the docker sandbox has no "
                "default_image: set the row's image, or pass --sandbox-options "
                '\'{"default_image": "IMAGE"}\' (or AGENTRL_DOCKER_BASE_IMAGE)'
            )
        repo = task.repo
        if repo and "://" not in repo and not pathlib.Path(repo).exists():
            raise SandboxError(f"the task's repository {repo} does not exist on this machine")

    @classmethod
    def task_images(cls, task: Task, **options: Any) -> tuple[str, ...]:
        """The images a sandbox of ``task`` boots from, preferred first: the grader's
        ``metadata.docker_images``, then the task's image, else the default image. The one
        rule for a boot, ``check-tasks``, the rollout's pre-check and ``agentrl images``."""
        return cls.from_task(task, **options).options.candidates()

    @classmethod
    async def image_report(cls, tasks: Iterable[Task], **options: Any) -> ImageReport:
        """Each distinct image of ``tasks`` and whether the daemon holds it: one listing of
        the daemon's images (``SandboxError`` when it cannot be asked)."""
        host = _resolve(options).host
        pairs = [(task.instance_id, cls.task_images(task, **options)) for task in tasks]
        return await images.report(host, pairs)

    @classmethod
    async def pull_image(cls, name: str, **options: Any) -> None:
        """Pull ``name`` into the daemon from its registry (a sandbox itself never pulls)."""
        await images.pull(_resolve(options).host, name)

    @classmethod
    async def sweep(
        cls, *, process: str | None = None, from_host: str | None = None, **options: Any
    ) -> list[str]:
        """Remove every container of this run (``run_id``, default this process's) still
        there; with ``process`` (a ``process_label``), only that process's.

        ``from_host`` is the host whose daemon address ``options`` name (``sweep_keywords``
        of another process): a ``unix://`` daemon of another host is not this host's to
        reach, and is left to that host's next start (``sweep_orphans``)."""
        resolved = _resolve(options)
        host = resolved.host
        if from_host and from_host != socket.gethostname() and host.startswith("unix://"):
            logger.info(
                "docker sweep of run %s: the daemon %s is on %s, not here; its containers "
                "go when a sandbox starts there again",
                resolved.run_id,
                host,
                from_host,
            )
            return []
        try:
            docker = connect(host)
        except SandboxError as exc:
            logger.warning("docker sweep: %s", exc)
            return []
        try:
            run_id = resolved.run_id or labels.process_run_id()
            return await labels.sweep_run(docker, run_id, resolved.owner, process)
        finally:
            await docker.close()

    @classmethod
    def sweep_keywords(cls, **options: Any) -> dict[str, Any]:
        """What ``sweep`` needs, in another process or on another host, to remove exactly
        the containers this process creates with ``options``: the daemon's address, the
        run, the owner, this process and this host (plain values, to send over the wire)."""
        resolved = _resolve(options)
        return {
            "docker_host": resolved.host,
            "run_id": resolved.run_id or labels.process_run_id(),
            "owner": resolved.owner or socket.gethostname(),
            "process": labels.process_label(),
            "from_host": socket.gethostname(),
        }

    @classmethod
    async def sweep_orphans(cls, **options: Any) -> list[str]:
        """Remove this owner's containers on the daemon whose creating process on this host
        is gone (what the first start in a process does; a starting node calls it)."""
        resolved = _resolve(options)
        try:
            docker = connect(resolved.host)
        except SandboxError as exc:
            logger.warning("docker sweep: %s", exc)
            return []
        try:
            _swept.add(resolved.host)
            return await labels.sweep_stale(docker, resolved.owner)
        finally:
            await docker.close()

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        if self._started or self._closed:
            raise SandboxError("a DockerSandbox starts once; create a new one for a new run")
        self._started = True
        for port, sock in self.services.items():
            if not sock.exists():
                raise SandboxError(
                    f"service socket for port {port} does not exist: {sock}; start the "
                    "host service on that unix socket before the sandbox"
                )
        self._docker = connect(self.options.host)
        try:
            await asyncio.wait_for(self._boot(), self.options.startup_timeout)
        except asyncio.TimeoutError:
            await self.aclose()
            raise SandboxError(
                f"the docker sandbox did not start within {self.options.startup_timeout:g}s"
            ) from None
        except BaseException:
            await self.aclose()
            raise

    async def _boot(self) -> None:
        from aiodocker.exceptions import DockerError

        host = self.options.host
        if host not in _swept:
            _swept.add(host)
            await labels.sweep_stale(self._docker, self.options.owner)
        self.image = await self._pick_image()
        own_labels = labels.container_labels(self.options.run_id, self.options.owner)
        self._state = pathlib.Path(
            await asyncio.to_thread(tempfile.mkdtemp, prefix="agentrl-docker-")
        )
        accounts = await users.account_files(
            self._docker,
            self.image,
            uid=self.agent_uid,
            home=AGENT_HOME,
            directory=self._state,
            labels=own_labels,
        )
        config = create_config(self.options, self.image, own_labels, accounts)
        try:
            self._container = await self._docker.containers.create(config)
            self.container_id = self._container.id
        except DockerError as exc:
            raise sandbox_error(exc, f"create of a container of {self.image}") from exc
        seed: bytes | None = None
        if self.options.workspace_limit_mb is not None:
            # A tmpfs hides what the image ships there until the start: read it now.
            seed = await self._seed_of_workspace()
        elif self.options.repo:
            # Into the workspace volume before the start: the main process then owns it over.
            await self._copy_repo(pathlib.Path(self.options.repo))
        await self._start_until_ready()
        if seed is not None:
            await self._seed_workspace(seed)

    async def _start_until_ready(self) -> None:
        """Start the container attached to its main process, and read that process's output
        until it prints ``READY_LINE`` (at most 64 KiB; its exit is the start's failure).
        Attached before the start, so no line is missed however fast the process is."""
        from aiodocker.exceptions import DockerError

        seen = bytearray()
        async with self._container.attach(stdout=True, stderr=True, logs=True) as stream:
            try:
                await self._container.start()
            except DockerError as exc:
                raise sandbox_error(exc, f"start of a container of {self.image}") from exc
            while READY_LINE.encode() not in seen:
                message = await stream.read_out()
                if message is None or len(seen) > 1 << 16:
                    raise SandboxError(
                        "the docker sandbox did not get ready: "
                        f"{bytes(seen[-2000:]).decode('utf-8', errors='replace').strip()}"
                    )
                seen += bytes(message.data)

    async def _pick_image(self) -> str:
        names = self.options.candidates()
        for name in names:
            if await image_present(self._docker, name):
                return name
        raise MissingImageError(names, self.options.host)

    async def _copy_repo(self, repo: pathlib.Path) -> None:
        """The host repository (a directory or a tarball) unpacked into the workspace."""
        data = await asyncio.to_thread(repo_tarball, repo)
        try:
            await self._container.put_archive(self.workdir, data)
        except Exception as exc:
            raise sandbox_error(exc, f"copy of {repo} into {self.workdir}") from exc

    async def _seed_of_workspace(self) -> bytes:
        """What a size-limited workspace starts with: the image's ``workdir`` (read from
        the created container) and the task's repository, as one plain tarball."""
        from aiodocker.exceptions import DockerError

        try:
            shipped = await self._container.get_archive(self.workdir)
        except DockerError as exc:
            if exc.status != 404:
                raise sandbox_error(exc, f"read of the image's {self.workdir}") from exc
            shipped = None  # the image ships no workspace
        repo = self.options.repo
        data = await asyncio.to_thread(repo_tarball, pathlib.Path(repo)) if repo else None
        return await asyncio.to_thread(seed_archive, shipped, data)

    async def _seed_workspace(self, seed: bytes) -> None:
        """Unpack ``seed`` into the tmpfs workspace and give it to the agent."""
        w, uid = shlex.quote(self.workdir), self.agent_uid
        argv = ["sh", "-c", f"tar -xf - -C {w} && chown -R {uid}:{uid} {w}"]
        code, _, err = await execs.stdin_command(
            self._container, argv, execs.bytes_chunks(seed), user="0:0", limit=4096, timeout=600
        )
        if code != 0:
            raise SandboxError(
                f"could not fill the workspace {self.workdir} ({len(seed)} bytes of tar, "
                f"limit {self.options.workspace_limit_mb} MiB): {err.text().strip()}; raise "
                "workspace_size_mb (AGENTRL_DOCKER_WORKSPACE_MB) or use an image with tar"
            )

    async def _logs(self) -> str:
        with contextlib.suppress(Exception):
            lines = await self._container.log(stdout=True, stderr=True, tail=20)
            return "".join(lines)[-2000:]
        return ""

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Shielded: a caller cancelled while leaving the context must not leak the container.
        await asyncio.shield(self._teardown())

    async def _teardown(self) -> None:
        docker, self._docker = self._docker, None
        if docker is None:
            if self._state is not None:
                await asyncio.to_thread(shutil.rmtree, self._state, True)
            return
        try:
            if self.container_id is not None:
                await labels.remove_all(docker, [self.container_id], "at close")
        except Exception:
            logger.exception("docker sandbox teardown failed")
        finally:
            await docker.close()
            if self._state is not None:
                await asyncio.to_thread(shutil.rmtree, self._state, True)

    async def lost_externally(self, error: BaseException) -> bool:
        """True when this host ended the sandbox: its teardown began, the container was
        removed or stopped from outside (the agent, unprivileged, cannot stop its
        container's init), or the daemon itself failed to answer (an API error). A
        container its own memory limit killed (``OOMKilled``) is the agent's doing."""
        if self._closed:
            return True
        if self._container is None:
            return False
        try:
            info = await self._container.show()
        except Exception:
            return True  # 404: removed from outside; anything else: the daemon failed
        state = info.get("State") or {}
        return not state.get("Running", False) and not state.get("OOMKilled", False)

    # -- exec ------------------------------------------------------------------------------
    def _check_alive(self) -> Any:
        if self._closed:
            raise SandboxGoneError("the docker sandbox is closed")
        if self._container is None:
            raise SandboxError("the docker sandbox is not started; use `async with` or start()")
        return self._container

    def _user(self, user: str) -> tuple[str, dict[str, str]]:
        if user == "root":
            return "0:0", {"HOME": "/root", "USER": "root"}
        if user == "agent":
            uid = self.agent_uid
            return f"{uid}:{uid}", {"HOME": AGENT_HOME, "USER": "agent"}
        raise SandboxError(f"unknown user {user!r}; the docker sandbox has ['root', 'agent']")

    async def run_exec(self, request: ExecRequest) -> ExecResult:
        """One Docker exec as ``request.user``, in ``request.workdir`` (default the workdir)."""
        container = self._check_alive()
        user, user_env = self._user(request.user)
        env = {**user_env, **self.env, **(request.env or {})}
        return await execs.run_command(
            container,
            request.cmd,
            user=user,
            env=env,
            workdir=request.workdir or self.workdir,
            timeout=request.timeout,
            limit=self.max_output,
        )

    async def run_long(
        self, request: ExecRequest, *, want_output: bool, max_output: int
    ) -> ExecResult:
        """A long command is one exec here, as any other: the daemon's stream does not
        break under it, and its wrapper kills the command's whole group at its end, at the
        budget and on a cancel, even where the command left no room for a new process."""
        container = self._check_alive()
        user, user_env = self._user(request.user)
        result = await execs.run_command(
            container,
            request.cmd,
            user=user,
            env={**user_env, **self.env, **(request.env or {})},
            workdir=request.workdir or self.workdir,
            timeout=request.timeout,
            limit=min(max_output, self.max_output),
            timeout_code=EXIT_TIME_BUDGET_EXCEEDED,
        )
        if want_output:
            return result
        return ExecResult(exit_code=result.exit_code, stdout="", stderr="")

    # -- files -----------------------------------------------------------------------------
    async def write_file(
        self, path: str, content: str | bytes | pathlib.Path, *, user: str = "root"
    ) -> None:
        """Streamed into ``cat`` run as ``user`` (a host ``Path`` is never read whole)."""
        container = self._check_alive()
        if isinstance(content, pathlib.Path):
            if not await asyncio.to_thread(content.is_file):
                raise FileNotFoundError(f"no such file on the host: {content}")
            chunks = execs.file_chunks(content)
        else:
            chunks = execs.bytes_chunks(content.encode() if isinstance(content, str) else content)  # noqa: ASYNC240 (str, not a path)
        docker_user, _ = self._user(user)
        argv = ["sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "agentrl-write", path]
        code, _, err = await execs.stdin_command(
            container, argv, chunks, user=docker_user, limit=4096, timeout=600
        )
        if code != 0:
            raise SandboxError(f"could not write {path} as {user}: {err.text().strip()}")

    async def read_file(self, path: str, *, user: str = "root", text: bool = True) -> str | bytes:
        """At most ``read_file_max_bytes`` (64 MiB) come back: text keeps its head and tail
        around the truncation marker; bytes of a larger file raise ``SandboxError``."""
        container = self._check_alive()
        docker_user, _ = self._user(user)
        q = shlex.quote(path)
        argv = ["sh", "-c", f"[ -e {q} ] || exit {_EXIT_MISSING}; exec cat -- {q}"]
        code, out, err = await execs.stdin_command(
            container,
            argv,
            execs.no_input(),
            user=docker_user,
            limit=self.read_file_max_bytes,
            timeout=600,
        )
        if code == _EXIT_MISSING:
            raise FileNotFoundError(f"no such file in the sandbox: {path}")
        if code != 0:
            raise SandboxError(f"could not read {path} as {user}: {err.text().strip()}")
        if text:
            return out.text()
        if out.overflowed:
            raise SandboxError(
                f"could not read {path}: it is larger than {self.read_file_max_bytes} bytes"
            )
        return out.raw()

    def url_for(self, host: str, port: int) -> str:
        if port not in self.services:
            raise SandboxError(
                f"no service is bound for port {port} (bound: {sorted(self.services)}); "
                f"create the sandbox with services={{{port}: '/path/to/service.sock'}}"
            )
        return f"http://127.0.0.1:{port}"


def _resolve(options: Mapping[str, Any]) -> DockerOptions:
    """The ``DockerOptions`` of a backend-level call's options (others are ignored)."""
    return DockerOptions.from_keywords(
        {k: v for k, v in options.items() if k in DockerOptions.names()}
    )
