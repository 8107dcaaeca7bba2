"""npm helpers for installing an agent CLI from host-side tarballs."""

from __future__ import annotations

import json
import random
import re
import tarfile
from collections.abc import Sequence
from typing import Any

from agentrl.harnesses.errors import HarnessError

__all__ = ["TRANSIENT_NPM", "jittered_backoff", "npm_install_specs"]

#: npm failures worth retrying: network trouble and registry hiccups, not bad packages.
TRANSIENT_NPM = re.compile(
    r"ECONNRESET|ETIMEDOUT|ESOCKETTIMEDOUT|EAI_AGAIN|ECONNREFUSED|ENOTFOUND|EPIPE|"
    r"socket hang up|network|E429|E5\d\d|503 Service|502 Bad Gateway|504 Gateway",
    re.IGNORECASE,
)


def jittered_backoff(attempt: int, *, base: float = 1.0, cap: float = 30.0) -> float:
    """Seconds to wait before retry ``attempt`` (1-based): exponential, capped, full jitter."""
    return random.uniform(0.5, 1.0) * min(cap, base * 2 ** (attempt - 1))


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
