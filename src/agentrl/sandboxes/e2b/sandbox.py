"""The ``e2b`` sandbox: one E2B sandbox per rollout or grading run, through the real e2b SDK.

The task's image is sent as sandbox metadata under the routing key your E2B gateway
routes images by (``image_metadata_key``), next to an optional size. Calls that fail with
a transient client error (HTTP/2 or TLS protocol errors, connection resets, timeouts,
5xx from the edge) are re-sent with jittered exponential backoff (``agentrl.retry``)
after a connection-pool reset, but only when the call is idempotent: a command sent with
``idempotent=False`` is never re-sent, so it cannot run twice. A sandbox that no longer
exists raises ``SandboxGoneError`` at once. The sandbox is killed on exit whatever
happened; a failed kill is logged (the sandbox then ends when its lifetime runs out).

Creation sends one idempotency key per boot (the ``Booter``'s ``BootKey``, kept across
its re-attempts and our re-sends) and run labels in the metadata (``sweep``), so a
sandbox whose answer was lost is found and killed when the start fails, and the
``sweep`` classmethod kills what a run left at its close.

The e2b SDK is imported only when a sandbox is constructed (the ``e2b`` extra).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import pathlib
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import attrs

from agentrl.extras import install_hint
from agentrl.retry import retry
from agentrl.sandboxes.base import (
    EXIT_EXEC_TIMEOUT,
    READ_FILE_MAX_BYTES,
    ExecRequest,
    Sandbox,
    SandboxError,
    SandboxGoneError,
    cap_output,
    max_output_bytes,
)
from agentrl.sandboxes.boot import BootKey, current_boot_key
from agentrl.sandboxes.e2b import files as _files
from agentrl.sandboxes.e2b import sweep as _sweep
from agentrl.sandboxes.e2b.errors import Verdict, classify, rebuild_handle, reset_sdk_transports
from agentrl.sandboxes.e2b.options import E2BOptions
from agentrl.types import ExecResult, Task

__all__ = ["E2BSandbox", "RetryEvent"]

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: The SDK's own deadline on a command stream sits this far behind ours, as a backstop.
_STREAM_DEADLINE_GRACE_SEC = 30.0


@attrs.frozen(kw_only=True)
class RetryEvent:
    """One transient failure that was retried: which call, which attempt, how long we slept."""

    operation: str
    attempt: int
    delay_sec: float
    error: str


def _import_sdk() -> Any:
    try:
        import e2b
    except ImportError as exc:
        raise ImportError(
            "the 'e2b' sandbox needs the e2b SDK, which is not installed; "
            f"install it with: {install_hint('e2b')}"
        ) from exc
    return e2b


class E2BSandbox(Sandbox):
    """A sandbox on E2B (or any gateway that speaks the E2B API), driven by the e2b SDK.

    Options are keyword arguments; any left as None comes from the environment (see
    ``agentrl.sandboxes.e2b.options.ENV_VARS``; ``environ`` replaces ``os.environ``).
    An image needs ``image_metadata_key``; without an image, ``template`` must be set.
    """

    name = "e2b"

    def __init__(
        self,
        image: str | None = None,
        *,
        workdir: str | None = None,
        environ: Mapping[str, str] | None = None,
        rng: random.Random | None = None,
        **options: Any,
    ) -> None:
        self.options = E2BOptions.resolve(environ, **options)
        self.max_output = max_output_bytes(self.options.max_output_bytes)
        self.read_file_max_bytes = max(READ_FILE_MAX_BYTES, self.max_output)
        self.image = image
        self.workdir = workdir
        self._boot_metadata = self.options.boot_metadata(image)
        self._sdk = _import_sdk()
        self._rng = rng or random.Random()
        self._handle: Any = None
        self.sandbox_id: str | None = None
        #: The boot key of a creation under way (set until it returns or is cleaned up).
        self._creating: BootKey | None = None
        self._own_boot_key = BootKey()
        #: Every retried transient failure of this sandbox, in order.
        self.retry_log: list[RetryEvent] = []

    @classmethod
    def from_task(cls, task: Task, **options: Any) -> E2BSandbox:
        return cls(task.image, workdir=task.workdir, **options)

    @classmethod
    def option_names(cls) -> frozenset[str]:
        """Every ``E2BOptions`` field, plus ``environ`` and ``rng``."""
        return frozenset(attrs.fields_dict(E2BOptions)) | {"environ", "rng"}

    @classmethod
    async def sweep(
        cls, *, run_id: str | None = None, environ: Mapping[str, str] | None = None, **options: Any
    ) -> list[str]:
        """Kill every sandbox of run ``run_id`` still alive (call it when the run closes).

        ``run_id`` defaults to the ``run_id`` option, else this process's run id; the
        other options are the sandboxes' (the E2B target and ``owner``). Returns the ids
        killed; a failed listing is logged and returns ``[]``.
        """
        options.pop("rng", None)
        resolved = E2BOptions.resolve(environ, **options)
        run = run_id or resolved.run_id or _sweep.process_run_id()
        return await _sweep.sweep_run(_import_sdk(), resolved, run)

    @classmethod
    async def sweep_stale_runs(
        cls, *, environ: Mapping[str, str] | None = None, **options: Any
    ) -> list[str]:
        """Kill this deployment's (``owner``) sandboxes left by other runs whose process is
        gone; the ids killed (``[]``, logged, when the listing fails). ``sweep_stale=True``
        does this before the first creation."""
        options.pop("rng", None)
        return await _sweep.sweep_stale(_import_sdk(), E2BOptions.resolve(environ, **options))

    @classmethod
    def check_task(cls, task: Task, **options: Any) -> None:
        """The e2b SDK is installed and the task's image (or the template) can be routed."""
        explicit = {k: v for k, v in options.items() if k not in ("environ", "rng")}
        E2BOptions.resolve(options.get("environ"), **explicit).boot_metadata(task.image)
        try:
            _import_sdk()
        except ImportError as exc:
            raise SandboxError(str(exc)) from None

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Create the sandbox; on failure, kill what a lost answer may have created."""
        if self._handle is not None:
            raise SandboxError(f"e2b sandbox {self.sandbox_id} is already started")
        options = self.options
        if options.sweep_stale:
            await _sweep.sweep_stale_once(self._sdk, options)
        # One key per boot: a re-send (ours or the Booter's) gets the sandbox already made.
        boot = current_boot_key() or self._own_boot_key
        key = boot.value
        metadata = {**self._boot_metadata, **_sweep.run_labels(options, key)}
        maybe_created = False

        async def create() -> Any:
            nonlocal maybe_created
            try:
                return await self._sdk.AsyncSandbox.create(
                    template=options.template,
                    timeout=options.lifetime_sec,
                    metadata=metadata,
                    idempotency_key=key,
                    **options.network_params(),
                    **options.sdk_params(),
                )
            except Exception as exc:
                # A transport failure may have lost the answer to a creation that happened.
                maybe_created = maybe_created or classify(exc) is Verdict.TRANSIENT
                raise

        what = f"create e2b sandbox (image {self.image!r}, template {options.template!r})"
        self._creating = boot
        try:
            self._handle = await self._call(what, create, booting=True)
        except SandboxError as exc:
            self._creating = None
            killed = await asyncio.shield(self._reap(boot)) if maybe_created else []
            if killed:
                raise SandboxError(
                    f"{exc} (killed {len(killed)} sandbox(es) it had created under lost "
                    f"answers: {', '.join(killed)})"
                ) from exc.__cause__
            raise
        self._creating = None
        self.sandbox_id = self._handle.sandbox_id
        logger.info("e2b sandbox %s started (image %s)", self.sandbox_id, self.image)

    async def _reap(self, boot: BootKey) -> list[str]:
        """Kill what was created under ``boot``'s key; a next attempt then gets a new key."""
        killed = await _sweep.reap_boot(self._sdk, self.options, boot.value)
        if killed:
            boot.retire()
        return killed

    async def aclose(self) -> None:
        if self._handle is None:
            if self._creating is not None:  # the start was cancelled mid-creation
                boot, self._creating = self._creating, None
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._reap(boot))
            return
        handle = self._handle
        try:
            # Shielded: a caller cancelled while leaving the context must not leak the sandbox.
            killed = await asyncio.shield(
                self._call(
                    f"kill e2b sandbox {self.sandbox_id}", lambda: (self._handle or handle).kill()
                )
            )
            if not killed:
                logger.info("e2b sandbox %s was already gone at exit", self.sandbox_id)
        except Exception as exc:
            logger.warning(
                "could not kill e2b sandbox %s (%s); it ends when its lifetime of %ss runs out",
                self.sandbox_id,
                exc,
                self.options.lifetime_sec,
            )
        finally:
            self._handle = None

    async def lost_externally(self, error: BaseException) -> bool:
        """True on our teardown, or when the E2B API says the sandbox is gone (the agent has
        no API key and cannot stop its VM); a mute envd is no evidence (an OOM does that)."""
        cause, depth = error, 0
        while cause is not None and not isinstance(cause, SandboxGoneError) and depth < 16:
            cause, depth = cause.__cause__ or cause.__context__, depth + 1
        return self._handle is None or isinstance(cause, SandboxGoneError)

    # -- retry core ------------------------------------------------------------------------
    def _started(self) -> Any:
        if self._handle is None:
            raise SandboxError("the e2b sandbox is not started; use it as `async with sandbox:`")
        return self._handle

    def _reset_connections(self) -> None:
        reset_sdk_transports()
        if self._handle is not None:
            self._handle = rebuild_handle(self._handle)

    async def _call(
        self,
        operation: str,
        attempt_once: Callable[[], Awaitable[T]],
        *,
        idempotent: bool = True,
        booting: bool = False,
    ) -> T:
        """Run ``attempt_once``; re-send it after transient failures if it is idempotent."""
        policy = self.options.retry_policy

        async def once() -> T:
            try:
                return await attempt_once()
            except (asyncio.CancelledError, SandboxError, ImportError):
                raise
            except Exception as exc:
                raise self._verdict(operation, exc, idempotent, booting) from exc

        def on_retry(attempt: int, transient: Exception, delay: float) -> None:
            exc = transient.__cause__
            self.retry_log.append(
                RetryEvent(
                    operation=operation,
                    attempt=attempt,
                    delay_sec=delay,
                    error=f"{type(exc).__name__}: {exc}"[:300],
                )
            )
            logger.warning(
                "%s: transient %s (retry %d/%d in %.2fs, fresh connections): %s",
                operation,
                type(exc).__name__,
                attempt,
                policy.retries,
                delay,
                str(exc)[:200],
            )
            self._reset_connections()

        try:
            return await retry(
                once, policy=policy, retryable=_Transient, on_retry=on_retry, rng=self._rng
            )
        except _Transient as last:
            exc = last.__cause__
            raise SandboxError(
                f"{operation} failed after {policy.attempts} attempts; last error "
                f"{type(exc).__name__}: {exc}. Raise AGENTRL_E2B_RPC_RETRIES or check "
                "the network path to the E2B API / sandbox."
            ) from exc

    def _verdict(
        self, operation: str, exc: Exception, idempotent: bool, booting: bool
    ) -> Exception:
        """What a failed call raises: ``_Transient`` when a re-send may succeed."""
        if _is_missing_file(exc):
            return FileNotFoundError(f"{operation}: no such file ({exc})")
        verdict = classify(exc)
        if verdict is Verdict.GONE and not booting:
            return SandboxGoneError(
                f"{operation}: e2b sandbox {self.sandbox_id} no longer exists ({exc}); "
                f"it was killed or its lifetime ({self.options.lifetime_sec}s) ran out. "
                "Start a new sandbox (or raise AGENTRL_E2B_LIFETIME_SEC)."
            )
        if verdict is not Verdict.TRANSIENT:
            return self._fatal(operation, exc, booting)
        if not idempotent:
            return SandboxError(
                f"{operation} failed with a transient error ({type(exc).__name__}: "
                f"{exc}); it was not re-sent because the call is not idempotent and "
                "could have run already. Check its effects before running it again."
            )
        return _Transient(operation)

    def _fatal(self, operation: str, exc: Exception, booting: bool) -> SandboxError:
        if booting:
            target = (
                self.options.api_url or f"the E2B API of domain {self.options.domain or 'e2b.app'}"
            )
            return SandboxError(
                f"{operation} was refused by {target}: {type(exc).__name__}: {exc}. Check the "
                "API key, that the gateway knows the image / template, and the metadata key "
                f"{self.options.image_metadata_key!r}."
            )
        return SandboxError(f"{operation} failed: {type(exc).__name__}: {exc}")

    # -- commands --------------------------------------------------------------------------
    async def run_exec(self, request: ExecRequest) -> ExecResult:
        """One exec, re-sent after a transient failure only when ``request.idempotent``."""
        return await self._call(
            f"exec {request.cmd[:80]!r} in e2b sandbox {self.sandbox_id}",
            lambda: self._exec_once(
                request.cmd,
                user=request.user,
                env=request.env,
                timeout=request.timeout,
                workdir=request.workdir,
            ),
            idempotent=request.idempotent,
        )

    async def _exec_once(
        self,
        cmd: str,
        *,
        user: str,
        env: Mapping[str, str] | None,
        timeout: float,
        workdir: str | None,
    ) -> ExecResult:
        from e2b.sandbox.commands.command_handle import CommandExitException

        limit = self.max_output
        handle = await self._started().commands.run(
            cmd,
            background=True,
            envs=dict(env) if env else None,
            user=user,
            cwd=workdir,
            timeout=timeout + _STREAM_DEADLINE_GRACE_SEC,
            request_timeout=self.options.request_timeout_sec,
        )
        try:
            done = await asyncio.wait_for(handle.wait(), timeout)
        except CommandExitException as exited:
            return ExecResult(
                exit_code=exited.exit_code,
                stdout=cap_output(exited.stdout or "", limit),
                stderr=cap_output(exited.stderr or "", limit),
            )
        except asyncio.CancelledError:
            # The caller gave up: do not leave the command running in the sandbox.
            with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._kill_process(handle)), 5)
            raise
        except asyncio.TimeoutError:
            await self._kill_process(handle)
            note = f"\n[agentrl: command timed out after {timeout:g}s and was killed]\n"
            return ExecResult(
                exit_code=EXIT_EXEC_TIMEOUT,
                stdout=cap_output(handle.stdout or "", limit),
                stderr=cap_output(handle.stderr or "", limit) + note,
            )
        return ExecResult(
            exit_code=done.exit_code,
            stdout=cap_output(done.stdout or "", limit),
            stderr=cap_output(done.stderr or "", limit),
        )

    async def _kill_process(self, handle: Any) -> None:
        """Kill a command and its children.

        envd signals only the process it started, which it puts in a process group of its
        own: after the process, what is left of its group is killed from inside the sandbox
        (a harmless no-op on an envd that does not make one).
        """
        try:
            await handle.kill()
        except Exception as exc:
            logger.warning("could not kill timed-out pid %s: %s", handle.pid, exc)
        try:
            await self._started().commands.run(
                f"kill -KILL -{int(handle.pid)} 2>/dev/null; true",
                user="root",
                timeout=30,
                request_timeout=self.options.request_timeout_sec,
            )
        except Exception as exc:
            logger.warning("could not kill the process group of pid %s: %s", handle.pid, exc)
        try:
            await handle.disconnect()
        except Exception as exc:
            logger.debug("disconnect from pid %s: %s", handle.pid, exc)

    # -- files -----------------------------------------------------------------------------
    async def write_file(
        self, path: str, content: str | bytes | pathlib.Path, *, user: str = "root"
    ) -> None:
        if isinstance(content, pathlib.Path):
            if not await asyncio.to_thread(content.is_file):
                raise FileNotFoundError(
                    f"cannot upload {content} to {path}: it is not a file on the host"
                )
            host_path = content

            async def upload() -> None:
                # Opened per attempt, so a retry re-streams from the first byte.
                with host_path.open("rb") as stream:
                    await self._started().files.write(
                        path, stream, user=user, use_octet_stream=True
                    )

            await self._call(f"upload {host_path} -> {path}", upload)
            return
        if not isinstance(content, (str, bytes)):
            raise TypeError(
                f"write_file content must be str, bytes or pathlib.Path, not {type(content).__name__}"
            )
        await self._call(
            f"write {path} ({len(content)} {'chars' if isinstance(content, str) else 'bytes'})",
            lambda: self._started().files.write(path, content, user=user),
        )

    async def read_file(self, path: str, *, user: str = "root", text: bool = True) -> str | bytes:
        """At most ``read_file_max_bytes`` (64 MiB), streamed (see ``files.read_capped``)."""
        return await _files.read_capped(self, path, user=user, text=text)

    # -- networking ------------------------------------------------------------------------
    def url_for(self, host: str, port: int) -> str:
        """``http://host:port``: the sandbox reaches the host over the network.

        ``host`` must be an address the sandbox can route to (the host's public or VPC
        address), not a loopback or wildcard address.
        """
        try:
            address = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            address = None
        if host in ("localhost",) or (
            address is not None and (address.is_loopback or address.is_unspecified)
        ):
            logger.warning(
                "url_for(%r): an e2b sandbox cannot reach the host at a loopback or wildcard "
                "address; pass an address routable from the sandbox",
                host,
            )
        if address is not None and address.version == 6:
            return f"http://[{address}]:{port}"
        return f"http://{host}:{port}"


class _Transient(Exception):
    """A transient failure of an idempotent call (the SDK's error is its ``__cause__``)."""


def _is_missing_file(exc: BaseException | None) -> bool:
    return exc is not None and any(
        klass.__name__ == "FileNotFoundException" for klass in type(exc).__mro__
    )
