"""GRPO steps of TRL's real ``GRPOTrainer`` through real agentrl rollouts (tiny agent, bubblewrap,
the trained model serving its own turns): what TRL trains on is what the engine sampled."""

from __future__ import annotations

import json
import os

import pytest

from agentrl.engines.transformers import TransformersEngine
from agentrl.trl import AgentrlRollouts, TrlRolloutOptions, grader_reward
from agentrl.trl.tasks import learn_rows

pytestmark = pytest.mark.timeout(600)

#: TRL's recomputed log-prob of a sampled token vs the engine's, both float32 on CPU (the
#: engine decodes with a KV cache and batched, left-padded prompts; TRL runs one forward
#: pass): 3e-5 seen. GRPOConfig's default bf16=True autocasts both sides to bfloat16 and
#: gives differences up to 0.65, which is why the run sets bf16=False.
LOGPROB_TOLERANCE = 1e-3


def _rows(root):
    """Two tasks: one exact write-file task, one solved by writing any file (mixed groups)."""
    exact, loose = learn_rows(2, seed=5, root=root)
    loose["metadata"]["eval_cmd"] = 'test "$(ls -A | wc -l)" -gt 1'
    loose["metadata"]["instance_id"] = loose["label"] = "write-any-file"
    return [exact, loose]


@pytest.fixture(scope="module")
def grpo_run(trl_module, demo_model, tmp_path_factory):
    """Two GRPO steps (2 prompts x 4 rollouts, two turns each at most), everything recorded."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl import GRPOConfig, GRPOTrainer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("trl")
    rows = _rows(root)
    tokenizer = AutoTokenizer.from_pretrained(demo_model)
    model = AutoModelForCausalLM.from_pretrained(demo_model, dtype=torch.float32)

    sampled: dict[str, list] = {}
    original_generate = TransformersEngine.generate

    async def recording_generate(self, input_ids, sampling_params, *, rid=None, routing_key=None):
        gen = await original_generate(
            self, input_ids, sampling_params, rid=rid, routing_key=routing_key
        )
        sampled.setdefault(routing_key, []).append(gen)
        return gen

    results: list = []
    rollouts = AgentrlRollouts(
        TrlRolloutOptions(
            tokenizer=str(demo_model),
            harness_options={"max_turns": 2},
            rollout={
                "agent_time_budget": 300.0,
                "eval_timeout": 60.0,
                "boot_retries": 1,
                "prompt_template": "{problem_statement}",
            },
            max_new_tokens=24,
            max_context_tokens=1024,
            batch_size=8,
            run_dir=str(root / "run"),
        ),
        on_results=lambda step, batch: results.append(batch),
    )
    args = GRPOConfig(
        output_dir=str(root / "trainer"),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=24,
        temperature=0.7,
        learning_rate=1e-5,
        max_steps=2,
        beta=0.0,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=grader_reward,
        args=args,
        train_dataset=Dataset.from_list([{"prompt": json.dumps(row)} for row in rows]),
        rollout_func=rollouts,
    )
    batches: list[dict] = []
    original_score = trainer._generate_and_score_completions

    def scoring(inputs):
        out = original_score(inputs)
        ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
        mask = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
        with torch.no_grad():
            logps, _ = trainer._get_per_token_logps_and_entropies(
                trainer.model, ids, mask, out["completion_ids"].size(1)
            )[:2]
        batches.append({k: v for k, v in out.items()} | {"recomputed": logps, "inputs": inputs})
        return out

    trainer._generate_and_score_completions = scoring
    TransformersEngine.generate = recording_generate
    try:
        trainer.train()
    finally:
        TransformersEngine.generate = original_generate
        rollouts.close()
    return {"trainer": trainer, "batches": batches, "results": results, "sampled": sampled}


def _rows_of(batch, results):
    """Per completion: (its ids, its env mask, TRL's recomputed log-probs, its advantage, result)."""
    out = []
    for i, result in enumerate(results):
        n = int(batch["completion_mask"][i].sum())
        ids = batch["completion_ids"][i, :n].tolist()
        mask = batch["tool_mask"][i, :n].tolist() if "tool_mask" in batch else [1] * n
        out.append((ids, mask, batch["recomputed"][i, :n], float(batch["advantages"][i]), result))
    return out


def test_trl_trains_on_exactly_the_tokens_the_engine_sampled(grpo_run):
    """Every completion TRL trained on is the rollout's main chain: the model tokens under
    env_mask 1 are the engine's generations of that session, in order, and env_mask is
    agentrl's loss mask."""
    assert len(grpo_run["batches"]) == len(grpo_run["results"]) == 2
    checked = 0
    for batch, results in zip(grpo_run["batches"], grpo_run["results"], strict=True):
        assert len(results) == 8
        for ids, mask, _, _, result in _rows_of(batch, results):
            assert not result.remove_sample, result.error
            (sample,) = result.samples
            assert ids == list(sample.tokens[sample.prompt_length :])
            assert mask == list(sample.loss_mask)
            trained = [t for t, m in zip(ids, mask, strict=True) if m]
            engine = [t for gen in grpo_run["sampled"][result.session_id] for t in gen.output_ids]
            assert trained == engine
            checked += 1
    assert checked == 16


def test_trls_log_probs_match_the_engines_sampled_log_probs(grpo_run):
    """TRL's own recomputation (its _get_per_token_logps_and_entropies at the weights that
    sampled, temperature 0.7) agrees with the engine's sampled log-probs on every trained token."""
    import torch

    worst = 0.0
    for batch, results in zip(grpo_run["batches"], grpo_run["results"], strict=True):
        for _, mask, recomputed, _, result in _rows_of(batch, results):
            (sample,) = result.samples
            engine = torch.tensor(sample.rollout_logprobs)
            trained = torch.tensor(mask, dtype=torch.bool)
            diff = (recomputed[trained] - engine[trained]).abs()
            worst = max(worst, float(diff.max()))
    print(f"max |TRL - engine| log-prob difference: {worst:.2e}")
    assert worst < LOGPROB_TOLERANCE


def test_rewards_are_the_graders_and_agreeing_groups_give_no_gradient(grpo_run):
    """The reward TRL used for each completion is its grade from the fresh grading sandbox;
    a group whose rewards all agree has advantage 0 and its loss has zero gradient."""
    import torch

    trainer = grpo_run["trainer"]
    agreeing = 0
    for batch, results in zip(grpo_run["batches"], grpo_run["results"], strict=True):
        rows = _rows_of(batch, results)
        rewards = [inp["agentrl_reward"] for inp in batch["inputs"]]
        for reward, result in zip(rewards, results, strict=True):
            assert result.grade is not None
            assert reward == result.grade.reward == result.reward
            assert result.outcome.value == ("solved" if result.grade.solved else "unsolved")
        for start in range(0, len(rows), 4):
            group = rewards[start : start + 4]
            advantages = [row[3] for row in rows[start : start + 4]]
            if len(set(group)) > 1:
                assert any(abs(a) > 0.1 for a in advantages)
                continue
            agreeing += 1
            assert advantages == [0.0] * 4
            part = {
                k: (v[start : start + 4] if torch.is_tensor(v) and v.dim() > 0 else v)
                for k, v in batch.items()
                if k not in ("recomputed", "inputs")
            }
            trainer.model.zero_grad(set_to_none=True)
            loss = trainer._compute_loss(trainer.model, part)
            loss.backward()
            grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
            assert all(float(g.abs().max()) == 0.0 for g in grads)
    assert agreeing >= 1


def test_the_run_directory_holds_every_rollout(grpo_run, tmp_path):
    """The runner wrote each step's rollouts (keys unique across steps), and ``agentrl view``
    renders them."""
    import pathlib

    trainer = grpo_run["trainer"]
    run = pathlib.Path(trainer.args.output_dir).parent / "run"
    rows = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    assert len(rows) == 16 and len({r["key"] for r in rows}) == 16
    samples = (run / "samples.jsonl").read_text().splitlines()
    assert len(samples) == 16
    from click.testing import CliRunner

    from agentrl.cli import cli

    page = tmp_path / "view.html"
    shown = CliRunner().invoke(cli, ["view", str(run), "--html", str(page)])
    assert shown.exit_code == 0, shown.output
    assert "(16 rollouts)" in shown.output
    assert "write-any-file" in page.read_text()
