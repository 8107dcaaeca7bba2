"""examples/trainers/any_trainer.py (docs/trainers.md's "any other trainer") runs as written.

A real Claude Code rollout on the textstats example task in a bubblewrap sandbox, through
the example's own ``main`` with its command-line arguments; the engine is the scripted
SGLang server of ``agentrl.testing``, which the example reaches over HTTP as it would a
real SGLang. Asserts the summary a trainer would act on: every sampled token trained once.
"""

from __future__ import annotations

import importlib.util
import shutil

import pytest
from rollout_support import CLI_DIR, REPO
from verl_support import script_solution

from agentrl.testing.scripted_engine import ScriptedEngine

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
]


async def test_any_trainer_example_trains_on_every_sampled_token(
    qwen_tokenizer, qwen_tokenizer_dir
):
    """The example solves the task and its train_step sees exactly the sampled tokens."""
    from cli_support import installed_cli

    installed_cli("claude")
    path = REPO / "examples" / "trainers" / "any_trainer.py"
    spec = importlib.util.spec_from_file_location("any_trainer", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    async with ScriptedEngine(qwen_tokenizer, responder=script_solution(qwen_tokenizer)) as engine:
        steps = await example.main(
            [
                "--engine-url",
                engine.url,
                "--tokenizer",
                str(qwen_tokenizer_dir),
                "--cli-dir",
                str(CLI_DIR),
            ]
        )
    (step,) = steps
    assert step["instance_id"] == "textstats-1" and step["outcome"] == "solved"
    assert step["rewards"] == [1.0]
    assert step["trained_tokens"] == sum(len(g.output_ids) for g in engine.served)
