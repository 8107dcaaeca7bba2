"""agentrl's fan-out-aware dynamic sampling filter, against slime's group shapes (slime_stub)."""

from __future__ import annotations

import importlib
import inspect
import sys
import types

import pytest
from slime_stub.sample import Sample

import agentrl.slime as slime_mod
from agentrl.slime.rewards import FilterOutput, rollout_rewards
from agentrl.slime.samples import abort_placeholder

ARGS = types.SimpleNamespace(reward_key=None, n_samples_per_prompt=3)


def _sample(index: int, reward: float, group_index: int = 0) -> Sample:
    return Sample(
        index=index,
        group_index=group_index,
        rollout_id=index,
        reward=reward,
        status=Sample.Status.COMPLETED,
    )


def _rollout(index: int, reward: float, chains: int = 1) -> list[Sample]:
    """What one agentrl.slime.generate call returns: a list, one sample per chain."""
    return [_sample(index, reward) for _ in range(chains)]


def _slime_builtin_filter(args, samples):
    """slime's check_reward_nonzero_std body (filter_hub/dynamic_sampling_filters.py)."""
    return [sample.get_reward_value(args) for sample in samples]


def test_slime_s_own_filter_breaks_on_list_entries():
    """The pitfall: slime's filter reads .reward on each group entry, a list with agentrl."""
    group = [_rollout(0, 1.0), _rollout(1, 0.0), _rollout(2, 0.0)]
    with pytest.raises(AttributeError):
        _slime_builtin_filter(ARGS, group)


def test_filter_keeps_groups_whose_rollouts_differ_and_drops_uniform_ones():
    """A group with a solved and an unsolved rollout is kept; all-solved and all-failed
    groups are dropped with slime's reason text; fan-out chains count once per rollout."""
    mixed = [_rollout(0, 1.0, chains=4), _rollout(1, 0.0), _rollout(2, 0.0)]
    assert rollout_rewards(ARGS, mixed) == [1.0, 0.0, 0.0]
    kept = slime_mod.check_reward_nonzero_std(ARGS, mixed)
    assert kept.keep is True and kept.reason is None
    solved = [_rollout(0, 1.0, chains=3), _rollout(1, 1.0), _rollout(2, 1.0, chains=2)]
    dropped = slime_mod.check_reward_nonzero_std(ARGS, solved)
    assert dropped.keep is False and dropped.reason == "zero_std_1.0"
    failed = [_rollout(i, 0.0) for i in range(3)]
    assert slime_mod.check_reward_nonzero_std(ARGS, failed).reason == "zero_std_0.0"


def test_filter_leaves_aborted_placeholders_out():
    """An infra placeholder (reward 0.0) does not make an all-solved group look mixed; a
    group with fewer than two graded rollouts is dropped (its advantages are all zero)."""
    base = Sample(index=2, group_index=0, prompt="p", metadata={})
    placeholder = abort_placeholder(base, "infra_error")
    group = [_rollout(0, 1.0), _rollout(1, 1.0), placeholder]
    assert rollout_rewards(ARGS, group) == [1.0, 1.0]
    assert slime_mod.check_reward_nonzero_std(ARGS, group).keep is False
    lonely = [_rollout(0, 1.0), placeholder, abort_placeholder(base, "aborted")]
    assert slime_mod.check_reward_nonzero_std(ARGS, lonely).keep is False
    only_placeholders = [placeholder] * 3
    output = slime_mod.check_reward_nonzero_std(ARGS, only_placeholders)
    assert output.keep is False and output.reason == "zero_std_no_graded_rollout"


def test_filter_agrees_with_slime_on_flat_groups():
    """On plain Sample entries (no fan-out) it keeps exactly what slime's torch std > 1e-6 keeps."""
    torch = pytest.importorskip("torch")
    for rewards in ([1.0, 0.0, 1.0], [0.5, 0.5, 0.5], [0.0, 0.0, 1e-3], [1.0, 1.0, 1.0]):
        group = [_sample(i, r) for i, r in enumerate(rewards)]
        expected = bool(torch.tensor(rewards, dtype=torch.float64).std() > 1e-6)
        assert slime_mod.check_reward_nonzero_std(ARGS, group).keep is expected, rewards


def test_filter_honours_reward_key():
    """--reward-key picks the field of a dict reward, as slime's get_reward_value does."""
    args = types.SimpleNamespace(reward_key="acc")
    group = [
        [Sample(index=i, group_index=0, reward={"acc": r}) for _ in range(2)]
        for i, r in enumerate((1.0, 0.0))
    ]
    assert slime_mod.check_reward_nonzero_std(args, group).keep is True


def test_fallback_variant_keeps_when_insufficient():
    """The _with_fallback variant sets keep_when_insufficient, as slime's does."""
    group = [_rollout(i, 1.0) for i in range(3)]
    output = slime_mod.check_reward_nonzero_std_with_fallback(ARGS, group)
    assert output.keep is False and output.keep_when_insufficient is True


def test_returns_slime_s_filter_output_class_when_slime_is_there(monkeypatch):
    """Inside a slime job the result is slime's own DynamicFilterOutput; outside, FilterOutput."""
    assert isinstance(slime_mod.check_reward_nonzero_std(ARGS, [_rollout(0, 1.0)]), FilterOutput)

    class DynamicFilterOutput:
        def __init__(self, keep, reason=None, keep_when_insufficient=False):
            self.keep, self.reason = keep, reason
            self.keep_when_insufficient = keep_when_insufficient

    names = ("slime", "slime.rollout", "slime.rollout.filter_hub")
    for name in names:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    base_types = types.ModuleType("slime.rollout.filter_hub.base_types")
    base_types.DynamicFilterOutput = DynamicFilterOutput
    monkeypatch.setitem(sys.modules, base_types.__name__, base_types)
    output = slime_mod.check_reward_nonzero_std(ARGS, [_rollout(0, 1.0), _rollout(1, 0.0)])
    assert isinstance(output, DynamicFilterOutput) and output.keep is True


def test_filter_paths_resolve_as_slime_loads_them():
    """--dynamic-sampling-filter-path agentrl.slime.check_reward_nonzero_std[_with_fallback]
    resolves through slime's load_function (import up to the last dot, then getattr)."""
    for name in ("check_reward_nonzero_std", "check_reward_nonzero_std_with_fallback"):
        module_path, _, attr = f"agentrl.slime.{name}".rpartition(".")
        fn = getattr(importlib.import_module(module_path), attr)
        assert inspect.isfunction(fn) and not inspect.iscoroutinefunction(fn)
        assert list(inspect.signature(fn).parameters)[:2] == ["args", "samples"]
