"""examples/verl: the dataset it prepares and the training command it runs, read by real verl.

``prepare_data.py`` writes a parquet file that verl's own ``RLHFDataset`` loads, and each
row it yields carries an agentrl task the grader parses. ``run_swe_grpo.sh`` sets only
keys that exist in verl 0.9.1's trainer config (``_generated_ppo_trainer.yaml``). The
boundary: the training itself needs GPUs (vLLM, FSDP) and is not started here.
"""

from __future__ import annotations

import importlib.util
import pathlib
import re

from verl_support import REPO, import_verl

from agentrl.graders.scaleswe import ScaleSWEGrader
from agentrl.verl import AGENT_LOOP_CONFIG, VerlLoopOptions

EXAMPLES = REPO / "examples" / "verl"


def _prepare_data():
    spec = importlib.util.spec_from_file_location("prepare_data", EXAMPLES / "prepare_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_prepared_rows_load_in_verls_dataset_and_parse_as_tasks(qwen_tokenizer, tmp_path):
    """Every example task survives parquet and RLHFDataset and parses back to its Task."""
    import_verl()
    import pandas as pd
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    tasks = REPO / "examples" / "tasks" / "scaleswe.jsonl"
    out = tmp_path / "train.parquet"
    pd.DataFrame(_prepare_data().verl_rows(tasks)).to_parquet(out)
    config = OmegaConf.create(
        {"max_prompt_length": 4096, "filter_overlong_prompts": False, "cache_dir": str(tmp_path)}
    )
    dataset = RLHFDataset(str(out), qwen_tokenizer, config)
    # The loop's tasks_dir option: relative paths in rows resolve against the tasks' folder.
    options, grader = VerlLoopOptions(tasks_dir=str(tasks.parent)), ScaleSWEGrader()
    ids = []
    for k in range(len(dataset)):
        row = dataset[k]
        assert row["agent_name"] == "agentrl" and row["index"] == k
        task = grader.resolve_paths(
            grader.parse_task(options.task_row(row)), pathlib.Path(options.tasks_dir)
        )
        assert pathlib.Path(task.repo).is_absolute()
        assert grader.check(task) is None
        ids.append(task.instance_id)
    assert len(ids) == len(tasks.read_text().splitlines()) and "textstats-1" in ids


def _keys(config, prefix=""):
    for key, value in config.items():
        path = f"{prefix}{key}"
        yield path
        if isinstance(value, dict):
            yield from _keys(value, path + ".")


def test_training_command_sets_only_keys_verls_config_has():
    """Each ``key=value`` override of run_swe_grpo.sh names a key of verl's trainer config."""
    agent_loop = import_verl()
    import yaml

    generated = pathlib.Path(agent_loop.__file__).parents[2] / "trainer" / "config"
    config = yaml.safe_load((generated / "_generated_ppo_trainer.yaml").read_text())
    known = set(_keys(config))
    script = (EXAMPLES / "run_swe_grpo.sh").read_text()
    overrides = re.findall(r"^\s+([a-z_.]+)=", script, flags=re.M)
    assert "actor_rollout_ref.rollout.agent.agent_loop_config_path" in overrides
    assert len(overrides) > 20
    assert sorted(set(overrides) - known) == []
    # Both shipped loop configs name the loop and parse as agentrl options.
    for path in (AGENT_LOOP_CONFIG, EXAMPLES / "agent_loop.yaml"):
        (entry,) = yaml.safe_load(path.read_text())
        assert entry.pop("name") == "agentrl"
        assert entry.pop("_target_") == "agentrl.verl.loop.AgentrlAgentLoop"
        VerlLoopOptions.from_mapping(entry)


def test_trainers_doc_trajectory_snippet_runs():
    """docs/trainers.md's TrajectoryManager snippet runs as printed (its asserts included)."""
    text = (REPO / "docs" / "trainers.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    (snippet,) = [b for b in blocks if "tm = TrajectoryManager()" in b]
    namespace: dict = {}
    exec(compile(snippet, "docs/trainers.md", "exec"), namespace)
    assert namespace["sample"].reward == 1.0


def test_supported_verl_is_the_version_installed_and_pinned():
    """The verl the tests run is the one SUPPORTED_VERL names, the extra and make pin."""
    import_verl()
    from importlib.metadata import version

    from agentrl.verl import SUPPORTED_VERL

    installed = version("verl")
    assert installed in SUPPORTED_VERL
    assert f"verl=={installed}" in (REPO / "Makefile").read_text()
    assert f'verl = ["verl=={installed}"]' in (REPO / "pyproject.toml").read_text()
