"""Reading files out of an E2B sandbox with a cap: never a whole file into memory."""

from __future__ import annotations

import shlex
from typing import Any

from agentrl.sandboxes.base import SandboxError, truncated

__all__ = ["read_capped"]


async def read_capped(sandbox: Any, path: str, *, user: str, text: bool) -> str | bytes:
    """``path`` of the started ``E2BSandbox`` ``sandbox`` read through the SDK's stream, at
    most ``sandbox.read_file_max_bytes``.

    Text over the cap keeps its head and its tail (up to the exec output cap, read with
    ``tail``) around the truncation marker; bytes over it raise ``SandboxError`` naming
    the cap (a cut file is no file).
    """
    limit = sandbox.read_file_max_bytes
    what = f"read {path} in e2b sandbox {sandbox.sandbox_id}"
    head = await sandbox._call(what, lambda: _read_head(sandbox, path, user, limit + 1))
    if len(head) <= limit:
        return head.decode("utf-8", errors="replace") if text else head
    if not text:
        raise SandboxError(
            f"{path} in e2b sandbox {sandbox.sandbox_id} is larger than read_file's cap of "
            f"{limit} bytes; read a part of it with exec (head -c / tail -c)"
        )
    q = shlex.quote(path)
    keep = min(limit // 2, sandbox.max_output)
    probe = await sandbox.exec(f"stat -c %s {q} && tail -c {keep} {q}", user=user)
    size_text, _, tail = probe.stdout.partition("\n")
    size = int(size_text) if size_text.strip().isdigit() else len(head)
    tail_bytes = tail.encode("utf-8", errors="surrogateescape")[-keep:]
    kept = head[: limit // 2]
    return truncated(kept, tail_bytes, max(0, size - len(kept) - len(tail_bytes)))


async def _read_head(sandbox: Any, path: str, user: str, most: int) -> bytes:
    """The first ``most`` bytes of ``path`` (fewer if it is shorter), streamed."""
    reader = await sandbox._started().files.read(path, format="stream", user=user)
    chunks: list[bytes] = []
    total = 0
    try:
        async for chunk in reader:
            chunks.append(bytes(chunk))
            total += len(chunk)
            if total >= most:
                break
    finally:
        await reader.aclose()
    return b"".join(chunks)[:most]
