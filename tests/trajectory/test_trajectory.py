"""Scenario tests for agentrl.trajectory: routing, drift handling, fan-out, bad input.

Token ids are readable: each chat message renders as ``[ROLE, *words, END]`` with one id
per word (from 100 up), and a prompt ends with the generation marker, which equals the
assistant role id. A response renders as ``[*words, END]``, so a replayed assistant
message re-renders to exactly the tokens the engine sampled, as with a real chat template
that round-trips.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading

import pytest

from agentrl.trajectory import TrainingSample, TrajectoryManager, TurnRecord

ROLE = {"system": 1, "user": 2, "assistant": 3, "tool": 4}
END = 5
GEN = ROLE["assistant"]
DRIFT = 7
_WORDS: dict[str, int] = {}


def words(text: str) -> list[int]:
    return [_WORDS.setdefault(word, 100 + len(_WORDS)) for word in text.split()]


def msg(role: str, text: str, **extra) -> dict:
    return {"role": role, "content": text, **extra}


def S(text: str = "sys") -> dict:
    return msg("system", text)


def U(text: str = "task") -> dict:
    return msg("user", text)


def A(text: str, **extra) -> dict:
    return msg("assistant", text, **extra)


def T(text: str) -> dict:
    return msg("tool", text)


def render(messages: list[dict]) -> list[int]:
    ids: list[int] = []
    for message in messages:
        ids += [ROLE[message["role"]], *words(message["content"]), END]
    return [*ids, GEN]


def reply(text: str) -> list[int]:
    return [*words(text), END]


def inserted(ids: list[int], at: int) -> list[int]:
    """``ids`` with a drift token spliced in before position ``at``."""
    return [*ids[:at], DRIFT, *ids[at:]]


def replaced(ids: list[int], at: int) -> list[int]:
    """``ids`` with the token at ``at`` replaced by a drift token."""
    return [*ids[:at], DRIFT, *ids[at + 1 :]]


class Driver:
    """Records turns the way the middleware does and remembers what the engine sampled."""

    def __init__(self, manager: TrajectoryManager | None = None, sid: str = "s") -> None:
        self.tm = manager or TrajectoryManager()
        self.sid = sid
        self.outputs: dict[int, tuple[list[int], list[float]]] = {}

    def turn(
        self,
        messages: list[dict],
        text: str | None,
        *,
        prompt: list[int] | None = None,
        finish: str = "stop",
        logprobs: bool = True,
        response: dict | None = None,
        metadata: dict | None = None,
    ) -> tuple[list[int], list[int]]:
        index = self.tm.turn_count(self.sid) + 1
        prompt = render(messages) if prompt is None else prompt
        output = reply(text) if text is not None else []
        lps = [-(index + (k + 1) / 100) for k in range(len(output))]
        if response is None and text is not None:
            response = A(text)
        recorded = self.tm.record_turn(
            self.sid,
            TurnRecord(prompt, output, lps if logprobs else [], finish),
            prompt_messages=messages,
            response_message=response,
            metadata=metadata,
        )
        assert recorded == index
        self.outputs[index] = (output, lps if logprobs else [0.0] * len(output))
        return prompt, output

    def samples(self, **kwargs) -> list[TrainingSample]:
        samples = self.tm.get_trajectory(self.sid, **{"reward": 1.0, **kwargs})
        check_invariants(samples, self.outputs)
        return samples


def check_invariants(samples: list[TrainingSample], outputs: dict) -> None:
    """Sizes agree; each trained position is one sampled token with its log-prob, used once."""
    origin: dict[tuple[int, float], list[tuple[int, int]]] = {}
    for turn, (ids, lps) in outputs.items():
        for position, key in enumerate(zip(ids, lps, strict=True)):
            origin.setdefault(key, []).append((turn, position))
    used: set[tuple[int, int]] = set()
    for sample in samples:
        assert sample.response_length >= 1
        assert len(sample.loss_mask) == len(sample.rollout_logprobs) == sample.response_length
        assert len(sample.tokens) - sample.prompt_length == sample.response_length
        assert any(sample.loss_mask)
        trained_here = set()
        for i, bit in enumerate(sample.loss_mask):
            token, lp = sample.tokens[sample.prompt_length + i], sample.rollout_logprobs[i]
            if not bit:
                assert lp == 0.0
                continue
            candidates = origin.get((token, lp))
            assert candidates, f"trained token {token} at {i} was not sampled with log-prob {lp}"
            if lp != 0.0:  # log-probs are unique per sampled position in these tests
                (where,) = candidates
                assert where not in used, f"sampled token {where} trained twice"
                used.add(where)
                trained_here.add(where[0])
        assert trained_here <= set(sample.metadata["trained_turns"])


def layout(sample: TrainingSample) -> list[tuple[int, int]]:
    """(token, loss_mask) for the response region."""
    return list(zip(sample.tokens[sample.prompt_length :], sample.loss_mask, strict=True))


def ctx(ids: list[int]) -> list[tuple[int, int]]:
    return [(token, 0) for token in ids]


def trained(ids: list[int]) -> list[tuple[int, int]]:
    return [(token, 1) for token in ids]


# ---------------------------------------------------------------- 1: routing tree


def test_single_turn_chain():
    """1.1: one turn gives a system→user→assistant chain and one fully trained sample."""
    d = Driver()
    p1, o1 = d.turn([S(), U()], "hello there")
    assert d.tm.session_stats("s").leaves == 1
    (sample,) = d.samples()
    assert sample.tokens == (*p1, *o1)
    assert sample.prompt_length == len(p1)
    assert sample.loss_mask == (1,) * len(o1)


def test_clean_multiturn_with_tool():
    """1.2: a tool call, its result, a final answer: one sample, tool tokens untrained."""
    d = Driver()
    call = A("run ls", tool_calls=[{"name": "bash", "arguments": {"cmd": "ls"}}])
    p1, o1 = d.turn([S(), U()], "run ls", response=call, finish="tool_calls")
    history = [S(), U(), call, T("a.py b.py")]
    p2, o2 = d.turn(history, "done")
    (sample,) = d.samples()
    assert sample.tokens == tuple(p2 + o2)
    gap = p2[len(p1) + len(o1) :]
    assert layout(sample) == trained(o1) + ctx(gap) + trained(o2)
    assert sample.metadata["use_tool"] is True
    assert sample.metadata["turns"] == (1, 2)


def test_system_fork():
    """1.3: two different system messages give two root subtrees and two samples."""
    d = Driver()
    p1, o1 = d.turn([S("main agent"), U()], "a")
    p2, o2 = d.turn([S("sub agent"), U()], "b")
    assert d.tm.session_stats("s").leaves == 2
    s1, s2 = d.samples()
    assert (s1.tokens, s2.tokens) == (tuple(p1 + o1), tuple(p2 + o2))
    assert all(set(s.loss_mask) == {1} for s in (s1, s2))


def test_user_fork_shared_system():
    """1.4: the same system with different user messages forks at the user level."""
    d = Driver()
    d.turn([S(), U("first")], "a")
    d.turn([S(), U("second")], "b")
    samples = d.samples()
    assert [s.metadata["leaf"] for s in samples] == [1, 2]


def test_assistant_message_fork():
    """1.5: one prompt sampled twice gives two assistant leaves and two samples."""
    d = Driver()
    p, o1 = d.turn([S(), U()], "answer one")
    _, o2 = d.turn([S(), U()], "answer two")
    s1, s2 = d.samples()
    assert s1.tokens == tuple(p + o1) and s2.tokens == tuple(p + o2)
    assert set(s2.loss_mask) == {1}


def test_tool_fork_shared_assistant():
    """1.6: a shared first response with two tool results trains only in the first leaf."""
    d = Driver()
    _p1, o1 = d.turn([S(), U()], "call")
    d.turn([S(), U(), A("call"), T("x")], "after x")
    _p3, o3 = d.turn([S(), U(), A("call"), T("y")], "after y")
    s1, s2 = d.samples()
    assert s1.metadata["trained_turns"] == (1, 2)
    assert s2.metadata["trained_turns"] == (3,)
    assert layout(s2)[: len(o1)] == ctx(o1)
    assert layout(s2)[-len(o3) :] == trained(o3)


def test_token_only_drift_does_not_fork_the_tree():
    """1.7: identical messages with tampered ids share the path; drift stays in the prompt."""
    d = Driver()
    p1, _ = d.turn([S(), U()], "a")
    tampered = inserted(p1, 1)
    _, o2 = d.turn([S(), U()], "b", prompt=tampered)
    stats = d.tm.session_stats("s")
    assert stats.leaves == 2
    _s1, s2 = d.samples()
    assert s2.prompt_length == len(tampered) and s2.tokens[: len(tampered)] == tuple(tampered)
    assert DRIFT not in s2.tokens[s2.prompt_length :]
    assert layout(s2) == trained(o2)


def test_multi_tool_per_turn():
    """1.8: two tool results after one assistant message give one chain and one sample."""
    d = Driver()
    d.turn([S(), U()], "call two")
    p2, o2 = d.turn([S(), U(), A("call two"), T("one"), T("two")], "done")
    (sample,) = d.samples()
    assert sample.metadata["trained_turns"] == (1, 2)
    assert sample.tokens == tuple(p2 + o2)


def test_cross_session_isolation():
    """1.9: two session ids keep independent trees and samples."""
    tm = TrajectoryManager()
    a, b = Driver(tm, "a"), Driver(tm, "b")
    a.turn([S(), U("for a")], "x")
    b.turn([S(), U("for b")], "y")
    b.turn([S(), U("for b"), A("y"), U("more")], "z")
    assert (tm.turn_count("a"), tm.turn_count("b")) == (1, 2)
    assert [s.metadata["turns"] for s in a.samples()] == [(1,)]
    assert tm.has_session("b") and not tm.has_session("a")
    assert [s.metadata["turns"] for s in b.samples()] == [(1, 2)]


def test_empty_response_gives_no_sample():
    """1.10: an empty output (finish=length, no message) makes a leaf but no sample."""
    d = Driver()
    d.turn([S(), U()], None, finish="length")
    assert d.tm.session_stats("s").leaves == 1
    assert d.samples() == []


# ---------------------------------------------------------------- 2: linearisation


def test_single_turn_linearize():
    """2.1: log-probs reach rollout_logprobs and the reward is 1.0."""
    d = Driver()
    d.turn([S(), U()], "one two")
    (sample,) = d.samples()
    assert list(sample.rollout_logprobs) == d.outputs[1][1]
    assert sample.reward == 1.0


def test_clean_multiturn_linearize():
    """2.2: real log-probs for turn 1, 0.0 over the tool gap, real for turn 2."""
    d = Driver()
    p1, o1 = d.turn([S(), U()], "call")
    p2, _o2 = d.turn([S(), U(), A("call"), T("result")], "final")
    (sample,) = d.samples()
    gap = len(p2) - len(p1) - len(o1)
    assert list(sample.rollout_logprobs) == d.outputs[1][1] + [0.0] * gap + d.outputs[2][1]


def test_drift_in_prompt_region_forks():
    """2.3: drift inside the first prompt forks into two samples, each with reward 1.0."""
    d = Driver()
    p1, o1 = d.turn([S(), U()], "call")
    honest = render([S(), U(), A("call"), T("out")])
    p2, o2 = d.turn([S(), U(), A("call"), T("out")], "done", prompt=inserted(honest, 2))
    s1, s2 = d.samples()
    assert s1.tokens == tuple(p1 + o1) and s2.tokens == tuple(p2 + o2)
    assert s2.prompt_length == len(p2) and layout(s2) == trained(o2)
    assert (s1.reward, s2.reward) == (1.0, 1.0)


def _b1_session(threshold: int) -> tuple[Driver, list[int], list[int], list[int], list[int]]:
    d = Driver(TrajectoryManager(fork_threshold_tokens=threshold))
    p1, o1 = d.turn([S(), U()], "call it")
    history = [S(), U(), A("call it"), T("out")]
    drifted = replaced(render(history), len(p1) + len(o1) - 1)  # the response's END
    p2, o2 = d.turn(history, "done", prompt=drifted)
    return d, p1, o1, p2, o2


def test_drift_in_latest_response_short_realigns():
    """2.4: drift inside the latest response with a short new output realigns: one sample."""
    d, p1, _o1, p2, o2 = _b1_session(1024)
    (sample,) = d.samples()
    assert sample.tokens == tuple(p2 + o2)
    assert layout(sample) == ctx(p2[len(p1) :]) + trained(o2)
    assert sample.metadata["realigned_turns"] == (1,)
    assert sample.metadata["trained_turns"] == (2,)


def test_drift_in_latest_response_long_forks():
    """2.5: the same drift with fork_threshold_tokens=1 forks into two samples."""
    d, p1, o1, p2, o2 = _b1_session(1)
    s1, s2 = d.samples()
    assert s1.tokens == tuple(p1 + o1) and s2.tokens == tuple(p2 + o2)


def test_drift_in_latest_response_threshold_zero_forks():
    """2.6: with a threshold of 0 a drifted latest response always forks."""
    d, *_ = _b1_session(0)
    assert len(d.samples()) == 2


def test_drift_in_earlier_response_forks():
    """2.7: drift inside an earlier response forks: turns 1–2, then turn 3 alone."""
    d = Driver()
    p1, _o1 = d.turn([S(), U()], "first")
    h2 = [S(), U(), A("first"), T("r1")]
    p2, o2 = d.turn(h2, "second")
    h3 = [*h2, A("second"), T("r2")]
    p3, o3 = d.turn(h3, "third", prompt=replaced(render(h3), len(p1)))
    s1, s2 = d.samples()
    assert s1.metadata["turns"] == (1, 2) and s1.tokens == tuple(p2 + o2)
    assert s2.metadata["turns"] == (3,) and s2.prompt_length == len(p3)
    assert layout(s2) == trained(o3)


@pytest.mark.parametrize(("split", "expected"), [("full", 1.0), ("divide", 0.5)])
def test_fork_reward_split(split, expected):
    """2.8: a drift fork gives each sample the full reward, or reward/K when dividing."""
    d = Driver(TrajectoryManager(reward_split=split))
    _p1, _ = d.turn([S(), U()], "call")
    d.turn([S(), U(), A("call"), T("x")], "y", prompt=inserted(render([S(), U()]), 1))
    samples = d.samples(reward=1.0)
    assert [s.reward for s in samples] == [expected, expected]
    assert all(s.metadata["num_samples"] == 2 for s in samples)


@pytest.mark.parametrize(("split", "expected"), [("full", 0.8), ("divide", 0.4)])
def test_two_leaves_reward_split(split, expected):
    """2.9: two user-level leaves each get the full reward (or half of it)."""
    d = Driver(TrajectoryManager(reward_split=split))
    d.turn([S(), U("one")], "a")
    d.turn([S(), U("two")], "b")
    assert [s.reward for s in d.samples(reward=0.8)] == [expected, expected]


def test_cross_leaf_dedup():
    """2.10: a shared response trains once; the other leaf has mask 0 and log-prob 0.0."""
    d = Driver()
    _p1, o1 = d.turn([S(), U()], "shared call")
    d.turn([S(), U(), A("shared call"), T("x")], "x done")
    d.turn([S(), U(), A("shared call"), T("y")], "y done")
    s1, s2 = d.samples()
    assert s1.loss_mask[: len(o1)] == (1,) * len(o1)
    assert s2.loss_mask[: len(o1)] == (0,) * len(o1)
    assert s2.rollout_logprobs[: len(o1)] == (0.0,) * len(o1)


def test_replayed_foreign_assistant_is_context():
    """2.11: an assistant message never generated here mounts as loss-0 context."""
    d = Driver()
    history = [S(), U(), A("made up elsewhere"), U("go on")]
    p1, o1 = d.turn(history, "ok")
    (sample,) = d.samples()
    assert sample.prompt_length == len(p1) and layout(sample) == trained(o1)


def test_get_trajectory_consumes_session():
    """2.12: get_trajectory consumes the session; a second call returns []."""
    d = Driver()
    d.turn([S(), U()], "a")
    assert len(d.tm.get_trajectory("s", reward=1.0)) == 1
    assert d.tm.get_trajectory("s", reward=1.0) == [] and not d.tm.has_session("s")
    assert d.tm.session_stats("s") is None and d.tm.turn_count("s") == 0


# ---------------------------------------------------------------- 3: combined


def test_rewrite_merge_absorbs_short_replay():
    """3.1: a slightly rewritten short replay merges; one leaf, only turn 2 trains."""
    d = Driver()
    d.turn([S(), U()], "look here")
    history = [S(), U(), A("look  here "), T("found")]
    p2, o2 = d.turn(history, "done")
    assert d.tm.session_stats("s").leaves == 1
    (sample,) = d.samples()
    assert sample.metadata["trained_turns"] == (2,)
    assert sample.metadata["merged_turns"] == (1,)
    assert sample.prompt_length == len(p2) and layout(sample) == trained(o2)


def test_rewrite_of_long_response_forks():
    """3.2: a rewrite of a response at the threshold forks; both branches train."""
    d = Driver(TrajectoryManager(fork_threshold_tokens=1))
    p1, o1 = d.turn([S(), U()], "look here")
    p2, _o2 = d.turn([S(), U(), A("look  here "), T("found")], "done")
    s1, s2 = d.samples()
    assert s1.tokens == tuple(p1 + o1) and s1.metadata["trained_turns"] == (1,)
    assert s2.metadata["trained_turns"] == (2,) and s2.prompt_length == len(p2)


def test_rewrite_merge_threshold_zero_forks():
    """3.3: a threshold of 0 disables the merge, so the rewrite forks."""
    d = Driver(TrajectoryManager(fork_threshold_tokens=0))
    d.turn([S(), U()], "look here")
    d.turn([S(), U(), A("look  here "), T("found")], "done")
    assert len(d.samples()) == 2


def test_rewrite_merge_ambiguous_forks(caplog):
    """3.4: two assistant siblings make the rewrite target ambiguous: it forks, 3 samples."""
    d = Driver()
    d.turn([S(), U()], "alpha")
    d.turn([S(), U()], "beta")
    with caplog.at_level(logging.WARNING, logger="agentrl.trajectory"):
        d.turn([S(), U(), A("alpha "), T("r")], "gamma")
    assert "2 assistant branches" in caplog.text
    assert [s.metadata["trained_turns"] for s in d.samples()] == [(1,), (2,), (3,)]


def test_rewrite_merge_updates_match_key():
    """3.5: after a merge, replaying the rewritten text descends through the merged node."""
    d = Driver()
    d.turn([S(), U()], "look here")
    h2 = [S(), U(), A("look  here "), T("found")]
    d.turn(h2, "next")
    p3, o3 = d.turn([*h2, A("next"), T("more")], "last")
    assert d.tm.session_stats("s").leaves == 1
    (sample,) = d.samples()
    assert sample.metadata["trained_turns"] == (2, 3)
    assert sample.tokens == tuple(p3 + o3)


def test_tree_fork_plus_token_drift():
    """3.6: a message fork plus a prompt drift inside one leaf: 3 samples, shared trained once."""
    d = Driver()
    p1, o1 = d.turn([S(), U()], "call")
    hx = [S(), U(), A("call"), T("x")]
    d.turn(hx, "ax2")
    hx3 = [*hx, A("ax2"), T("xx")]
    p3, o3 = d.turn(hx3, "ax3", prompt=inserted(render(hx3), len(p1) - 1))
    d.turn([S(), U(), A("call"), T("y")], "ay2")
    samples = d.samples()
    assert [s.metadata["trained_turns"] for s in samples] == [(1, 2), (3,), (4,)]
    assert samples[1].tokens == tuple(p3 + o3)
    assert samples[2].loss_mask[: len(o1)] == (0,) * len(o1)


def test_deep_multi_leaf_dedup():
    """3.7: three leaves share two responses; those train once, each leaf trains its own."""
    d = Driver()
    d.turn([S(), U()], "a1")
    h = [S(), U(), A("a1"), T("t1")]
    d.turn(h, "a2")
    for label in ("p", "q", "r"):
        d.turn([*h, A("a2"), T(label)], f"end {label}")
    samples = d.samples()
    assert [s.metadata["trained_turns"] for s in samples] == [(1, 2, 3), (4,), (5,)]
    assert [s.metadata["turns"] for s in samples] == [(1, 2, 3), (1, 2, 4), (1, 2, 5)]


def test_long_mixed_session():
    """3.8: clean turns, drift absorbed into a prompt tail, then two forks: 3 samples."""
    d = Driver()
    h = [S(), U()]
    p1, _ = d.turn(h, "a0")
    for i in range(1, 3):
        h = [*h, A(f"a{i - 1}"), T(f"t{i - 1}")]
        d.turn(h, f"a{i}")
    h = [*h, A("a2"), T("t2")]
    honest = render(h)
    p4, o4 = d.turn(h, "a3", prompt=replaced(honest, len(honest) - 2))  # tool END drifts
    h = [*h, A("a3"), T("t3")]
    p5, o5 = d.turn(h, "a4")  # honest prompt now disagrees with the drifted tail: fork
    h = [*h, A("a4"), T("t4")]
    p6, o6 = d.turn(h, "a5", prompt=inserted(render(h), len(p1) - 1))  # early drift: fork
    s1, s2, s3 = d.samples()
    assert s1.metadata["trained_turns"] == (1, 2, 3, 4) and s1.tokens == tuple(p4 + o4)
    assert DRIFT in s1.tokens
    assert s2.metadata["trained_turns"] == (5,) and s2.tokens == tuple(p5 + o5)
    assert s3.metadata["trained_turns"] == (6,) and s3.tokens == tuple(p6 + o6)
    assert [s.metadata["segment"] for s in (s1, s2, s3)] == [0, 1, 2]


# ---------------------------------------------------------------- 4: boundaries


def test_logprob_count_mismatch_raises():
    """4.2: a log-prob count that differs from the output count is a ValueError."""
    tm = TrajectoryManager()
    tm.record_turn("s", TurnRecord([1, 2], [3], [-0.1]), prompt_messages=[U()])
    with pytest.raises(ValueError, match=r"session 's', turn 2\).*2 entries.*has 1"):
        tm.record_turn("s", TurnRecord([1, 2], [3], [-0.1, -0.2]), prompt_messages=[U()])
    assert tm.turn_count("s") == 1


def test_empty_prompt_messages_are_ignored(caplog):
    """4.3: empty prompt_messages record nothing and log a warning."""
    tm = TrajectoryManager()
    with caplog.at_level(logging.WARNING, logger="agentrl.trajectory"):
        assert tm.record_turn("s", TurnRecord([1], [2], [-0.1]), prompt_messages=[]) is None
    assert "empty prompt_messages" in caplog.text
    assert tm.turn_count("s") == 0 and not tm.has_session("s")


def test_defaults_need_no_base_sample():
    """4.4: get_trajectory needs only the session id; reward defaults to 1.0."""
    d = Driver()
    d.turn([S(), U()], "a")
    (sample,) = d.tm.get_trajectory("s", reward=1.0)
    assert sample.reward == 1.0 and sample.metadata["segment"] == 0


def test_turn_without_logprobs_trains_with_zero():
    """4.5: a turn without log-probs still trains, padded with 0.0 and flagged."""
    d = Driver()
    d.turn([S(), U()], "with lp")
    _p2, o2 = d.turn([S(), U(), A("with lp"), U("again")], "without lp", logprobs=False)
    (sample,) = d.samples()
    assert sample.loss_mask[-len(o2) :] == (1,) * len(o2)
    assert sample.rollout_logprobs[-len(o2) :] == (0.0,) * len(o2)
    assert sample.metadata["missing_logprobs"] is True


@pytest.mark.parametrize(("threshold", "forks"), [(2, True), (3, False)])
def test_realign_threshold_boundary(threshold, forks):
    """4.6: a new output as long as the threshold forks; one token shorter realigns."""
    d, p1, o1, p2, o2 = _b1_session(threshold)
    assert len(o2) == 2
    samples = d.samples()
    if forks:
        assert [s.tokens for s in samples] == [tuple(p1 + o1), tuple(p2 + o2)]
    else:
        (sample,) = samples
        assert sample.tokens == tuple(p2 + o2)
        assert sample.loss_mask == (0,) * (len(p2) - len(p1)) + (1,) * len(o2)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (TurnRecord([1, -2], [3], [-0.1]), r"prompt_ids holds a negative id -2 at position 1"),
        (TurnRecord([1, 2], [3.5], [-0.1]), r"output_ids must hold only integer"),
        (TurnRecord(["a"], [3], [-0.1]), r"prompt_ids must hold only integer"),
        (TurnRecord([1, 2**40], [3], [-0.1]), r"does not fit in 32 bits"),
        (TurnRecord([], [3], [-0.1]), r"prompt_ids is empty"),
        (TurnRecord([1], [3], ["x"]), r"output_logprobs must hold only numbers"),
    ],
)
def test_bad_ids_raise_value_error_naming_session_and_turn(record, message):
    """Negative, non-integer, oversized or missing ids raise a ValueError naming the turn."""
    tm = TrajectoryManager()
    with pytest.raises(ValueError, match=r"record_turn\(session 'sid-9', turn 1\)") as info:
        tm.record_turn("sid-9", record, prompt_messages=[U()])
    assert info.match(message)
    assert not tm.has_session("sid-9")


def test_bad_messages_and_options_raise():
    """Non-dict messages, a bad reward split or a negative limit are rejected clearly."""
    tm = TrajectoryManager()
    with pytest.raises(ValueError, match=r"prompt_messages\[1\] must be a dict"):
        tm.record_turn("s", TurnRecord([1], [2], [-0.1]), prompt_messages=[U(), "hi"])
    with pytest.raises(ValueError, match="reward_split must be one of"):
        TrajectoryManager(reward_split="mean")
    with pytest.raises(ValueError, match="fork_threshold_tokens must be an integer >= 0"):
        TrajectoryManager(fork_threshold_tokens=-1)
    with pytest.raises(ValueError, match="max_sample_tokens must be an integer >= 0"):
        tm.get_trajectory("s", reward=1.0, max_sample_tokens=-5)


def test_unknown_session():
    """An unknown session id yields [] and dropping it is a no-op."""
    tm = TrajectoryManager()
    assert tm.get_trajectory("nope", reward=1.0) == []
    tm.drop_session("nope")
    tm.drop_session("nope")
    assert not tm.has_session("nope") and tm.turn_count("nope") == 0


def test_drop_session_releases_everything():
    """drop_session forgets the session; a later get_trajectory returns []."""
    d = Driver()
    d.turn([S(), U()], "a")
    d.tm.drop_session("s")
    assert not d.tm.has_session("s") and d.tm.get_trajectory("s", reward=1.0) == []


def test_training_sample_rejects_inconsistent_sizes():
    """A TrainingSample whose sizes disagree cannot be built."""
    with pytest.raises(ValueError, match="sizes disagree"):
        TrainingSample(
            tokens=(1, 2, 3),
            prompt_length=1,
            response_length=2,
            loss_mask=(1,),
            rollout_logprobs=(0.0, 0.0),
            reward=1.0,
        )


def test_message_key_order_does_not_matter():
    """Messages match by content whatever their key order."""
    d = Driver()
    d.turn([S(), U()], "call")
    reordered = [{"content": "sys", "role": "system"}, {"content": "task", "role": "user"}]
    d.turn([*reordered, {"content": "call", "role": "assistant"}, T("x")], "done")
    assert d.tm.session_stats("s").leaves == 1
    (sample,) = d.samples()
    assert sample.metadata["trained_turns"] == (1, 2)


# ---------------------------------------------------------------- truncation, metadata


def test_truncation_keeps_head_and_drops_empty_responses():
    """max_sample_tokens keeps a sample's head; a sample left with no response is dropped."""
    d = Driver()
    p1, o1 = d.turn([S(), U("a long first question here")], "ok fine")
    d.turn([S(), U("short")], "b")
    s1, s2 = d.tm.get_trajectory("s", reward=1.0, max_sample_tokens=len(p1) + 1)
    assert s1.tokens == tuple(p1 + o1[:1]) and s1.metadata["tokens_cut"] == len(o1) - 1
    assert s1.metadata["truncated"] is True and s2.metadata["truncated"] is False
    d2 = Driver()
    p, _ = d2.turn([S(), U()], "x y")
    assert d2.tm.get_trajectory("s", reward=1.0, max_sample_tokens=len(p)) == []


def test_realigned_shared_turn_trains_in_next_leaf():
    """A shared response masked by a realign in the first leaf trains in the next leaf."""
    d = Driver()
    p1, o1 = d.turn([S(), U()], "shared call")
    hx = [S(), U(), A("shared call"), T("x")]
    d.turn(hx, "x done", prompt=replaced(render(hx), len(p1) + len(o1) - 1))
    d.turn([S(), U(), A("shared call"), T("y")], "y done")
    s1, s2 = d.samples()
    assert s1.metadata["realigned_turns"] == (1,) and s1.metadata["trained_turns"] == (2,)
    assert s2.metadata["trained_turns"] == (1, 3)
    assert s2.loss_mask[: len(o1)] == (1,) * len(o1)


def test_finish_length_marks_truncated_and_metadata_is_merged():
    """A last trained turn ending by length sets truncated; caller metadata is copied in."""
    d = Driver()
    d.turn([S(), U()], "cut off", finish="length", metadata={"tool_use_ids": ["toolu_1"]})
    (sample,) = d.tm.get_trajectory(
        "s", reward=1.0, metadata={"instance_id": "x-1", "leaf": "mine"}
    )
    assert sample.metadata["truncated"] is True
    assert sample.metadata["instance_id"] == "x-1"
    assert sample.metadata["leaf"] == 1  # the manager's provenance wins
    assert sample.metadata["turn_metadata"] == {1: {"tool_use_ids": ["toolu_1"]}}


def test_ill_formed_flag_propagates():
    """A turn marked ill_formed marks the samples holding it."""
    tm = TrajectoryManager()
    tm.record_turn("s", TurnRecord([1], [2], [-0.5], "stop", True), prompt_messages=[U()])
    (sample,) = tm.get_trajectory("s", reward=1.0)
    assert sample.metadata["ill_formed"] is True


def test_session_stats_track_turns_and_tokens():
    """session_stats reports turns, leaves, sampled tokens and a byte count."""
    d = Driver()
    _, o1 = d.turn([S(), U()], "one two three")
    p2, o2 = d.turn([S(), U(), A("one two three"), U("more")], "four")
    stats = d.tm.session_stats("s")
    assert (stats.turns, stats.leaves) == (2, 1)
    assert stats.sampled_tokens == len(o1) + len(o2)
    assert stats.last_prompt_tokens == len(p2)
    assert stats.held_bytes > 0


# ---------------------------------------------------------------- threads, imports


def test_concurrent_sessions_from_threads():
    """Sessions recorded from several threads at once stay intact."""
    tm = TrajectoryManager()
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            history = [S(), U(f"task {n}")]
            for i in range(30):
                prompt = render(history)
                out = reply(f"step {i}")
                tm.record_turn(
                    f"w{n}",
                    TurnRecord(prompt, out, [-0.5] * len(out)),
                    prompt_messages=history,
                    response_message=A(f"step {i}"),
                )
                history = [*history, A(f"step {i}"), T(f"result {i}")]
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    for n in range(6):
        (sample,) = tm.get_trajectory(f"w{n}", reward=1.0)
        assert sample.metadata["trained_turns"] == tuple(range(1, 31))


def test_import_is_light():
    """Importing agentrl.trajectory pulls in none of the heavy optional packages."""
    code = (
        "import sys, agentrl.trajectory\n"
        "heavy = {'aiohttp', 'transformers', 'torch', 'e2b', 'swebench'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_public_reexports():
    """The trajectory types are importable from the package root."""
    import agentrl

    assert agentrl.TrajectoryManager is TrajectoryManager
    assert agentrl.TurnRecord is TurnRecord and agentrl.TrainingSample is TrainingSample


# ---------------------------------------------------------------- memory


def _long_session(tm: TrajectoryManager, sid: str, turns: int, step: int) -> int:
    """Record a linear session whose prompt grows by ``step`` ids a turn; return its length."""
    held: list[int] = list(range(1000, 1000 + step))
    history = [S("long"), U("long task")]
    for i in range(turns):
        output = [200_000 + i * step + k for k in range(step // 4)]
        tm.record_turn(
            sid,
            TurnRecord([x + 0 for x in held], output, [-0.5] * len(output)),
            prompt_messages=history,
            response_message=A(f"r{i}"),
        )
        history = [*history, A(f"r{i}"), T(f"t{i}")]
        held += output + [300_000 + i * step + k for k in range(step - step // 4)]
    return len(held)


def test_long_session_is_held_compactly():
    """A 60-turn session growing to ~60k ids holds a few bytes per id, not every prompt."""
    import gc
    import tracemalloc

    tm = TrajectoryManager()
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    total = _long_session(tm, "s", turns=60, step=1000)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    stats = tm.session_stats("s")
    tm.drop_session("s")
    gc.collect()
    released = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    # Every prompt as Python ints would be ~30 * 60k ids * 36 bytes ≈ 65 MB.
    assert held < 2.5e6, f"{held} bytes held for a {total}-id session"
    assert abs(stats.held_bytes - held) < 0.5 * held
    assert released < 50_000, f"{released} bytes still held after drop_session"


def test_memory_is_released_after_get_trajectory():
    """get_trajectory hands everything to the samples and keeps nothing itself."""
    import gc
    import tracemalloc

    tm = TrajectoryManager()
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    _long_session(tm, "s", turns=20, step=500)
    samples = tm.get_trajectory("s", reward=1.0)
    assert len(samples) == 1
    del samples
    gc.collect()
    left = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert left < 50_000, f"{left} bytes still held after get_trajectory"


# ---------------------------------------------------------------- caches


def test_messages_seen_last_turn_are_not_keyed_again(monkeypatch):
    """A prompt replaying last turn's message objects keys only its new messages."""
    from agentrl.trajectory import tree

    keyed: list[dict] = []
    real = tree.message_digest
    monkeypatch.setattr(tree, "message_digest", lambda m: keyed.append(m) or real(m))
    tm = TrajectoryManager()
    history = [S(), U()]
    for i in range(5):
        response = A(f"r{i}")
        tm.record_turn(
            "s",
            TurnRecord(render(history), reply(f"r{i}")),
            prompt_messages=history,
            response_message=response,
        )
        assert len(keyed) == (3 if i == 0 else 2)  # first: S, U, A; then: T and A
        keyed.clear()
        history = [*history, response, T(f"t{i}")]
    (sample,) = tm.get_trajectory("s", reward=1.0)
    assert sample.metadata["trained_turns"] == (1, 2, 3, 4, 5)


def test_one_cached_sequence_per_chain():
    """A linear session holds one full sequence; a sub-agent's branch adds one of its own."""
    tm = TrajectoryManager()
    history = [S(), U()]
    for i in range(4):
        tm.record_turn(
            "s",
            TurnRecord(render(history), reply(f"r{i}")),
            prompt_messages=history,
            response_message=A(f"r{i}"),
        )
        history = [*history, A(f"r{i}"), T(f"t{i}")]
        assert tm._sessions["s"].store.cached_turns == [i + 1]
    sub = [S("sub agent"), U("sub task")]
    tm.record_turn("s", TurnRecord(render(sub), reply("x")), prompt_messages=sub)
    assert tm._sessions["s"].store.cached_turns == [4, 5]
    tm.record_turn("s", TurnRecord(render(history), reply("r4")), prompt_messages=history)
    assert tm._sessions["s"].store.cached_turns == [5, 6]
    samples = tm.get_trajectory("s", reward=1.0)
    assert sorted(s.metadata["trained_turns"] for s in samples) == [(1, 2, 3, 4, 6), (5,)]


def test_turn_record_keeps_array_ids_as_an_array_copy():
    """An array('I') prompt stays a compact array in TurnRecord (copied, not aliased)."""
    from array import array

    ids = array("I", [1, 2, 3])
    record = TurnRecord(ids, [4], [-0.1])
    ids.append(9)
    assert isinstance(record.prompt_ids, array) and list(record.prompt_ids) == [1, 2, 3]
    assert record.output_ids == (4,) and TurnRecord([1], [2]).prompt_ids == (1,)
