"""A rollout's session tree and token provenance (agentrl.view.session), from real
linearised samples (tests/support/view_support.py) and from rows older writers left."""

from __future__ import annotations

import json

import pytest
from view_support import FAILING_TASK, SESSION_TASK

from agentrl.view import RunSource, ViewError
from agentrl.view.session import build_session, common_prefix, sample_view


def _session(source):
    return source.rollout_data(f"{SESSION_TASK}#0")["session"]


def test_chain_tree_has_main_sub_agent_and_side_request(crafted_source):
    """The longest chain is main; the chain started after its Task call is a sub-agent
    spawned by Task; the one-turn tool-less chain is a side request."""
    chains = {c["kind"]: c for c in _session(crafted_source)["chains"]}
    assert set(chains) == {"main", "sub-agent", "side request"}
    sub = chains["sub-agent"]
    assert sub["parent"] == chains["main"]["leaf"] and sub["spawned_by"] == "Task"
    assert sub["after"] == chains["main"]["turns"][0]
    assert len(chains["side request"]["turns"]) == 1


def test_turns_carry_the_middleware_facts(crafted_source):
    """Each turn has its finish reason, tool calls, parse status, timing and prompt mode."""
    turns = _session(crafted_source)["turns"]
    first_main = turns["1"]
    assert first_main["tool_calls"] == ["Task"] and first_main["finish_reason"] == "stop"
    assert first_main["ill_formed"] is False and first_main["engine_seconds"] == 0.25
    assert first_main["offset_seconds"] == 1.0 and first_main["prompt_mode"] == "splice"
    assert turns["5"]["splice_fallback"] == "new_chain"
    assert turns["4"]["realigned"] is True and turns["4"]["trained_in_sample"] is None


def test_token_classes_and_markers_of_realign_and_fork(crafted_source):
    """The realigned response is 'd' (masked after drift) with a REALIGN marker at its start;
    the forked sample's FORK sits where its tokens leave the previous segment's."""
    samples = _session(crafted_source)["samples"]
    main = [s for s in samples if s["segment"] == 0 and "d" in s["classes"]]
    assert len(main) == 1
    view = main[0]
    realign = next(m for m in view["markers"] if m["kind"] == "realign")
    assert view["classes"][realign["at"]] == "d"
    assert view["classes"][: view["prompt_length"]] == "p" * view["prompt_length"]
    assert view["trained_tokens"] == view["classes"].count("t") > 0
    fork_sample = next(s for s in samples if s["segment"] == 1)
    fork = next(m for m in fork_sample["markers"] if m["kind"] == "fork")
    assert fork["at"] == 3 and "token 3" in fork["reason"]
    fallback = next(m for m in view["markers"] if m["kind"] == "fallback")
    assert fallback["label"] == "fallback to render: new_chain"
    assert "no earlier assistant message" in fallback["reason"]


def test_a_turn_trained_in_another_sample_is_marked_other():
    """A sampled turn this sample carries untrained (claimed elsewhere) is 'o', not context."""
    row = {
        "tokens": list(range(10)),
        "prompt_length": 2,
        "loss_mask": [0, 0, 0, 0, 1, 1, 1, 1],
        "rollout_logprobs": [0.0] * 8,
        "metadata": {"turns": [1, 2], "trained_turns": [2], "realigned_turns": []},
    }
    turns = {
        1: {
            "id": 0,
            "prompt_tokens": 2,
            "output_tokens": 2,
            "splice_fallback": None,
            "prompt_mode": None,
            "finish_reason": None,
            "tool_calls": None,
            "ill_formed": None,
        },
        2: {
            "id": 1,
            "prompt_tokens": 6,
            "output_tokens": 4,
            "splice_fallback": None,
            "prompt_mode": None,
            "finish_reason": None,
            "tool_calls": None,
            "ill_formed": None,
        },
    }
    assert sample_view(row, turns)["classes"] == "ppoocctttt"


def test_old_directories_without_session_files_still_build():
    """Samples alone (no session file, no turn metadata): classes from the mask, facts None."""
    row = {
        "tokens": [1, 2, 3, 4],
        "prompt_length": 2,
        "loss_mask": [1, 0],
        "rollout_logprobs": [-0.5, 0.0],
        "metadata": {"turns": [1], "trained_turns": [1], "leaf": 1},
    }
    session = build_session([row], None)
    assert session["facts_known"] is False
    assert session["samples"][0]["classes"] == "pptc"
    assert session["turns"]["t1"]["finish_reason"] is None
    assert session["chains"][0]["kind"] == "main"


def test_malformed_sample_rows_are_skipped():
    """A row without tokens, or with junk ids, does not break the page."""
    session = build_session(
        [{"tokens": "x"}, {"tokens": [1, "a"], "prompt_length": 1, "loss_mask": [1]}]
    )
    (view,) = session["samples"]
    assert view["tokens"] == [1, -1] and view["classes"] == "pt"


def test_common_prefix_over_long_sequences():
    """The shared prefix is found exactly across slice boundaries."""
    a = list(range(20000))
    b = [*a[:12345], -1, *a[12346:]]
    assert (
        common_prefix(a, b) == 12345 and common_prefix(a, a) == 20000 and common_prefix([], a) == 0
    )


def test_run_page_of_the_crafted_run(crafted_source):
    """The run data counts both outcomes and records the tokenizer the runner wrote."""
    source = crafted_source
    data = source.run_data()
    assert data["overview"]["outcomes"] == {"solved": 1, "infra_error": 1}
    assert data["tokenizer"] and source.token_text.decodes
    assert source.rollout_data(f"{FAILING_TASK}#0")["session"]["samples"] == []


def test_a_slime_dump_reads_as_rollouts_of_its_sessions(tmp_path, crafted_source):
    """slime's --save-debug-rollout-data file (torch.save of Sample.to_dict rows): each
    session is a rollout; tokens, mask and the trajectory's markers survive."""
    torch = pytest.importorskip("torch")
    rows = crafted_source.samples(f"{SESSION_TASK}#0")
    dump = []
    for k, row in enumerate(rows):
        meta = {**row["metadata"], "session_id": "s-1", "instance_id": SESSION_TASK,
                "outcome": "solved", "reward": 1.0, "timings": {"agent": 2.0}}  # fmt: skip
        dump.append({"group_index": 0, "index": k, "tokens": row["tokens"],
                     "response_length": row["response_length"], "loss_mask": row["loss_mask"],
                     "rollout_log_probs": torch.tensor(row["rollout_logprobs"]),
                     "reward": 1.0, "metadata": meta, "status": "completed"})  # fmt: skip
    path = tmp_path / "rollout_3.pt"
    torch.save({"rollout_id": 3, "samples": dump}, path)
    source = RunSource.open(path)
    assert source.kind == "slime" and [r["key"] for r in source.rows] == ["rollout 3 · s-1"]
    assert source.rows[0]["outcome"] == "solved" and source.rows[0]["num_samples"] == len(rows)
    session = source.rollout_data("rollout 3 · s-1")["session"]
    kinds = {m["kind"] for s in session["samples"] for m in s["markers"]}
    assert {"fork", "realign"} <= kinds
    assert {c["kind"] for c in session["chains"]} == {"main", "sub-agent", "side request"}


def test_a_dump_with_a_pickled_object_is_refused(tmp_path):
    """A .pt file holding an arbitrary object is not unpickled (weights_only): a ViewError."""
    torch = pytest.importorskip("torch")
    path = tmp_path / "evil.pt"
    torch.save({"samples": [CraftedObject()]}, path)
    with pytest.raises(ViewError, match="not a slime rollout dump"):
        RunSource.open(path)


class CraftedObject:
    """An object torch.load(weights_only=True) refuses to rebuild."""


def test_token_text_decodes_each_distinct_id_once(crafted_source):
    """Per-id text from the run's tokenizer; ids outside the vocabulary show as ⟨id⟩."""
    text = crafted_source.token_text
    ids = text.tokenizer.encode("hello world", add_special_tokens=False)
    vocab = text.vocab([*ids, *ids, -1, 10**9])
    assert "".join(vocab[str(i)] for i in ids) == "hello world"
    assert vocab["-1"] == "⟨-1⟩" and vocab[str(10**9)] == f"⟨{10**9}⟩"


def _facts(*counts):
    return {"turns": [{"index": i, "tool_calls": ["Bash"]} for i in range(sum(counts))]}


def _chain_rows(chains):
    """Sample rows for chains given as lists of middleware turn indices (leaf = last)."""
    rows = []
    for chain in chains:
        trajectory = [m + 1 for m in chain]
        rows.append({
            "tokens": [1, 2], "prompt_length": 1, "loss_mask": [1], "rollout_logprobs": [0.0],
            "metadata": {"leaf": trajectory[-1], "turns": trajectory, "trained_turns": trajectory,
                         "turn_metadata": {str(t): {"middleware_turn": t - 1} for t in trajectory}},
        })  # fmt: skip
    return rows


def test_chains_before_and_after_the_main_agent_are_restarts():
    """A compaction: the chain after the main agent's last turn is a restart, the one before
    its first turn the earlier context; both hang under the main chain."""
    rows = _chain_rows([[0, 1], [2, 3, 4, 5], [6, 7]])
    chains = build_session(rows, _facts(8))["chains"]
    assert [c["kind"] for c in chains] == ["earlier context", "main", "restart"]
    assert chains[2]["after"] == 5 and chains[0]["parent"] == chains[1]["leaf"]


def test_a_chain_sharing_its_first_turns_is_a_branch():
    """A rewind: the second chain starts with the first chain's turns, then leaves them."""
    rows = _chain_rows([[0, 1, 2], [0, 1, 3]])
    chains = build_session(rows, _facts(4))["chains"]
    assert [c["kind"] for c in chains] == ["main", "branch"]
    assert chains[1]["after"] == 1 and chains[1]["parent"] == chains[0]["leaf"]


def test_the_runner_writes_what_the_view_reads(crafted_dir, qwen_tokenizer_dir):
    """The runner records the tokenizer in summary.json and, per rollout, sessions/KEY.json
    with the task text and every turn's facts (a failed rollout: no turns)."""
    summary = json.loads((crafted_dir / "summary.json").read_text())
    assert summary["tokenizer"] == str(qwen_tokenizer_dir)
    session = json.loads((crafted_dir / "sessions" / f"{SESSION_TASK}__0.json").read_text())
    assert session["task"]["problem_statement"] == f"Problem of {SESSION_TASK}"
    assert [t["index"] for t in session["turns"]] == list(range(7))
    assert session["turns"][1]["tool_calls"] == ["Task"]
    failed = json.loads((crafted_dir / "sessions" / f"{FAILING_TASK}__0.json").read_text())
    assert failed["turns"] == []
