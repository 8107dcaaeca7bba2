"""How assistant messages are compared when a client replays them.

``exact_key`` keeps key order (a chat template renders keys in the order given);
``loose_key`` is a message as a client may replay it: text trimmed, no reasoning, keys in
any order.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agentrl.trajectory import message_key

__all__ = ["exact_key", "loose_key", "stripped"]


def exact_key(message: Mapping[str, Any]) -> str:
    """A message's text, key order included: equal keys render alike under a chat template."""
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False, default=repr)


def stripped(value: Any) -> Any:
    """``value`` without surrounding whitespace when it is a string, else as it is."""
    return value.strip() if isinstance(value, str) else value


def loose_key(message: Mapping[str, Any]) -> str:
    """A message as a client may replay it: text trimmed, no reasoning, any key order."""
    loose = {k: stripped(v) for k, v in message.items() if k != "reasoning_content"}
    return message_key(loose)
