"""npm helpers for installing an agent CLI from host-side tarballs, retried by ``agentrl.retry``."""

from __future__ import annotations

import json
import logging
import pathlib
import re
import tarfile
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from agentrl.harnesses.errors import HarnessError
from agentrl.retry import RetryPolicy, retry
from agentrl.types import ExecResult

__all__ = [
    "TRANSIENT_NPM",
    "NpmInstallError",
    "is_transient_npm",
    "jittered_backoff",
    "npm_install_specs",
    "npm_package_dir",
    "package_bin",
    "run_npm_install",
]

logger = logging.getLogger(__name__)

#: npm failures worth retrying: network trouble and registry hiccups, not bad packages.
TRANSIENT_NPM = re.compile(
    r"ECONNRESET|ETIMEDOUT|ESOCKETTIMEDOUT|EAI_AGAIN|ECONNREFUSED|ENOTFOUND|EPIPE|"
    r"socket hang up|network|E429|E5\d\d|503 Service|502 Bad Gateway|504 Gateway",
    re.IGNORECASE,
)


class NpmInstallError(HarnessError):
    """One ``npm install`` that failed; ``transient`` when its output says a retry may help."""

    def __init__(self, message: str, *, output: str, transient: bool) -> None:
        super().__init__(message)
        self.output = output
        self.transient = transient


def is_transient_npm(output: str) -> bool:
    """Whether npm's ``output`` names network trouble or a registry hiccup (worth a retry)."""
    return bool(TRANSIENT_NPM.search(output))


def _transient_failure(exc: Exception) -> bool:
    return isinstance(exc, NpmInstallError) and exc.transient


async def run_npm_install(
    run: Callable[[], Awaitable[ExecResult]], *, what: str, policy: RetryPolicy
) -> None:
    """Await ``run`` (an ``npm install`` in a sandbox) until it exits 0.

    A failure whose output is transient (:data:`TRANSIENT_NPM`) is retried by ``policy``;
    any other, or the last attempt's, raises ``NpmInstallError`` naming ``what``, the exit
    code, the attempt and npm's output.
    """
    tried = 0

    async def install_once() -> None:
        nonlocal tried
        tried += 1
        result = await run()
        if result.exit_code == 0:
            return
        output = (result.stderr + "\n" + result.stdout).strip()
        transient = is_transient_npm(output)
        raise NpmInstallError(
            f"{what} failed (exit {result.exit_code}, attempt {tried}/{policy.attempts}"
            f"{', transient' if transient else ''}): {output[-1500:]}",
            output=output,
            transient=transient,
        )

    def on_retry(attempt: int, exc: Exception, delay: float) -> None:
        output = exc.output if isinstance(exc, NpmInstallError) else str(exc)
        logger.warning(
            "%s failed transiently (attempt %d/%d), retrying in %.1fs: %s",
            what,
            attempt,
            policy.attempts,
            delay,
            output[-300:],
        )

    await retry(install_once, policy=policy, retryable=_transient_failure, on_retry=on_retry)


def jittered_backoff(attempt: int, *, base: float = 1.0, cap: float = 30.0) -> float:
    """Seconds to wait after failed attempt ``attempt`` (1-based): ``RetryPolicy.delay``."""
    return RetryPolicy(base=base, cap=cap).delay(attempt)


def _package_json(tarball: str) -> dict[str, Any]:
    try:
        with tarfile.open(tarball, "r:*") as archive:
            for member in archive:
                if member.name.count("/") == 1 and member.name.endswith("/package.json"):
                    handle = archive.extractfile(member)
                    if handle is not None:
                        return json.load(handle)
    except (tarfile.TarError, OSError, ValueError) as exc:
        raise HarnessError(
            f"{tarball} is not a readable npm package tarball ({exc}); make it with `npm pack`"
        ) from exc
    raise HarnessError(f"{tarball} is not an npm package tarball (no package/package.json)")


def npm_install_specs(tarballs: Sequence[str]) -> list[tuple[str, str | None]]:
    """``(tarball, alias)`` pairs: the name each tarball must be installed under.

    A platform package that a CLI pulls in through an npm alias (Codex's
    ``"@openai/codex-linux-x64": "npm:@openai/codex@0.171.0-linux-x64"``) carries the main
    package's name; it is installed under its alias so the two do not collide.
    """
    manifests = [_package_json(t) for t in tarballs]
    aliases: dict[str, str] = {}
    for manifest in manifests:
        for alias, spec in (manifest.get("optionalDependencies") or {}).items():
            if isinstance(spec, str) and spec.startswith("npm:"):
                aliases[spec[4:]] = alias
    return [
        (tarball, aliases.get(f"{m.get('name')}@{m.get('version')}"))
        for tarball, m in zip(tarballs, manifests, strict=True)
    ]


def _manifest(directory: pathlib.Path) -> dict[str, Any] | None:
    try:
        data = json.loads((directory / "package.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def package_bin(directory: pathlib.Path, package: str, binary: str) -> pathlib.Path | None:
    """The executable ``binary`` of npm package ``package`` installed at ``directory``.

    None when ``directory`` is not that package or its ``package.json`` declares no such
    ``bin`` entry (``"bin": {"claude": "bin/claude.exe"}``, or ``"bin": "cli.js"`` for a
    package whose name is the binary's).
    """
    manifest = _manifest(directory)
    if manifest is None or manifest.get("name") != package:
        return None
    bins = manifest.get("bin")
    if isinstance(bins, str):
        bins = {package.rsplit("/", 1)[-1]: bins}
    entry = bins.get(binary) if isinstance(bins, dict) else None
    return directory / entry if isinstance(entry, str) else None


def npm_package_dir(path: pathlib.Path, package: str) -> pathlib.Path | None:
    """The installed npm package ``package`` that holds ``path``, or None.

    Walks up from ``path``: a platform package nested in the main one (a global
    ``npm install -g`` nests dependencies) is passed over for the package that holds it.
    """
    for parent in path.parents:
        manifest = _manifest(parent)
        if manifest is not None and manifest.get("name") == package:
            return parent
    return None
