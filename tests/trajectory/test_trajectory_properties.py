"""Property tests for agentrl.trajectory: the TITO invariants hold for generated sessions.

Sessions are generated as chat histories whose messages render to token ids the way a
chat template does (``[ROLE, *ids]`` per message, then a generation marker equal to the
assistant role id), so an honest prompt extends the previous turn's prompt + output
exactly. On top of that the generator forks branches at random depths, opens sub-agent
and compaction branches, repeats prompts, rewrites replayed assistant messages and injects
token drift (insertions, replacements, deletions) at random positions and lengths.

Profiles: ``ci`` (default, fast) and ``thorough``; pick one with
``HYPOTHESIS_PROFILE=thorough``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from unittest import mock

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from agentrl.trajectory import TrainingSample, TrajectoryManager, TurnRecord, tree

_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large]
# Own profile names, so a project-wide ``ci`` profile (hypothesis ships one) is not
# changed; HYPOTHESIS_PROFILE=thorough selects the long run.
settings.register_profile(
    "trajectory-ci", max_examples=300, deadline=None, suppress_health_check=_HEALTH
)
settings.register_profile(
    "trajectory-thorough", max_examples=10_000, deadline=None, suppress_health_check=_HEALTH
)
_THOROUGH = os.environ.get("HYPOTHESIS_PROFILE", "ci") == "thorough"
PROFILE = settings.get_profile("trajectory-thorough" if _THOROUGH else "trajectory-ci")

ROLE = {"system": 1, "user": 2, "assistant": 3, "tool": 4}
GEN = ROLE["assistant"]
DRIFT_IDS = (7, 8, 9)
THRESHOLDS = st.sampled_from([0, 1, 2, 3, 5, 1024, 1024, 1024])


@dataclass
class Turn:
    """One recorded engine call, as the middleware would pass it."""

    messages: list[dict]
    prompt: list[int]
    output: list[int]
    logprobs: list[float]
    finish: str
    response: dict | None


@dataclass
class Session:
    """A generated session and what is known about its shape."""

    turns: list[Turn] = field(default_factory=list)
    linear: bool = True  # one branch, honest prompts, no rewrites, non-empty outputs
    rerendered: set[int] = field(default_factory=set)  # turns whose replay re-tokenizes


class _Renderer:
    """Assigns ids to message contents and renders histories to prompt ids."""

    def __init__(self) -> None:
        self.ids: dict[str, list[int]] = {}

    def message(self, role: str, label: str, ids: list[int]) -> dict:
        self.ids[label] = ids
        return {"role": role, "content": label}

    def last_assistant_span(self, history: list[dict]) -> tuple[int, int] | None:
        """Where the latest assistant message's ids sit in ``render(history)``."""
        span, position = None, 0
        for message in history:
            length = 1 + len(self.ids[message["content"]])
            if message["role"] == "assistant":
                span = (position + 1, position + length)
            position += length
        return span

    def render(self, history: list[dict]) -> list[int]:
        out: list[int] = []
        for message in history:
            out += [ROLE[message["role"]], *self.ids[message["content"]]]
        return [*out, GEN]


@st.composite
def sessions(draw, linear: bool = False, rerender: bool = False) -> Session:
    """Generate a session; ``linear`` keeps it to one honest branch.

    With ``rerender`` (linear sessions only) the template may re-tokenize a replayed
    response differently from what was sampled, consistently in every later prompt.
    """
    vocab = draw(st.integers(3, 30))
    token = st.integers(100, 100 + vocab)
    renderer = _Renderer()
    counter = iter(range(10**6))

    def new_message(role: str, min_size: int = 0) -> dict:
        label = f"{role}-{next(counter)}"
        return renderer.message(role, label, draw(st.lists(token, min_size=min_size, max_size=5)))

    system = new_message("system", 1)
    branches = [[system, new_message("user", 1)]]
    session = Session()
    ops = ["continue"] if linear else ["continue"] * 4 + ["fork", "sub", "compact", "repeat"]
    for index in range(1, draw(st.integers(1, 10)) + 1):
        op = draw(st.sampled_from(ops))
        b = draw(st.integers(0, len(branches) - 1))
        history = branches[b]
        if op == "fork":
            cut = draw(st.integers(1, len(history)))
            history = [*history[:cut], new_message(draw(st.sampled_from(["user", "tool"])))]
            branches.append(history)
            b = len(branches) - 1
        elif op == "sub":
            history = [new_message("system", 1), new_message("user", 1)]
            branches.append(history)
            b = len(branches) - 1
        elif op == "compact":
            history = [system, new_message("user", 1)]
            branches.append(history)
            b = len(branches) - 1
        elif op == "repeat" and session.turns:
            previous = draw(st.sampled_from(session.turns))
            history = list(previous.messages)
        if not linear and draw(st.integers(0, 4)) == 0:
            history = _rewrite_last_assistant(draw, renderer, history, token)
        if rerender and index > 1 and draw(st.booleans()):
            label = history[-2]["content"]  # the latest response, before its tool result
            renderer.ids[label] = _drift(draw, renderer.ids[label], None)
            session.rerendered.add(index - 1)
        prompt = renderer.render(history)
        if not linear and draw(st.integers(0, 2)) == 0:
            prompt = _drift(draw, prompt, renderer.last_assistant_span(history))
            session.linear = False
        output = draw(st.lists(token, min_size=1 if linear else 0, max_size=8))
        logprobs = [-(index * 1000 + k + 1) / 1000 for k in range(len(output))]
        if not linear and output and draw(st.integers(0, 9)) == 0:
            logprobs = []  # the engine sent none
        finish = draw(st.sampled_from(["stop", "length", "tool_calls"]))
        response = None
        if output:
            response = renderer.message("assistant", f"assistant-{next(counter)}", output)
        session.turns.append(Turn(history, prompt, output, logprobs, finish, response))
        after = [*history, response] if response is not None else list(history)
        branches[b] = [*after, new_message(draw(st.sampled_from(["user", "tool"])), 1)]
    session.linear = session.linear and linear and not session.rerendered
    return session


def _rewrite_last_assistant(draw, renderer: _Renderer, history: list[dict], token) -> list[dict]:
    """Replace the latest assistant message by a rewritten copy (same or drifted ids)."""
    positions = [i for i, m in enumerate(history) if m["role"] == "assistant"]
    if not positions:
        return history
    i = positions[-1]
    ids = list(renderer.ids[history[i]["content"]])
    if ids and draw(st.booleans()):
        ids[draw(st.integers(0, len(ids) - 1))] = draw(token)
    rewritten = renderer.message("assistant", history[i]["content"] + "~", ids)
    return [*history[:i], rewritten, *history[i + 1 :]]


def _drift(draw, prompt: list[int], response: tuple[int, int] | None) -> list[int]:
    """Insert, replace or delete a short run of ids at a random position.

    Two times in three the position lies inside the latest replayed response (when there is
    one), where a short drift can be realigned instead of forking.
    """
    if response is not None and response[0] < response[1] and draw(st.integers(0, 2)):
        at = draw(st.integers(response[0], response[1] - 1))
    else:
        at = draw(st.integers(0, len(prompt) - 1))
    length = draw(st.integers(1, 3))
    run = [draw(st.sampled_from(DRIFT_IDS)) for _ in range(length)]
    kind = draw(st.sampled_from(["insert", "replace", "delete"]))
    if kind == "insert":
        return [*prompt[:at], *run, *prompt[at:]]
    if kind == "replace":
        return [*prompt[:at], *run, *prompt[at + length :]] or run
    return (prompt[:at] + prompt[at + length :]) or run


def record(manager: TrajectoryManager, sid: str, session: Session) -> None:
    for turn in session.turns:
        manager.record_turn(
            sid,
            TurnRecord(turn.prompt, turn.output, turn.logprobs, turn.finish),
            prompt_messages=turn.messages,
            response_message=turn.response,
        )


def check_tito(samples: list[TrainingSample], session: Session, limit: int = 0) -> None:
    """Invariants 1–3 (and 5 when ``limit`` is set) for one session's samples."""
    used: set[tuple[int, int]] = set()
    for sample in samples:
        # 3: sizes agree and the response is never empty.
        assert sample.response_length >= 1
        assert len(sample.loss_mask) == len(sample.rollout_logprobs) == sample.response_length
        assert len(sample.tokens) - sample.prompt_length == sample.response_length
        assert any(sample.loss_mask)
        if limit:
            assert len(sample.tokens) <= limit
        md = sample.metadata
        # The sample is a prefix of its last turn's prompt + output, starting with the
        # prompt of its first turn.
        first, last = session.turns[md["turns"][0] - 1], session.turns[md["turns"][-1] - 1]
        if not md["tokens_cut"]:
            assert list(sample.tokens) == [*last.prompt, *last.output]
        assert list(sample.tokens[: sample.prompt_length]) == first.prompt
        # Provenance lists exactly the turns whose output starts inside the sample.
        assert set(md["trained_turns"]) <= set(md["turns"])
        for turn_index in md["turns"]:
            start = len(session.turns[turn_index - 1].prompt)
            assert start < len(sample.tokens) or (
                start == len(sample.tokens) and not md["tokens_cut"]
            )
        # 1 and 2: each trained position is a sampled token with its own log-prob, and
        # each sampled token is trained at most once across the session.
        for i, bit in enumerate(sample.loss_mask):
            position = sample.prompt_length + i
            lp = sample.rollout_logprobs[i]
            if not bit:
                assert lp == 0.0
                continue
            turn_index = _owner(sample, position, session)
            turn = session.turns[turn_index - 1]
            start = len(turn.prompt)
            offset = position - start
            assert 0 <= offset < len(turn.output)
            assert sample.tokens[position] == turn.output[offset]
            assert lp == (turn.logprobs[offset] if turn.logprobs else 0.0)
            assert (turn_index, offset) not in used
            used.add((turn_index, offset))


def _owner(sample: TrainingSample, position: int, session: Session) -> int:
    """The turn whose output sits at ``position`` of ``sample`` (among its turns)."""
    for turn_index in sample.metadata["trained_turns"]:
        turn = session.turns[turn_index - 1]
        if len(turn.prompt) <= position < len(turn.prompt) + len(turn.output):
            return turn_index
    raise AssertionError(f"trained position {position} lies in no trained turn's output")


def _count_shapes(samples: list[TrainingSample]) -> None:
    """Report which mechanisms a generated session exercised (hypothesis statistics)."""
    event(f"samples={min(len(samples), 4)}")
    for name, hit in (
        ("realigned", any(s.metadata["realigned_turns"] for s in samples)),
        ("merged rewrite", any(s.metadata["merged_turns"] for s in samples)),
        ("token fork", any(s.metadata["segment"] for s in samples)),
        ("shared turn untrained", any(not all(s.loss_mask) for s in samples)),
    ):
        if hit:
            event(name)


def check_released(manager: TrajectoryManager, sid: str) -> None:
    """Invariant 6: nothing is held for ``sid`` any more."""
    assert not manager.has_session(sid)
    assert manager.turn_count(sid) == 0
    assert manager.session_stats(sid) is None
    assert manager.get_trajectory(sid, reward=1.0) == []
    assert sid not in manager._sessions


@PROFILE
@given(session=sessions(), threshold=THRESHOLDS, split=st.sampled_from(["full", "divide"]))
def test_generated_sessions_keep_tito_invariants(session, threshold, split):
    """Any generated session yields samples satisfying invariants 1–3 and 6."""
    manager = TrajectoryManager(fork_threshold_tokens=threshold, reward_split=split)
    record(manager, "s", session)
    samples = manager.get_trajectory("s", reward=2.0)
    check_tito(samples, session)
    _count_shapes(samples)
    expected = 2.0 / len(samples) if split == "divide" and samples else 2.0
    assert all(sample.reward == expected for sample in samples)
    check_released(manager, "s")


@PROFILE
@given(session=sessions(linear=True), threshold=THRESHOLDS)
def test_linear_sessions_give_one_sample_of_all_outputs(session, threshold):
    """Invariant 4: a linear, drift-free session gives one sample training every output."""
    manager = TrajectoryManager(fork_threshold_tokens=threshold)
    record(manager, "s", session)
    (sample,) = manager.get_trajectory("s", reward=1.0)
    check_tito([sample], session)
    trained = [
        t
        for t, bit in zip(sample.tokens[sample.prompt_length :], sample.loss_mask, strict=False)
        if bit
    ]
    assert trained == [token for turn in session.turns for token in turn.output]
    assert sample.metadata["trained_turns"] == tuple(range(1, len(session.turns) + 1))
    check_released(manager, "s")


@PROFILE
@given(session=sessions(linear=True, rerender=True), threshold=st.sampled_from([0, 9, 1024]))
def test_rerendered_latest_response_is_realigned(session, threshold):
    """A linear session whose replays re-tokenize the latest response stays one sample.

    Each re-tokenized response is realigned (context, untrained) and every other output
    trains in order; with the threshold at 0 each such drift forks instead.
    """
    manager = TrajectoryManager(fork_threshold_tokens=threshold)
    record(manager, "s", session)
    samples = manager.get_trajectory("s", reward=1.0)
    check_tito(samples, session)
    if threshold == 0:
        assert len(samples) == len(session.rerendered) + 1
        return
    (sample,) = samples
    assert set(sample.metadata["realigned_turns"]) == session.rerendered
    kept = [i for i in range(1, len(session.turns) + 1) if i not in session.rerendered]
    assert sample.metadata["trained_turns"] == tuple(kept)
    trained = [
        t
        for t, bit in zip(sample.tokens[sample.prompt_length :], sample.loss_mask, strict=False)
        if bit
    ]
    assert trained == [token for i in kept for token in session.turns[i - 1].output]


@PROFILE
@given(session=sessions(), threshold=THRESHOLDS, data=st.data())
def test_truncation_keeps_invariants(session, threshold, data):
    """Invariant 5: with max_sample_tokens the invariants hold and no sample is too long."""
    longest = max(len(t.prompt) + len(t.output) for t in session.turns)
    limit = data.draw(st.integers(1, longest + 2), label="max_sample_tokens")
    manager = TrajectoryManager(fork_threshold_tokens=threshold)
    record(manager, "s", session)
    samples = manager.get_trajectory("s", reward=1.0, max_sample_tokens=limit)
    check_tito(samples, session, limit)
    event("cut" if any(s.metadata["tokens_cut"] for s in samples) else "not cut")
    for sample in samples:
        assert sample.metadata["truncated"] or sample.metadata["tokens_cut"] == 0
    check_released(manager, "s")


@PROFILE
@given(session=sessions())
def test_drop_session_releases_everything(session):
    """Invariant 6: drop_session leaves nothing behind, and other sessions are untouched."""
    manager = TrajectoryManager()
    record(manager, "gone", session)
    record(manager, "kept", session)
    manager.drop_session("gone")
    check_released(manager, "gone")
    assert manager.turn_count("kept") == len(session.turns)
    check_tito(manager.get_trajectory("kept", reward=1.0), session)
    check_released(manager, "kept")


def _tree_shape(manager: TrajectoryManager, sid: str) -> tuple:
    """The session tree as nested tuples: role, key, generated, turn index, children."""

    def shape(node) -> tuple:
        index = node.tokens.index if node.tokens is not None else None
        return (node.role, node.key, node.generated, index, tuple(map(shape, node.children)))

    return shape(manager._sessions[sid].root)


def _copied(message: dict | None, reverse: bool) -> dict | None:
    """A fresh, equal copy of ``message`` (keys reversed when ``reverse``)."""
    if message is None:
        return None
    items = list(message.items())
    return dict(reversed(items) if reverse else items)


def _uncached(self, messages, response):
    """KeyCache.digests without any cache: every message keyed afresh (the reference)."""
    keys = [tree.message_digest(m) for m in messages]
    return keys, tree.message_digest(response) if response is not None else None


def _record_both(cached, reference, turns) -> None:
    """Record ``turns`` (messages, response, TurnRecord) cached, and uncached as reference."""
    for messages, response, record in turns:
        cached.record_turn("s", record, prompt_messages=messages, response_message=response)
        with mock.patch.object(tree.KeyCache, "digests", _uncached):
            reference.record_turn("s", record, prompt_messages=messages, response_message=response)


def _assert_same(cached, reference) -> None:
    assert _tree_shape(cached, "s") == _tree_shape(reference, "s")
    assert cached.session_stats("s") == reference.session_stats("s")
    assert cached.get_trajectory("s", reward=1.0) == reference.get_trajectory("s", reward=1.0)


@PROFILE
@given(
    session=sessions(),
    threshold=THRESHOLDS,
    copy=st.sampled_from(["same objects", "copies", "reordered copies"]),
)
def test_cached_message_keys_build_the_same_tree(session, threshold, copy):
    """The key cache builds the tree and samples that keying every message afresh builds,
    whether the turns pass the same message objects again (as the middleware does), equal
    copies (a client's fresh parse) or copies with their keys in another order."""
    turns = []
    for turn in session.turns:
        messages, response = turn.messages, turn.response
        if copy != "same objects":
            reverse = copy == "reordered copies"
            messages = [_copied(m, reverse) for m in messages]
            response = _copied(response, reverse)
        record = TurnRecord(turn.prompt, turn.output, turn.logprobs, turn.finish)
        turns.append((messages, response, record))
    cached = TrajectoryManager(fork_threshold_tokens=threshold)
    reference = TrajectoryManager(fork_threshold_tokens=threshold)
    _record_both(cached, reference, turns)
    _assert_same(cached, reference)


# Values Python calls equal but JSON writes differently, and a few that are the same.
_LOOKALIKES = [1, 1.0, True, 0, 0.0, -0.0, False, None, "1", [1], [1.0], (1,), {"a": 1}]
_LOOKALIKES += [{"a": True}, {"a": [0]}, {"a": [False]}, {"a": [-0.0]}, {"a": [0.0]}]


@PROFILE
@given(
    prompts=st.lists(
        st.lists(st.sampled_from(range(len(_LOOKALIKES))), min_size=1, max_size=4),
        min_size=1,
        max_size=6,
    )
)
def test_cache_tells_apart_values_python_calls_equal(prompts):
    """Messages equal in Python but not in JSON (1, 1.0, True; 0.0, -0.0; nested) get their
    own keys: a fresh message at a cached position is reused only when its key is certain."""
    import copy

    turns = []
    for index, picks in enumerate(prompts):
        messages = [
            {"role": "user", "content": "m", "value": copy.deepcopy(_LOOKALIKES[p])} for p in picks
        ]
        record = TurnRecord([1, *picks], [2 + index], [-0.5])
        turns.append((messages, None, record))
    cached, reference = TrajectoryManager(), TrajectoryManager()
    _record_both(cached, reference, turns)
    _assert_same(cached, reference)


def test_same_key_is_exact():
    """same_key says True only where the canonical keys are equal."""
    from agentrl.trajectory.tree import message_key, same_key

    for a in _LOOKALIKES:
        for b in _LOOKALIKES:
            ma, mb = {"v": a}, {"v": b}
            if same_key(ma, mb):
                assert message_key(ma) == message_key(mb), (a, b)
    assert same_key({"a": 1, "b": "x"}, {"b": "x", "a": 1})
    assert not same_key({"a": float("nan")}, {"a": float("nan")})


@PROFILE
@given(
    runs=st.lists(
        st.tuples(st.booleans(), st.lists(st.floats(allow_nan=False), min_size=1, max_size=6)),
        max_size=12,
    )
)
def test_response_tuples_equal_the_plain_conversion(runs):
    """A response region's mask and log-probs built run by run (untrained runs sharing one
    0.0) equal ``tuple(mask)`` and ``tuple(logprobs.tolist())``, types included."""
    from array import array

    from agentrl.trajectory.linearize import _response_tuples

    mask, logprobs = bytearray(), array("d")
    for trained, values in runs:
        mask.extend((1 if trained else 0,) * len(values))
        logprobs.extend(values if trained else [0.0] * len(values))
    got_mask, got_logprobs = _response_tuples(mask, logprobs)
    assert got_mask == tuple(mask) and all(type(bit) is int for bit in got_mask)
    expected = tuple(logprobs.tolist())
    assert [repr(v) for v in got_logprobs] == [repr(v) for v in expected]
