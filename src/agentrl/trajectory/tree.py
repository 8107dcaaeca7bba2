"""The per-session message tree behind :mod:`agentrl.trajectory`.

Each node holds one chat message, matched by role and content: a 16-byte digest of its
canonical JSON key (:func:`message_key`, so dict key order does not matter). A recorded
turn walks down the tree along its prompt messages, mounts whatever does not match as a
new branch, and hangs its generated assistant message below as a leaf carrying the turn's
tokens. :class:`KeyCache` keys each message object once: the next turn's prompt replays
the same objects (the middleware passes what it recorded), so only new messages are keyed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import operator
from array import array
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from agentrl.trajectory.tokens import TokenStore, TurnTokens, common_prefix_length

__all__ = [
    "ChainEntry",
    "KeyCache",
    "MessageNode",
    "SessionTree",
    "has_tool_calls",
    "message_digest",
    "message_key",
    "same_key",
]

logger = logging.getLogger("agentrl.trajectory")

# One entry per assistant node with tokens on a root-to-leaf path: the turn's tokens and
# whether it still trains (False once a client rewrite replaced it, see ``record``).
ChainEntry = tuple[TurnTokens, bool]

_TOOL_BLOCK_TYPES = frozenset({"tool_use", "tool_call", "function_call", "server_tool_use"})


def message_key(message: Mapping[str, Any]) -> str:
    """Canonical text of a message: equal messages give equal keys whatever their key order."""
    return json.dumps(
        message, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=repr
    )


def message_digest(message: Mapping[str, Any]) -> bytes:
    """A 16-byte digest of :func:`message_key`: what the tree stores and matches on."""
    text = message_key(message).encode("utf-8", "surrogatepass")
    return hashlib.blake2b(text, digest_size=16).digest()


def same_key(a: Any, b: Any) -> bool:
    """Whether ``message_key(a) == message_key(b)`` holds for certain, without computing them.

    ``a == b`` (dicts compare whatever their key order, strings in C) and the same JSON
    types throughout: Python has ``1 == 1.0 == True`` and ``0.0 == -0.0``, JSON does not.
    False whenever unsure (a type outside JSON's, a dict subclass): the caller keys then.
    """
    try:
        return bool(a == b) and _same_types(a, b)
    except RecursionError:
        return False


def _same_types(a: Any, b: Any) -> bool:
    kind = type(a)
    if kind is not type(b):
        return False
    if kind is str or a is None:
        return True
    if kind is dict:
        return all(type(k) is str and _same_types(v, b[k]) for k, v in a.items())
    if kind is list or kind is tuple:
        return all(map(_same_types, a, b))
    if kind is float:
        return math.copysign(1.0, a) == math.copysign(1.0, b)
    return kind is int or kind is bool


class KeyCache:
    """The digests of the messages one session's latest turn recorded.

    A message of the previous turn (its prompt or its response) is not keyed again: the
    same object (the middleware passes what it recorded), or at the same position a message
    :func:`same_key` proves equal (a client's fresh copy); every other message is keyed.
    The leading run of messages that are the previous turn's objects at the same positions
    (a turn that extends the last one) is found and its keys copied at C speed, so a turn
    costs what its new messages need, not the history's length. It holds references to
    those objects (so an id is never reused while cached), which the caller keeps alive
    anyway. A message changed in place after it was recorded keeps its old key: record a
    copy instead.
    """

    __slots__ = ("_by_id", "_keys", "_objects")

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[Any, bytes]] = {}
        self._objects: list[Any] = []
        self._keys: list[bytes] = []

    def digests(
        self, messages: Sequence[Mapping[str, Any]], response: Mapping[str, Any] | None
    ) -> tuple[list[bytes], bytes | None]:
        """Digests of ``messages`` and ``response``; these objects become the cache."""
        values = [*messages, response] if response is not None else list(messages)
        objects, known, previous = self._objects, self._keys, self._by_id
        same = list(map(operator.is_, values, objects))
        kept = same.index(False) if False in same else len(same)
        keys = known[:kept]
        for position in range(kept, len(values)):
            message = values[position]
            hit = previous.get(id(message))
            if hit is None or hit[0] is not message:
                hit = (objects[position], known[position]) if position < len(objects) else None
                if hit is None or not same_key(message, hit[0]):
                    hit = None
            keys.append(hit[1] if hit is not None else message_digest(message))
        if kept < len(objects):
            previous = {
                id(message): (message, key) for message, key in zip(values, keys, strict=True)
            }
        else:  # the previous objects all stay where they were: only the new ones are added
            for position in range(kept, len(values)):
                previous[id(values[position])] = (values[position], keys[position])
        self._by_id, self._objects, self._keys = previous, values, keys
        if response is None:
            return list(keys), None
        return keys[:-1], keys[-1]


def has_tool_calls(message: Mapping[str, Any] | None) -> bool:
    """Whether an assistant message calls a tool (OpenAI ``tool_calls`` or content blocks)."""
    if not message:
        return False
    if message.get("tool_calls"):
        return True
    content = message.get("content")
    if isinstance(content, list):
        return any(
            isinstance(block, Mapping) and block.get("type") in _TOOL_BLOCK_TYPES
            for block in content
        )
    return False


class MessageNode:
    """One message in the tree; assistant nodes produced by the engine carry ``tokens``."""

    __slots__ = ("by_key", "children", "generated", "key", "role", "tip", "tokens")

    def __init__(
        self,
        *,
        role: str | None,
        key: bytes | None,
        tip: TurnTokens | None,
        tokens: TurnTokens | None = None,
    ) -> None:
        self.role = role
        self.key = key
        self.tokens = tokens
        self.generated = tokens is not None
        # The nearest turn with tokens on the path from the root to here (inclusive).
        self.tip = tokens if tokens is not None else tip
        self.children: list[MessageNode] = []
        self.by_key: dict[bytes, MessageNode] = {}

    def find(self, key: bytes) -> MessageNode | None:
        return self.by_key.get(key)

    def add(self, child: MessageNode) -> MessageNode:
        self.children.append(child)
        if child.key is not None:
            self.by_key.setdefault(child.key, child)
        return child

    def rekey(self, child: MessageNode, key: bytes) -> None:
        """Give ``child`` a new message key, keeping the lookup index consistent."""
        if child.key is not None and self.by_key.get(child.key) is child:
            del self.by_key[child.key]
            for sibling in self.children:  # another sibling may carry the same old key
                if sibling is not child and sibling.key == child.key:
                    self.by_key.setdefault(sibling.key, sibling)
                    break
        child.key = key
        self.by_key.setdefault(key, child)


class SessionTree:
    """Everything the manager holds for one session."""

    __slots__ = (
        "id_bytes",
        "key_bytes",
        "keys",
        "last_prompt_tokens",
        "last_turn",
        "leaves",
        "root",
        "sampled_tokens",
        "sid",
        "store",
        "turn_count",
        "warned_logprobs",
    )

    def __init__(self, sid: Any) -> None:
        self.sid = sid
        self.root = MessageNode(role=None, key=None, tip=None)
        self.store = TokenStore()
        self.turn_count = 0
        self.leaves = 0
        self.sampled_tokens = 0
        self.last_prompt_tokens = 0
        self.id_bytes = 0
        self.key_bytes = 0
        self.keys = KeyCache()
        self.last_turn: TurnTokens | None = None
        self.warned_logprobs = False

    @property
    def held_bytes(self) -> int:
        """Approximate bytes held: id and log-prob buffers, cached sequences, message digests."""
        return self.id_bytes + self.store.held_bytes + self.key_bytes

    def record(
        self,
        *,
        keys: list[bytes],
        roles: list[Any],
        prompt: array,
        output: array,
        logprobs: array | None,
        finish_reason: str,
        ill_formed: bool,
        response_key: bytes | None,
        use_tool: bool,
        metadata: dict[str, Any] | None,
        fork_threshold: int,
    ) -> int:
        """Route one turn into the tree, store its tokens and return its 1-based index."""
        index = self.turn_count + 1
        node, depth = self._descend(keys)
        node, depth = self._merge_rewrite(node, depth, keys, roles, fork_threshold, index)
        if node is not self.root and not node.children:
            self.leaves -= 1  # ``node`` stops being a leaf
        for key, role in zip(keys[depth:], roles[depth:], strict=True):
            node = node.add(MessageNode(role=role, key=key, tip=node.tip))
            self.key_bytes += len(key)

        base, shared = self._choose_base(prompt, node.tip)
        tokens = TurnTokens(
            index=index,
            base=base if shared else None,
            shared=shared,
            prompt_tail=prompt[shared:],
            output=output,
            logprobs=logprobs,
            finish_reason=finish_reason,
            ill_formed=ill_formed,
            use_tool=use_tool,
            metadata=metadata,
        )
        prompt.extend(output)  # ``prompt`` now holds the turn's whole sequence
        self.store.remember(tokens, prompt, supersedes=node.tip)
        node.add(MessageNode(role="assistant", key=response_key, tip=None, tokens=tokens))
        if response_key is not None:
            self.key_bytes += len(response_key)
        self.leaves += 1
        self.turn_count = index
        self.last_turn = tokens
        self.sampled_tokens += len(output)
        self.last_prompt_tokens = tokens.prompt_length
        self.id_bytes += tokens.held_bytes
        return index

    def _descend(self, keys: list[bytes]) -> tuple[MessageNode, int]:
        node = self.root
        depth = 0
        for key in keys:  # ``by_key.get`` inline: one lookup per message of the prompt
            child = node.by_key.get(key)
            if child is None:
                break
            node = child
            depth += 1
        return node, depth

    def _merge_rewrite(
        self,
        node: MessageNode,
        depth: int,
        keys: list[bytes],
        roles: list[Any],
        fork_threshold: int,
        index: int,
    ) -> tuple[MessageNode, int]:
        """Absorb a client's slightly rewritten replay of a short generated response.

        Without this the original response would stay a dead leaf and train on its own.
        It applies only when the first unmatched message is an assistant message and the
        mount point has exactly one assistant child: a generated, childless leaf shorter
        than the fork threshold. That node takes the replayed message and stops training.
        """
        if fork_threshold <= 0 or depth >= len(keys) or roles[depth] != "assistant":
            return node, depth
        candidates = [child for child in node.children if child.role == "assistant"]
        if len(candidates) != 1:
            if candidates:
                logger.warning(
                    "session %r turn %d: a replayed assistant message matches none of the "
                    "%d assistant branches at this point and could rewrite any of them; "
                    "it starts a new branch instead",
                    self.sid,
                    index,
                    len(candidates),
                )
            return node, depth
        target = candidates[0]
        if (
            target.children
            or not target.generated
            or target.tokens is None
            or len(target.tokens.output) >= fork_threshold
        ):
            return node, depth
        logger.debug(
            "session %r turn %d: merged a rewritten replay of turn %d (%d tokens)",
            self.sid,
            index,
            target.tokens.index,
            len(target.tokens.output),
        )
        node.rekey(target, keys[depth])
        target.generated = False
        return target, depth + 1

    def _choose_base(self, prompt: array, tip: TurnTokens | None) -> tuple[TurnTokens | None, int]:
        """Pick the held turn whose sequence shares the longest prefix with ``prompt``.

        The candidates are the nearest turn above the mount point (the usual case: the
        prompt replays it) and the most recently recorded turn (a repeated prompt, or
        a branch that reuses the last context).
        """
        best: TurnTokens | None = None
        best_shared = 0
        for candidate in (tip, self.last_turn):
            if candidate is None or candidate is best:
                continue
            shared = common_prefix_length(self.store.sequence(candidate), prompt)
            if shared > best_shared:
                best, best_shared = candidate, shared
        return best, best_shared

    def chains(self) -> Iterator[list[ChainEntry]]:
        """Yield, for each leaf in depth-first order, the token-carrying nodes above it."""
        entries: list[ChainEntry] = []
        stack = [(self.root, iter(self.root.children))]
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                if node.tokens is not None:
                    entries.pop()
                continue
            if child.tokens is not None:
                entries.append((child.tokens, child.generated))
            if child.children:
                stack.append((child, iter(child.children)))
                continue
            yield list(entries)
            if child.tokens is not None:
                entries.pop()
