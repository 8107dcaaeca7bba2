"""The stack's side of tracking: trackers registered while it is up, closed (their table
written) when it closes, an interrupt included; a missing tracker package stops it early."""

from __future__ import annotations

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

from agentrl import plugins
from agentrl.observers import TrackOptions
from agentrl.rollout.stack import Stack, StackError, StackOptions


def _options(tokenizer, tmp_path, **track):
    return StackOptions(
        engine_url="http://127.0.0.1:9",
        tokenizer=str(tokenizer),
        cli_dir=None,
        track=TrackOptions(directory=tmp_path, run_name="run", **track),
    )


async def test_an_interrupted_stack_still_writes_the_table(
    agentrl_registry, qwen_tokenizer_dir, tmp_path, events
):
    """KeyboardInterrupt inside ``async with Stack``: the stack's close writes the trajectory
    table of the rollouts that finished and unregisters the tracker; the run's config is
    the stack's options."""
    before = set(agentrl_registry.pm.get_plugins())
    with pytest.raises(KeyboardInterrupt):
        async with Stack(_options(qwen_tokenizer_dir, tmp_path, trackers=("tensorboard",))) as st:
            assert st.tracking is not None
            assert set(agentrl_registry.pm.get_plugins()) - before == set(st.tracking.trackers)
            for event in events[:2]:
                plugins.notify("on_rollout_finished", event)
            raise KeyboardInterrupt
    assert set(agentrl_registry.pm.get_plugins()) == before and st.tracking is None
    accumulator = EventAccumulator(str(tmp_path / "tensorboard" / "run"))
    accumulator.Reload()
    text = tensor_util.make_ndarray(accumulator.Tensors("trajectories")[-1].tensor_proto).item()
    assert text.decode().count("\n") == 1 + 2 and b"textstats-2" in text
    config = tensor_util.make_ndarray(accumulator.Tensors("config")[-1].tensor_proto).item()
    assert b'"harness": "claude_code"' in config and b'"engine_url": "http://127.0.0.1:9"' in config


async def test_a_missing_tracker_package_fails_the_stack_before_it_starts(
    agentrl_registry, qwen_tokenizer_dir, tmp_path, monkeypatch
):
    """``wandb`` not installed: ``StackError`` naming the extra, nothing left registered."""
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    before = set(agentrl_registry.pm.get_plugins())
    with pytest.raises(StackError, match=r"--track wandb needs the wandb package.*\[wandb\]"):
        async with Stack(_options(qwen_tokenizer_dir, tmp_path, trackers=("wandb",))):
            pass
    assert set(agentrl_registry.pm.get_plugins()) == before
