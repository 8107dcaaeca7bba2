"""A turn's sampling parameters: the session's defaults, the client's, the context budget.

Public API::

    sampling_params(session, chat, prompt_tokens) -> dict | None   # None: budget full
    DEFAULT_MAX_NEW_TOKENS
"""

from __future__ import annotations

import logging
from typing import Any

from agentrl.adapters.base import ChatRequest
from agentrl.engines.base import TOKEN_EXACT_SAMPLING
from agentrl.serve.sessions import Session

__all__ = ["DEFAULT_MAX_NEW_TOKENS", "sampling_params"]

logger = logging.getLogger(__name__)

#: ``max_new_tokens`` when neither the session nor the client sets one.
DEFAULT_MAX_NEW_TOKENS = 8192
_CLIENT_SAMPLING = ("temperature", "top_p", "top_k")


def sampling_params(
    session: Session, chat: ChatRequest, prompt_tokens: int
) -> dict[str, Any] | None:
    """The engine's sampling parameters for one turn, or None when the prompt fills the budget.

    ``max_new_tokens`` is the smallest of the session's, the client's and what is left of
    the context budget. Under the ``trainer`` policy the client's temperature / top_p /
    top_k are ignored; under ``client`` they override the session's.
    """
    params: dict[str, Any] = {**TOKEN_EXACT_SAMPLING, **session.sampling_defaults}
    for key in _CLIENT_SAMPLING:
        value = getattr(chat, key)
        if value is None:
            continue
        if session.sampling_policy == "client":
            params[key] = value
        elif params.get(key) != value:
            logger.debug(
                "session %s: ignoring client %s=%r (trainer policy)", session.sid, key, value
            )
    limits = [v for v in (params.get("max_new_tokens"), chat.max_tokens) if v is not None]
    max_new = min(int(v) for v in limits) if limits else DEFAULT_MAX_NEW_TOKENS
    if session.max_context_tokens > 0:
        remaining = session.max_context_tokens - prompt_tokens
        if remaining <= 0:
            return None
        max_new = min(max_new, remaining)
    params["max_new_tokens"] = max(1, max_new)
    if chat.stop:
        own = params.get("stop") or []
        own = [own] if isinstance(own, str) else list(own)
        params["stop"] = own + [s for s in chat.stop if s not in own]
    return params
