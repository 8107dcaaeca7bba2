"""Unit tests of the slime integration's pieces: config, sample conversion, rewards, import."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import importlib
import inspect
import subprocess
import sys
import types

import pytest
from slime_stub import checks
from slime_stub.rollout_state import install_generate_state
from slime_stub.sample import Sample

import agentrl.slime as slime_mod
from agentrl.slime.config import SlimeConfig, SlimeConfigError
from agentrl.slime.samples import (
    abort_placeholder,
    eval_placeholder,
    result_metadata,
    rollout_id_of,
    session_id_of,
    task_row,
    to_slime_samples,
)
from agentrl.slime.service import ServiceSettings
from agentrl.trajectory import TrainingSample
from agentrl.types import Grade, Outcome

# -- signature and import ------------------------------------------------------------------


def test_generate_signature_matches_slime_contract():
    """slime's contract test: a coroutine whose first three parameters are args, sample, sampling_params."""
    fn = slime_mod.generate
    assert inspect.iscoroutinefunction(fn)
    params = list(inspect.signature(fn).parameters.values())
    assert [p.name for p in params] == ["args", "sample", "sampling_params", "evaluation"]
    assert params[3].default is False
    # slime passes the first three positionally and evaluation by keyword.
    assert all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params)


def test_dotted_paths_resolve_as_slime_loads_them():
    """slime's load_function imports the path up to the last dot and getattr()s the rest."""
    for path in ("agentrl.slime.generate", "agentrl.slime.reward_post_process"):
        module_path, _, name = path.rpartition(".")
        fn = getattr(importlib.import_module(module_path), name)
        assert fn is getattr(slime_mod, name) and inspect.isfunction(fn), path
    assert inspect.iscoroutinefunction(slime_mod.generate)


def test_reward_post_process_signature():
    """--custom-reward-post-process-path is called as fn(args, samples)."""
    params = list(inspect.signature(slime_mod.reward_post_process).parameters)
    assert params == ["args", "samples"]
    assert not inspect.iscoroutinefunction(slime_mod.reward_post_process)


def test_import_loads_neither_slime_nor_torch():
    """A fresh interpreter importing agentrl.slime has no slime, torch or transformers module."""
    code = (
        "import sys, agentrl.slime\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('slime', 'torch', 'transformers', 'e2b', 'swebench'))\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "", f"importing agentrl.slime loaded: {out.stdout.strip()}"


# -- configuration -----------------------------------------------------------------------


def test_config_defaults_match_slime_example():
    """With nothing set, the knobs default to the slime coding-agent example's values."""
    config = SlimeConfig.from_env({})
    assert (config.harness, config.sandbox, config.grader) == ("claude_code", "e2b", "scaleswe")
    assert config.port == 18001 and config.bind_host == "0.0.0.0"
    assert config.agent_time_budget == 1800 and config.eval_timeout == 600
    assert config.rollout_guard == 1800 + 2 * 600 + 180
    assert config.boot_concurrency == 16 and config.boot_retries == 2
    assert config.fork_threshold_tokens == 1024
    assert config.prompt_mode == "splice"
    assert SlimeConfig.from_env({"AGENTRL_PROMPT_MODE": "render"}).prompt_mode == "render"
    assert config.public_host is None
    assert config.grader_name(True) == "scaleswe"


def test_config_reads_how_many_engine_aborts_a_turn_survives():
    """AGENTRL_MAX_ENGINE_ABORTS: 8 by default, 0 turns continuation off, negatives refused."""
    assert SlimeConfig.from_env({}).max_engine_aborts == 8
    assert SlimeConfig.from_env({"AGENTRL_MAX_ENGINE_ABORTS": "0"}).max_engine_aborts == 0
    with pytest.raises(SlimeConfigError, match="AGENTRL_MAX_ENGINE_ABORTS"):
        SlimeConfig.from_env({"AGENTRL_MAX_ENGINE_ABORTS": "-1"})


def test_config_reads_slime_example_aliases():
    """slime's SWE_*/ADAPTER_* names configure agentrl when no AGENTRL_* name is set."""
    env = {
        "SWE_AGENT": "codex",
        "SWE_TRAIN_PROTOCOL": "swebench",
        "SWE_EVAL_PROTOCOL": "scaleswe",
        "ADAPTER_PUBLIC_HOST": "10.0.0.7",
        "ADAPTER_BIND_HOST": "10.0.0.7",
        "ADAPTER_PORT": "19000",
        "SWE_AGENT_TIME_BUDGET_SEC": "900",
        "SWE_EVAL_TIMEOUT_SEC": "300",
        "SWE_ROLLOUT_GUARD_SEC": "0",
        "SWE_BOOT_CONCURRENCY": "4",
        "SWE_BOOT_RETRIES": "5",
        "SLIME_FORK_MERGE_MAX_RESPONSE_TOKENS": "64",
        "SWE_CC_PROMPT": "fix it",
        "SLIME_AGENT_CC_TARBALL": "/t/cc.tgz",
        "SLIME_AGENT_CODEX_TARBALL": "/t/codex.tgz",
        "SLIME_AGENT_NODE_TARBALL": "/t/node.tar.xz",
    }
    config = SlimeConfig.from_env(env)
    assert config.harness == "codex"
    assert config.grader_name(False) == "swebench" and config.grader_name(True) == "scaleswe"
    assert config.public_host == "10.0.0.7" and config.port == 19000
    assert config.agent_time_budget == 900 and config.eval_timeout == 300
    assert config.rollout_guard == 900 + 2 * 300 + 180  # 0 means "derive", as in slime
    assert config.boot_concurrency == 4 and config.boot_retries == 4  # 5 attempts in slime
    assert config.fork_threshold_tokens == 64
    assert config.prompt == "fix it"
    assert config.harness_kwargs() == {
        "tarballs": ("/t/codex.tgz",),
        "node_tarball": "/t/node.tar.xz",
    }


@pytest.mark.parametrize(
    ("env", "tarballs"),
    [
        # slime's launcher exports the Claude Code tarball whatever SWE_AGENT says.
        ({"SWE_AGENT": "codex", "SLIME_AGENT_CC_TARBALL": "/t/cc.tgz"}, ()),
        ({"SWE_AGENT": "claude_code", "SLIME_AGENT_CODEX_TARBALL": "/t/codex.tgz"}, ()),
        (
            {"SLIME_AGENT_CC_TARBALL": "/t/cc.tgz", "SLIME_AGENT_CODEX_TARBALL": "/t/x"},
            ("/t/cc.tgz",),
        ),
        (
            {"SWE_AGENT": "codex", "AGENTRL_CODEX_TARBALLS": "/t/a.tgz,/t/b.tgz"},
            ("/t/a.tgz", "/t/b.tgz"),
        ),
        ({"AGENTRL_CLAUDE_CODE_TARBALLS": "/t/c.tgz"}, ("/t/c.tgz",)),
        # The generic name is for whichever harness runs, and beats the harness's own.
        (
            {
                "SWE_AGENT": "codex",
                "AGENTRL_CLI_TARBALLS": "/t/g.tgz",
                "SLIME_AGENT_CODEX_TARBALL": "/t/x",
            },
            ("/t/g.tgz",),
        ),
        ({"AGENTRL_HARNESS": "my_plugin", "SLIME_AGENT_CC_TARBALL": "/t/cc.tgz"}, ()),
    ],
)
def test_each_harness_takes_only_its_own_tarball(env, tarballs):
    """SLIME_AGENT_CC_TARBALL reaches only claude_code, SLIME_AGENT_CODEX_TARBALL only codex;
    AGENTRL_CLI_TARBALLS reaches any harness (a plugin's included)."""
    assert SlimeConfig.from_env(env).cli_tarballs == tarballs


def test_config_agentrl_names_win_over_aliases(caplog):
    """AGENTRL_HARNESS beats SWE_AGENT, and the disagreement is logged."""
    config = SlimeConfig.from_env({"AGENTRL_HARNESS": "claude_code", "SWE_AGENT": "codex"})
    assert config.harness == "claude_code"
    assert "disagree" in caplog.text


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"AGENTRL_PORT": "eighteen"}, "AGENTRL_PORT='eighteen' is not an integer"),
        ({"SWE_BOOT_CONCURRENCY": "0"}, "AGENTRL_BOOT_CONCURRENCY must be positive"),
        ({"AGENTRL_SANDBOX_OPTIONS": "[1]"}, "AGENTRL_SANDBOX_OPTIONS must be a JSON object"),
        ({"AGENTRL_SANDBOX_OPTIONS": "{"}, "AGENTRL_SANDBOX_OPTIONS is not valid JSON"),
        ({"AGENTRL_PROMPT_MODE": "spliced"}, "AGENTRL_PROMPT_MODE must be one of splice, render"),
    ],
)
def test_config_errors_name_the_variable(env, needle):
    """A bad value fails with a message naming the variable and what it expects."""
    with pytest.raises(SlimeConfigError, match=needle.replace("(", r"\(").replace("[", r"\[")):
        SlimeConfig.from_env(env)


def test_missing_public_host_says_what_to_set():
    """A network sandbox without a public host asks for AGENTRL_PUBLIC_HOST / ADAPTER_PUBLIC_HOST."""
    with pytest.raises(SlimeConfigError, match=r"AGENTRL_PUBLIC_HOST.*ADAPTER_PUBLIC_HOST"):
        SlimeConfig.from_env({}).require_public_host()


def test_local_sandbox_needs_a_unix_socket():
    """The local sandbox without AGENTRL_UNIX_SOCKET fails naming the variable."""
    with pytest.raises(SlimeConfigError, match="AGENTRL_UNIX_SOCKET"):
        SlimeConfig.from_env({"AGENTRL_SANDBOX": "local"}).validate()
    SlimeConfig.from_env({"AGENTRL_SANDBOX": "local", "AGENTRL_UNIX_SOCKET": "/tmp/s"}).validate()
    SlimeConfig.from_env({"ADAPTER_PUBLIC_HOST": "10.0.0.1"}).validate()
    with pytest.raises(SlimeConfigError, match="AGENTRL_PUBLIC_HOST"):
        SlimeConfig.from_env({}).validate()


def test_a_plugin_sandbox_without_network_needs_a_unix_socket_too(agentrl_registry):
    """Whether a unix socket is needed is the sandbox class's own say, not its name."""
    from agentrl import hookimpl
    from agentrl.sandboxes.local import LocalSandbox

    class Isolated(LocalSandbox):
        name = "isolated"

    class Networked(LocalSandbox):
        name = "networked"
        reaches_middleware_over_unix_socket = False

    class Plugin:
        @hookimpl
        def register_sandboxes(self, register):
            register(Isolated)
            register(Networked)

    agentrl_registry.pm.register(Plugin())
    with pytest.raises(SlimeConfigError, match=r"'isolated' sandbox has no network.*UNIX_SOCKET"):
        SlimeConfig.from_env({"AGENTRL_SANDBOX": "isolated"}).validate()
    with pytest.raises(SlimeConfigError, match="AGENTRL_PUBLIC_HOST"):
        SlimeConfig.from_env({"AGENTRL_SANDBOX": "networked"}).validate()


def test_service_settings_from_args():
    """The service reads exactly slime's tokenizer, router, context and parser arguments."""
    args = types.SimpleNamespace(
        hf_checkpoint="/models/q",
        sglang_router_ip="10.1.2.3",
        sglang_router_port=30000,
        rollout_max_context_len=96000,
        sglang_tool_call_parser="qwen3_coder",
        sglang_reasoning_parser="",
    )
    settings = ServiceSettings.from_args(args, SlimeConfig())
    assert settings.sglang_url == "http://10.1.2.3:30000"
    assert settings.max_context_tokens == 96000
    assert settings.tool_parser == "qwen3_coder" and settings.reasoning_parser is None
    ipv6 = ServiceSettings.from_args(
        types.SimpleNamespace(hf_checkpoint="/m", sglang_router_ip="fd00::1", sglang_router_port=1),
        SlimeConfig(),
    )
    assert ipv6.sglang_url == "http://[fd00::1]:1" and ipv6.max_context_tokens == 0
    assert settings.tasks_dir is None


def test_task_paths_resolve_against_agentrl_tasks_dir(tmp_path):
    """AGENTRL_TASKS_DIR resolves a row's relative repo path; without it the path is kept."""
    config = SlimeConfig.from_env({"AGENTRL_TASKS_DIR": str(tmp_path)})
    args = types.SimpleNamespace(hf_checkpoint="/m", sglang_router_ip="h", sglang_router_port=1)
    settings = ServiceSettings.from_args(args, config)
    assert settings.tasks_dir == tmp_path
    from agentrl.graders.scaleswe import ScaleSWEGrader

    grader = ScaleSWEGrader()
    row = {
        "prompt": "fix it",
        "metadata": {"instance_id": "t", "repo": "repos/t", "eval_cmd": "true"},
    }
    task = grader.resolve_paths(grader.parse_task(row), settings.tasks_dir)
    assert task.repo == str(tmp_path / "repos" / "t")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (types.SimpleNamespace(sglang_router_ip="a", sglang_router_port=1), "--hf-checkpoint"),
        (types.SimpleNamespace(hf_checkpoint="/m"), "SGLang router address is unknown"),
    ],
)
def test_service_settings_missing_args(args, needle):
    """Missing slime arguments fail with a message naming the flag."""
    with pytest.raises(SlimeConfigError, match=needle):
        ServiceSettings.from_args(args, SlimeConfig())


async def test_generate_fails_first_call_on_missing_config():
    """generate raises the configuration error itself rather than returning a placeholder."""
    with pytest.raises(SlimeConfigError, match="--hf-checkpoint"):
        await slime_mod.generate(types.SimpleNamespace(), Sample(index=0), {})


# -- conversion ----------------------------------------------------------------------------


def _ts(prompt: list[int], response: list[int], mask: list[int], reward: float = 1.0, **md):
    return TrainingSample(
        tokens=prompt + response,
        prompt_length=len(prompt),
        response_length=len(response),
        loss_mask=mask,
        rollout_logprobs=[-0.5 if m else 0.0 for m in mask],
        reward=reward,
        metadata=md,
    )


@dataclasses.dataclass(frozen=True)
class _Result:
    """The RolloutResult fields the conversion reads."""

    instance_id: str = "repo__issue-1"
    session_id: str = "sid"
    outcome: Outcome = Outcome.SOLVED
    reward: float = 1.0
    grade: Grade | None = dataclasses.field(default_factory=lambda: Grade(reward=1.0, solved=True))
    agent_exit_code: int | None = 0
    turns: int = 3
    sampled_tokens: int = 12
    timings: dict = dataclasses.field(default_factory=lambda: {"agent": 1.5})
    error: str | None = None


def _base(**kw) -> Sample:
    defaults = dict(
        index=7,
        group_index=2,
        prompt="fix the bug",
        label="repo__issue-1",
        tokens=[1, 2, 3],
        metadata={"instance_id": "repo__issue-1", "source_name": "swe"},
        session_id="sid",
    )
    defaults.update(kw)
    return Sample(**defaults)


def test_fan_out_samples_share_rollout_id_and_keep_indices():
    """Three chains become three samples with index, group_index and rollout_id=index."""
    base = _base()
    chains = [
        _ts([10, 11], [20, 21, 22], [1, 1, 0], truncated=False),
        _ts([10, 12], [30], [1], truncated=False, turns=1),
        _ts([10], [40, 41], [0, 1], truncated=True),
    ]
    out = to_slime_samples(
        base, chains, metadata=result_metadata(_Result()), responses=["a", "b", "c"]
    )
    assert len(out) == 3
    assert {s.rollout_id for s in out} == {7}
    assert all(type(s) is Sample and s.index == 7 and s.group_index == 2 for s in out)
    assert [s.tokens for s in out] == [[10, 11, 20, 21, 22], [10, 12, 30], [10, 40, 41]]
    assert [s.response_length for s in out] == [3, 1, 2]
    assert [s.response for s in out] == ["a", "b", "c"]
    assert [s.status for s in out] == [
        Sample.Status.COMPLETED,
        Sample.Status.COMPLETED,
        Sample.Status.TRUNCATED,
    ]
    assert out[0].rollout_log_probs == [-0.5, -0.5, 0.0]
    assert all(s.reward == 1.0 and not s.remove_sample for s in out)
    meta = out[1].metadata
    assert meta["outcome"] == "solved" and meta["instance_id"] == "repo__issue-1"
    assert meta["branch_index"] == 1 and meta["num_branches"] == 3
    assert meta["turns"] == 1 and meta["rollout_turns"] == 3  # chain's vs rollout's
    assert meta["agent_exit_code"] == 0 and meta["timings"] == {"agent": 1.5}
    assert meta["source_name"] == "swe"  # the dataset's metadata is kept
    # Nothing is shared between siblings or with the incoming sample.
    out[0].metadata["x"] = 1
    out[0].weight_versions.append("v1")
    assert "x" not in out[1].metadata and out[1].weight_versions == []
    assert base.tokens == [1, 2, 3] and "outcome" not in base.metadata
    for s in out:
        checks.check_sample_fields(s)


def test_incoming_rollout_id_wins_over_index():
    """A sample that already carries rollout_id keeps it on every sibling."""
    base = _base(rollout_id=99)
    out = to_slime_samples(
        base, [_ts([1], [2], [1]), _ts([1], [3], [1])], metadata={"instance_id": "x"}
    )
    assert [s.rollout_id for s in out] == [99, 99]
    assert rollout_id_of(_base(rollout_id=None, index=5)) == 5


def test_sample_without_prompt_is_dropped(caplog):
    """A chain with no prompt token before its response (slime needs one) is dropped, logged."""
    chains = [_ts([], [5, 6], [1, 1]), _ts([1], [7], [1])]
    out = to_slime_samples(_base(), chains, metadata={"instance_id": "x"})
    assert [s.tokens for s in out] == [[1, 7]]
    assert "len(tokens) > response_length" in caplog.text


def test_abort_placeholder_shape():
    """slime's abort placeholder: [0,0] tokens, one masked position, ABORTED, removed, reason set."""
    base = _base()
    (p,) = abort_placeholder(base, "infra_error", {"instance_id": "repo__issue-1", "error": "boom"})
    assert p.tokens == [0, 0] and p.response_length == 1 and p.response == ""
    assert p.loss_mask == [0] and p.rollout_log_probs == [0.0]
    assert p.reward == 0.0 and p.remove_sample is True
    assert p.status is Sample.Status.ABORTED
    assert p.metadata["abort_reason"] == "infra_error" and p.metadata["error"] == "boom"
    assert (p.index, p.group_index, p.rollout_id) == (7, 2, 7)
    assert base.status is Sample.Status.PENDING and base.tokens == [1, 2, 3]
    checks.check_sample_fields(p)


def test_eval_placeholder_shape():
    """Evaluation returns one COMPLETED, removed sample whose reward is the score."""
    (p,) = eval_placeholder(_base(), 1.0, result_metadata(_Result()))
    assert p.status is Sample.Status.COMPLETED and p.remove_sample is True
    assert p.reward == 1.0 and p.metadata["grading_solved"] is True
    assert p.tokens == [0, 0] and p.loss_mask == [0]
    checks.check_sample_fields(p)


def test_task_row_is_slimes_row_shape():
    """The grader sees the row as slime read it: prompt, label and metadata."""
    row = task_row(_base(metadata={"image": "img", "workdir": "/w"}))
    assert row == {
        "prompt": "fix the bug",
        "label": "repo__issue-1",
        "metadata": {"image": "img", "workdir": "/w"},
    }


def test_session_id_prefers_slime_then_mints_unique():
    """slime's session_id is used; without one, fresh ids never repeat."""
    assert session_id_of(_base(session_id="abc"), "i") == "abc"
    minted = {session_id_of(_base(session_id=None), "repo/x y") for _ in range(50)}
    assert len(minted) == 50
    assert all(m.startswith("agentrl-repo_x_y-7-") for m in minted)


# -- slime's abort flag --------------------------------------------------------------------


def test_slime_abort_flag_is_read_without_creating_state(monkeypatch):
    """The GenerateState singleton's `aborted` is read only when slime created it."""

    GenerateState = install_generate_state(monkeypatch)
    assert slime_mod._slime_aborting(None) is False
    assert GenerateState not in type(GenerateState)._instances  # not created by the probe
    state = GenerateState(None)
    assert slime_mod._slime_aborting(None) is False
    state.aborted = True
    assert slime_mod._slime_aborting(None) is True


# -- reward post-processing ----------------------------------------------------------------


def _args(**kw):
    defaults = dict(
        advantage_estimator="grpo",
        rewards_normalization=True,
        grpo_std_normalization=True,
        reward_key=None,
        n_samples_per_prompt=4,
        rollout_batch_size=2,
    )
    defaults.update(kw)
    return types.SimpleNamespace(**defaults)


def _scored(group: int, index: int, reward: float, rollout_id=None, **kw) -> Sample:
    return Sample(
        group_index=group,
        index=index,
        rollout_id=index if rollout_id is None else rollout_id,
        reward=reward,
        status=kw.pop("status", Sample.Status.COMPLETED),
        **kw,
    )


def test_reward_normalisation_matches_slime_default_without_fan_out():
    """With n samples per prompt and no fan-out, results equal slime's torch-based default."""
    torch = pytest.importorskip("torch")
    rewards = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    samples = [_scored(i // 4, i, r) for i, r in enumerate(rewards)]
    raw, out = slime_mod.reward_post_process(_args(), samples)
    t = torch.tensor(rewards).reshape(-1, 4)
    t = t - t.mean(dim=-1, keepdim=True)
    t = t / (t.std(dim=-1, keepdim=True) + 1e-6)
    assert raw == rewards
    assert out == pytest.approx(t.flatten().tolist(), abs=1e-6)


def test_reward_normalisation_groups_by_group_index_and_counts_rollouts_once():
    """A rollout fanned out into three samples counts once in its group's mean and std."""
    samples = [
        _scored(0, 0, 1.0),
        _scored(0, 0, 1.0),
        _scored(0, 0, 1.0),  # rollout 0 fanned out x3
        _scored(0, 1, 0.0),  # rollout 1
        _scored(5, 2, 1.0),
        _scored(5, 3, 1.0),  # group 5: all solved -> 0 advantage
    ]
    raw, out = slime_mod.reward_post_process(_args(), samples)
    assert raw == [1.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    # group 0 rollouts {1.0, 0.0}: mean 0.5, unbiased std 0.7071
    expected = 0.5 / (0.5**0.5 + 1e-6)
    assert out[:4] == pytest.approx([expected, expected, expected, -expected])
    assert out[4:] == [0.0, 0.0]


def test_reward_normalisation_leaves_aborted_placeholders_out():
    """An infra placeholder gets 0.0 and does not shift its siblings' advantages."""
    (placeholder,) = abort_placeholder(_base(index=3, group_index=0), "infra_error")
    samples = [_scored(0, 0, 1.0), _scored(0, 1, 0.0), placeholder]
    _, with_placeholder = slime_mod.reward_post_process(_args(), samples)
    _, without = slime_mod.reward_post_process(_args(), samples[:2])
    assert with_placeholder[:2] == pytest.approx(without)
    assert with_placeholder[2] == 0.0


def test_reward_normalisation_switches():
    """Non-GRPO estimators pass rewards through; Dr.GRPO only centres; reward_key picks a field."""
    samples = [_scored(0, 0, 1.0), _scored(0, 1, 0.0)]
    assert slime_mod.reward_post_process(_args(advantage_estimator="ppo"), samples)[1] == [1.0, 0.0]
    assert slime_mod.reward_post_process(_args(rewards_normalization=False), samples)[1] == [
        1.0,
        0.0,
    ]
    _, centred = slime_mod.reward_post_process(_args(grpo_std_normalization=False), samples)
    assert centred == [0.5, -0.5]
    _, rpp = slime_mod.reward_post_process(
        _args(advantage_estimator="reinforce_plus_plus_baseline"), samples
    )
    assert rpp == [0.5, -0.5]
    keyed = [_scored(0, 0, {"acc": 1.0}), _scored(0, 1, {"acc": 0.0})]
    raw, _ = slime_mod.reward_post_process(_args(reward_key="acc"), keyed)
    assert raw == [1.0, 0.0]


def test_single_rollout_group_is_zero_not_nan():
    """A group with one rollout normalises to 0.0 (torch.std of one value would be NaN)."""
    _, out = slime_mod.reward_post_process(_args(), [_scored(0, 0, 1.0), _scored(0, 0, 1.0)])
    assert out == [0.0, 0.0]


def test_reward_none_is_a_clear_error():
    """A sample reaching post-processing without a reward fails naming the cause."""
    with pytest.raises(ValueError, match="reward=None"):
        slime_mod.reward_post_process(_args(), [Sample(index=0, group_index=0)])


def test_placeholders_pass_slime_train_pipeline():
    """A batch mixing fan-out samples and placeholders survives slime's checks and conversion."""
    args = _args(n_samples_per_prompt=2, rollout_batch_size=1)
    fan = to_slime_samples(
        _base(index=0, group_index=0),
        [_ts([1, 2], [3, 4], [1, 1]), _ts([1, 5], [6], [1])],
        metadata=result_metadata(_Result()),
    )
    aborted = abort_placeholder(_base(index=1, group_index=0), "infra_error")
    flat, data = checks.train_pipeline(args, [[fan, aborted]], slime_mod.reward_post_process)
    assert len(flat) == 3
    assert data["rollout_ids"] == [0, 0, 1]
    assert data["rollout_mask_sums"] == [3, 3, 0]
    assert data["loss_masks"][2] == [0]
    assert data["rewards"] == [0.0, 0.0, 0.0]  # one trainable rollout in the group


def test_empty_list_would_break_slime():
    """The checks reject what slime cannot handle: an empty list return."""
    with pytest.raises(AssertionError, match="empty list"):
        checks.check_return_shape([])


def test_generate_never_mutates_sampling_params(monkeypatch):
    """generate deep-copies sampling_params before handing them to the rollout."""
    seen = {}

    class FakeService:
        config = SlimeConfig()
        ready = concurrent.futures.Future()

        def submit(self, key, coro):
            coro.close()
            fut = concurrent.futures.Future()
            fut.set_exception(RuntimeError("stop here"))
            return fut

        def rollout(self, row, **kw):
            seen.update(kw)

            async def nothing():
                return None

            return nothing()

    FakeService.ready.set_result(None)
    monkeypatch.setattr(slime_mod, "get_service", lambda args: FakeService())
    params = {"temperature": 1.0, "stop": ["</s>"], "max_new_tokens": 100}
    args = types.SimpleNamespace(hf_checkpoint="/m", sglang_router_ip="h", sglang_router_port=1)
    out = asyncio.run(slime_mod.generate(args, _base(), params))
    assert out[0].metadata["abort_reason"] == "exception:RuntimeError"
    assert seen["sampling_params"] == params and seen["sampling_params"] is not params
    assert seen["sampling_params"]["stop"] is not params["stop"]
    assert params == {"temperature": 1.0, "stop": ["</s>"], "max_new_tokens": 100}


#: Prints ``public_address("auto", …)`` for a router on loopback and one elsewhere,
#: importing Ray first when asked, with Ray's own idea of this node's address and the local
#: end of the route to the remote router.
_AUTO_ADDRESS = """
import json, socket, sys
if sys.argv[1] == "ray":
    import ray
from agentrl.slime.service import public_address
ray = sys.modules.get("ray")
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
    probe.connect(("192.0.2.1", 9))  # a TEST-NET address: nothing is sent
    towards_router = probe.getsockname()[0]
print(json.dumps({
    "auto": public_address("auto", "http://127.0.0.1:30000"),
    "ray": ray.util.get_node_ip_address() if ray else None,
    "remote": public_address("auto", "http://192.0.2.1:30000"),
    "towards_router": towards_router,
}))
"""


def _auto_address(first: str) -> dict:
    """``_AUTO_ADDRESS`` in a fresh interpreter (so nothing this process imported counts)."""
    import json
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", _AUTO_ADDRESS, first],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_public_address_auto_is_this_nodes_address_whether_or_not_ray_was_imported():
    """'auto' with a router on loopback is this node's address, the one Ray gives for it,
    the same in a process that imported Ray first and in one that never did (it used to be
    127.0.0.1 without Ray, which no sandbox can dial, and the node's address with it).
    A router elsewhere gives the local end of the route to it; anything but 'auto' is kept
    as given."""
    from agentrl.slime.service import public_address

    assert public_address("10.0.0.9", "http://127.0.0.1:1") == "10.0.0.9"
    without_ray, with_ray = _auto_address("plain"), _auto_address("ray")
    assert without_ray["ray"] is None
    assert without_ray["auto"] == with_ray["auto"] == with_ray["ray"], (without_ray, with_ray)
    for run in (without_ray, with_ray):
        assert run["remote"] == run["towards_router"], run


def test_env_vars_are_documented():
    """Every environment variable the integration reads is in docs/slime.md."""
    import pathlib

    docs = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "slime.md").read_text()
    missing = [
        name for var in slime_mod.ENV_VARS for name in (var.name, *var.aliases) if name not in docs
    ]
    assert not missing, f"undocumented in docs/slime.md: {missing}"


def test_non_generation_time_counts_each_engine_call_once():
    """Rollout time minus engine time, with a turn shared by two chains counted once."""
    from agentrl.slime.samples import non_generation_seconds

    shared = {"middleware_turn": 0, "engine_seconds": 1.0}
    chains = (
        _ts(
            [1],
            [2],
            [1],
            turn_metadata={1: shared, 2: {"middleware_turn": 1, "engine_seconds": 2.0}},
        ),
        _ts([1], [3], [1], turn_metadata={1: shared}),
    )
    result = types.SimpleNamespace(samples=chains, timings={"total": 10.0})
    assert non_generation_seconds(result) == pytest.approx(7.0)
    assert non_generation_seconds(types.SimpleNamespace(samples=(), timings={})) == 0.0
