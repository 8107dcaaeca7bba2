"""A rollout's session as the rollout page shows it: a tree of chains, and each sample's
tokens with their provenance (prompt, context, trained, masked after drift, trained in
another sample) and the REALIGN / FORK / fallback points with their reason.

The facts come from two places: each sample's ``metadata`` (``leaf``, ``segment``,
``turns``, ``trained_turns``, ``realigned_turns``, ``merged_turns``, ``turn_metadata``
with the middleware's turn index, ``prompt_mode``, ``splice_fallback``,
``engine_seconds``) and, where the runner wrote one, the rollout's ``sessions/KEY.json``
(every turn the middleware recorded: sizes, finish reason, tool calls, parse status,
timing). A directory written before the session files existed still shows: what is not
known is None ("unknown" on the page).

Which chain is the main agent, a sub-agent, a side request or a restart is read from the
shape of the session (see :func:`chain_tree`), not told by the client.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.prompts.splice import FALLBACK_REASONS
from agentrl.view.model import integer, number, text

__all__ = [
    "CLASS_CODES",
    "build_session",
    "chain_tree",
    "common_prefix",
    "sample_view",
    "turn_facts",
]

#: One letter per token in a sample's ``classes`` string; the page's CSS class for each.
CLASS_CODES = {
    "p": "tok-prompt",  # the sample's prompt: context, never trained
    "c": "tok-context",  # after the prompt, not sampled here: tool results, user text, template
    "t": "tok-trained",  # sampled and trained (loss mask 1)
    "d": "tok-drift",  # sampled, then masked: the next prompt re-tokenised it (REALIGN)
    "o": "tok-other",  # sampled, trained in another sample of the session (mask 0 here)
}
#: Tool names with which a client starts a sub-agent.
SUBAGENT_TOOLS = frozenset({"Task", "Agent", "spawn_agent", "task"})
_MASK_TO_CODE = bytes.maketrans(b"\x00\x01", b"ct")
REALIGN_REASON = (
    "the next prompt holds this response re-tokenised (a short drift inside the latest "
    "response): the response is kept as the prompt has it, untrained"
)
MERGED_REASON = "the client replayed a rewritten version of this turn: it stays, untrained"


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    lo = 0
    step = 4096
    while lo < n:  # compare in slices: a 128k prefix is a few C-level comparisons
        hi = min(n, lo + step)
        if a[lo:hi] != b[lo:hi]:
            for i in range(lo, hi):
                if a[i] != b[i]:
                    return i
        lo = hi
    return n


def turn_facts(session: Any) -> dict[int, dict[str, Any]]:
    """The middleware's facts of each turn in a session file, by middleware turn index."""
    turns = session.get("turns") if isinstance(session, Mapping) else None
    if not isinstance(turns, list):
        return {}
    facts: dict[int, dict[str, Any]] = {}
    for position, fact in enumerate(turns):
        if not isinstance(fact, Mapping):
            continue
        index = integer(fact.get("index"))
        tools = fact.get("tool_calls")
        facts[index if index is not None else position] = {
            "prompt_tokens": integer(fact.get("prompt_tokens")),
            "output_tokens": integer(fact.get("output_tokens")),
            "finish_reason": text(fact.get("finish_reason"), 50),
            "tool_calls": [t[:100] for t in tools if isinstance(t, str)][:64]
            if isinstance(tools, list)
            else None,
            "ill_formed": fact.get("ill_formed")
            if isinstance(fact.get("ill_formed"), bool)
            else None,
            "engine_seconds": number(fact.get("engine_seconds")),
            "started": number(fact.get("started")),
        }
    return facts


def _ints(value: Any) -> list[int]:
    return [v for v in value if integer(v) is not None] if isinstance(value, list) else []


def _turn_metadata(metadata: Mapping[str, Any]) -> dict[int, Mapping[str, Any]]:
    raw = metadata.get("turn_metadata")
    found: dict[int, Mapping[str, Any]] = {}
    if isinstance(raw, Mapping):
        for key, value in raw.items():
            try:
                index = int(key)
            except (TypeError, ValueError):
                continue
            if isinstance(value, Mapping):
                found[index] = value
    return found


def _turn_entry(traj: int, meta: Mapping[str, Any], facts: Mapping[int, Mapping[str, Any]]):
    middleware = integer(meta.get("middleware_turn"))
    fact = facts.get(middleware) if middleware is not None else None
    entry: dict[str, Any] = {
        "id": middleware if middleware is not None else f"t{traj}",
        "trajectory_turn": traj,
        "middleware_turn": middleware,
        "protocol": text(meta.get("protocol"), 50),
        "prompt_mode": text(meta.get("prompt_mode"), 50),
        "splice_fallback": text(meta.get("splice_fallback"), 200),
        "engine_seconds": number(meta.get("engine_seconds")),
        "prompt_tokens": None,
        "output_tokens": None,
        "finish_reason": None,
        "tool_calls": None,
        "ill_formed": None,
        "started": None,
    }
    if fact:
        for name, value in fact.items():
            if value is not None:
                entry[name] = value
    return entry


def _order(turn: Mapping[str, Any]) -> float:
    middleware = turn.get("middleware_turn")
    return float(middleware) if middleware is not None else float(turn["trajectory_turn"])


def chain_tree(chains: Mapping[int, list[int]], turns: Mapping[int, Mapping[str, Any]]):
    """Each chain (``leaf -> trajectory turns``) placed in the session's tree.

    A chain whose first turn another chain holds is a ``branch`` of it (a rewind). Of
    the rest, the chain with the most turns is the ``main`` agent; a one-turn chain
    calling no tool a ``side request`` (titles, quota checks); a chain that starts between
    the main agent's first and last turn a ``sub-agent`` (``spawned_by`` the main turn
    before it that called a sub-agent tool, when one did); one is a
    ``restart`` when it starts after the main agent's last turn (a compaction, a fresh
    context), ``earlier context`` when it comes before (what the main agent restarted from).
    """
    order = sorted(
        chains, key=lambda leaf: min((_order(turns[t]) for t in chains[leaf]), default=0)
    )
    placed: dict[int, dict[str, Any]] = {}
    owner: dict[int, int] = {}
    roots = []
    for leaf in order:
        first = chains[leaf][0] if chains[leaf] else None
        node = {"leaf": leaf, "turns": chains[leaf], "parent": None, "kind": None, "after": None}
        if first is not None and first in owner:
            node.update(kind="branch", parent=owner[first])
            shared = [t for t in chains[leaf] if t in chains[owner[first]]]
            node["after"] = turns[shared[-1]]["id"] if shared else None
        else:
            roots.append(leaf)
        for t in chains[leaf]:
            owner.setdefault(t, leaf)
        placed[leaf] = node
    if roots:
        main = max(roots, key=lambda leaf: (len(chains[leaf]), -order.index(leaf)))
        placed[main]["kind"] = "main"
        main_turns = sorted(chains[main], key=lambda t: _order(turns[t]))
        lo, hi = _order(turns[main_turns[0]]), _order(turns[main_turns[-1]])
        for leaf in roots:
            if leaf == main:
                continue
            node = placed[leaf]
            start = _order(turns[chains[leaf][0]])
            before = [t for t in main_turns if _order(turns[t]) < start]
            tools = [name for t in chains[leaf] for name in (turns[t]["tool_calls"] or [])]
            if len(chains[leaf]) == 1 and not tools:
                node["kind"] = "side request"
            elif lo < start < hi:
                node["kind"] = "sub-agent"
            elif start > hi:
                node["kind"] = "restart"
            else:
                node["kind"] = "earlier context"
            node["parent"] = main
            if before:
                node["after"] = turns[before[-1]]["id"]
                spawned = set(turns[before[-1]]["tool_calls"] or ()) & SUBAGENT_TOOLS
                node["spawned_by"] = sorted(spawned)[0] if spawned else None
    return [placed[leaf] for leaf in order]


def _span(turn: Mapping[str, Any], size: int) -> tuple[int, int] | None:
    start, count = turn.get("prompt_tokens"), turn.get("output_tokens")
    if start is None or count is None:
        return None
    return min(start, size), min(start + count, size)


def _round(value: Any) -> float | None:
    value = number(value)
    return None if value is None else round(value, 4)


def sample_view(
    row: Mapping[str, Any],
    turns: Mapping[int, Mapping[str, Any]],
    previous: Sequence[int] | None = None,
) -> dict[str, Any] | None:
    """One sample row as the token view draws it (None when the row is malformed)."""
    tokens, mask = row.get("tokens"), row.get("loss_mask")
    prompt_length = integer(row.get("prompt_length"))
    if not isinstance(tokens, list) or not isinstance(mask, list) or prompt_length is None:
        return None
    ids = [t if integer(t) is not None else -1 for t in tokens]
    size = len(ids)
    prompt_length = max(0, min(prompt_length, size))
    response = size - prompt_length
    codes = bytearray(b"p" * prompt_length)
    mask_bytes = bytes(1 if m == 1 else 0 for m in mask[:response])
    codes += mask_bytes.translate(_MASK_TO_CODE) + b"c" * (response - len(mask_bytes))
    logprobs = row.get("rollout_logprobs")
    logprobs = [_round(v) for v in logprobs[:response]] if isinstance(logprobs, list) else []
    metadata = row.get("metadata") if isinstance(row.get("metadata"), Mapping) else {}
    in_sample = _ints(metadata.get("turns"))
    trained = set(_ints(metadata.get("trained_turns")))
    realigned = set(_ints(metadata.get("realigned_turns")))
    markers: list[dict[str, Any]] = []
    segment = integer(metadata.get("segment")) or 0
    if segment and previous is not None:
        shared = common_prefix(previous, ids)
        markers.append(
            {
                "at": shared,
                "kind": "fork",
                "label": "FORK",
                "reason": f"the prompt diverged from the held tokens at token {shared} of "
                f"{len(previous)}: the previous sample closed and this one starts from the "
                "new prompt",
            }
        )
    elif segment:
        markers.append(
            {"at": prompt_length, "kind": "fork", "label": "FORK", "reason": "a new segment"}
        )
    for traj in in_sample:
        turn = turns.get(traj)
        if turn is None:
            continue
        span = _span(turn, size)
        at = span[0] if span else prompt_length
        if span and traj not in trained:
            a, b = max(span[0], prompt_length), span[1]
            fill = b"d" if traj in realigned else b"o"
            if a < b:
                codes[a:b] = codes[a:b].replace(b"c", fill)
        markers.append(
            {
                "at": at,
                "kind": "turn",
                "label": f"turn {turn['id']}",
                "turn": turn["id"],
                "prompt_mode": turn["prompt_mode"],
                "finish_reason": turn["finish_reason"],
                "tool_calls": turn["tool_calls"],
                "ill_formed": turn["ill_formed"],
                "placed": span is not None,
            }
        )
        if turn["splice_fallback"]:
            markers.append(
                {
                    "at": at,
                    "kind": "fallback",
                    "label": f"fallback to render: {turn['splice_fallback']}",
                    "reason": FALLBACK_REASONS.get(turn["splice_fallback"], "an unknown reason"),
                }
            )
        if traj in realigned:
            markers.append(
                {"at": at, "kind": "realign", "label": "REALIGN", "reason": REALIGN_REASON}
            )
    for traj in _ints(metadata.get("merged_turns")):
        label = turns[traj]["id"] if traj in turns else f"t{traj}"
        markers.append(
            {
                "at": prompt_length,
                "kind": "merged",
                "label": f"merged {label}",
                "reason": MERGED_REASON,
            }
        )
    cut = integer(metadata.get("tokens_cut")) or 0
    if cut:
        markers.append(
            {
                "at": size,
                "kind": "cut",
                "label": "cut",
                "reason": f"{cut} tokens cut (max_sample_tokens)",
            }
        )
    markers.sort(key=lambda m: (m["at"], m["kind"] != "fork", m["kind"] != "turn"))
    return {
        "chain_index": integer(row.get("chain_index")),
        "leaf": integer(metadata.get("leaf")),
        "segment": segment,
        "prompt_length": prompt_length,
        "response_length": response,
        "reward": number(row.get("reward")),
        "truncated": metadata.get("truncated") is True,
        "tokens": ids,
        "classes": codes.decode("ascii"),
        "logprobs": logprobs,
        "markers": markers,
        "turns": [turns[t]["id"] for t in in_sample if t in turns],
        "trained_tokens": mask_bytes.count(1),
    }


def build_session(samples: Sequence[Mapping[str, Any]], session: Any = None) -> dict[str, Any]:
    """The session tree and the token views of one rollout's sample rows."""
    facts = turn_facts(session)
    turns: dict[int, dict[str, Any]] = {}
    chains: dict[int, list[int]] = {}
    trained_in: dict[int, int] = {}
    for position, row in enumerate(samples):
        metadata = row.get("metadata") if isinstance(row.get("metadata"), Mapping) else {}
        meta = _turn_metadata(metadata)
        leaf = integer(metadata.get("leaf"))
        leaf = leaf if leaf is not None else -1 - position
        chain = chains.setdefault(leaf, [])
        for traj in _ints(metadata.get("turns")):
            if traj not in turns:
                turns[traj] = _turn_entry(traj, meta.get(traj, {}), facts)
            if traj not in chain:
                chain.append(traj)
        for traj in _ints(metadata.get("trained_turns")):
            trained_in.setdefault(traj, position)
        for traj in _ints(metadata.get("realigned_turns")):
            if traj in turns:
                turns[traj]["realigned"] = True
    for traj, turn in turns.items():
        turn["trained_in_sample"] = trained_in.get(traj)
        turn.setdefault("realigned", False)
    views = []
    by_leaf: dict[int, list[int]] = {}
    for position, row in enumerate(samples):
        metadata = row.get("metadata") if isinstance(row.get("metadata"), Mapping) else {}
        leaf = integer(metadata.get("leaf"))
        previous = None
        if leaf is not None and by_leaf.get(leaf):
            previous = views[by_leaf[leaf][-1]]["tokens"] if views[by_leaf[leaf][-1]] else None
        view = sample_view(row, turns, previous)
        views.append(view)
        if leaf is not None:
            by_leaf.setdefault(leaf, []).append(position)
    sampled = {t["middleware_turn"] for t in turns.values() if t["middleware_turn"] is not None}
    unsampled = [
        {"id": index, "middleware_turn": index, **fact}
        for index, fact in sorted(facts.items())
        if index not in sampled
    ]
    started = [t["started"] for t in [*turns.values(), *unsampled] if t.get("started")]
    origin = min(started) if started else None
    for turn in [*turns.values(), *unsampled]:
        if origin is not None and turn.get("started") is not None:
            turn["offset_seconds"] = round(turn["started"] - origin, 3)
    chains = {leaf: chain for leaf, chain in chains.items() if chain}
    tree = chain_tree(chains, turns) if chains else []
    return {
        "turns": {
            str(turns[t]["id"]): turns[t] for t in sorted(turns, key=lambda t: _order(turns[t]))
        },
        "chains": [{**node, "turns": [turns[t]["id"] for t in node["turns"]]} for node in tree],
        "unsampled": unsampled,
        "samples": [v for v in views if v is not None],
        "facts_known": bool(facts),
    }
