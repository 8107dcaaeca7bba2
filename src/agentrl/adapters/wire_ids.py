"""Wire ids the middleware mints, each traceable to the session turn that produced it.

Clients replay tool-call ids, thinking signatures and reasoning ``encrypted_content``
verbatim, so each one names its turn (``toolu_t3n0_…`` was minted by turn 3) and the
session keeps a map from every minted id to its turn. A sealed reasoning token also
carries the reasoning text itself (base64url), so a replayed reasoning item restores the
exact text even when the client drops its summary.
"""

from __future__ import annotations

import base64
import binascii
import secrets

__all__ = ["SEAL_PREFIX", "mint_id", "seal", "unseal_text"]

SEAL_PREFIX = "agentrl1"


def mint_id(kind: str, turn: int, index: int) -> str:
    """A fresh id like ``toolu_t3n0_5f2c9a1be0d4`` (``[A-Za-z0-9_]`` only)."""
    return f"{kind}_t{turn}n{index}_{secrets.token_hex(6)}"


def seal(kind: str, turn: int, text: str | None = None) -> str:
    """An opaque token for turn ``turn``; with ``text``, one that carries it."""
    body = ""
    if text is not None:
        body = base64.urlsafe_b64encode(text.encode()).rstrip(b"=").decode()
    return f"{SEAL_PREFIX}.{kind}.t{turn}.{body}.{secrets.token_hex(6)}"


def unseal_text(token: str) -> str | None:
    """The text a :func:`seal` token carries, or None when it is not one of ours."""
    parts = token.split(".")
    if len(parts) != 5 or parts[0] != SEAL_PREFIX or not parts[3]:
        return None
    body = parts[3]
    try:
        return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()
    except (binascii.Error, ValueError):
        return None
