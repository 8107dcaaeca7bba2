"""``python -m agentrl.trl.learn`` (``make learn``): watch a small model learn, on a CPU.

GRPO with TRL's ``GRPOTrainer`` through real agentrl rollouts: SmolLM2-135M-Instruct
drives the ``tiny_agent`` harness in bubblewrap sandboxes on the ``write-file`` tasks
(``agentrl.trl.tasks``), each graded by its ``eval_cmd`` in a fresh sandbox, served by
the policy being trained. One line per step (reward mean, exact success, seconds); at
the end a PNG of success per step and a run directory ``agentrl view`` opens (every
step's rollouts, tokens coloured by what trained). It stops at the goal (the mean exact
success of the last three steps at or above ``--target``), at ``--max-steps`` or past
``--budget`` seconds, and says plainly whether the goal was reached.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import resource
import time
from typing import Any

import attrs
import click

from agentrl.trl.plot import plot_curve
from agentrl.trl.rewards import grader_reward
from agentrl.trl.rollouts import AgentrlRollouts, TrlRolloutOptions
from agentrl.trl.tasks import learn_rows

__all__ = ["LearnConfig", "StepStats", "learn", "main"]

logger = logging.getLogger(__name__)

#: How many of the last steps the goal is judged on.
GOAL_WINDOW = 3


@attrs.frozen(kw_only=True)
class LearnConfig:
    """One learning run: the model, the task set, GRPO's knobs and the stopping rule."""

    model: str
    out: str = "runs/learn"
    tasks: int = 64
    seed: int = 0
    prompts_per_step: int = 4
    generations: int = 4
    learning_rate: float = 3e-5
    temperature: float = 0.7
    max_new_tokens: int = 40
    max_steps: int = 40
    budget: float = 900.0
    target: float = 0.6
    max_turns: int = 1


@attrs.define
class StepStats:
    """What one GRPO step's rollouts did."""

    step: int
    rollouts: int = 0
    trainable: int = 0
    solved: int = 0
    reward_mean: float = 0.0
    rollout_seconds: float = 0.0
    seconds: float = 0.0

    @property
    def success(self) -> float:
        return self.solved / self.trainable if self.trainable else 0.0


def _step_stats(step: int, results: list[Any], seconds: float) -> StepStats:
    trainable = [r for r in results if not r.remove_sample]
    return StepStats(
        step=step,
        rollouts=len(results),
        trainable=len(trainable),
        solved=sum(1 for r in trainable if r.outcome.value == "solved"),
        reward_mean=sum(r.reward for r in trainable) / len(trainable) if trainable else 0.0,
        rollout_seconds=seconds,
    )


def goal_reached(curve: list[StepStats], target: float) -> bool:
    """Whether the mean success of the last ``GOAL_WINDOW`` steps reaches ``target``."""
    if len(curve) < GOAL_WINDOW:
        return False
    window = curve[-GOAL_WINDOW:]
    return sum(s.success for s in window) / GOAL_WINDOW >= target


def peak_rss_gb() -> float:
    """This process's peak resident memory, in GB (sandboxes are other processes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def learn(config: LearnConfig, echo: Any = click.echo) -> dict[str, Any]:
    """Run GRPO until the goal, ``max_steps`` or the budget; returns the run's report."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(config.seed)
    out = pathlib.Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = learn_rows(config.tasks, seed=config.seed, root=out / "tasks")
    dataset = Dataset.from_list([{"prompt": json.dumps(row)} for row in rows])
    tokenizer = AutoTokenizer.from_pretrained(config.model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(config.model, dtype=torch.float32)

    curve: list[StepStats] = []
    started = time.monotonic()
    clock = {"call": started, "step": started}

    def on_results(step: int, results: list[Any]) -> None:
        curve.append(_step_stats(step + 1, results, time.monotonic() - clock["call"]))

    rollouts = AgentrlRollouts(
        TrlRolloutOptions(
            harness="tiny_agent",
            tokenizer=config.model,
            harness_options={"max_turns": config.max_turns},
            rollout={
                "agent_time_budget": 300.0,
                "eval_timeout": 60.0,
                "boot_retries": 1,
                "prompt_template": "{problem_statement}",
            },
            max_new_tokens=config.max_new_tokens,
            max_context_tokens=1024,
            batch_size=config.prompts_per_step * config.generations,
            run_dir=str(out / "rollouts"),
        ),
        on_results=on_results,
    )

    class Progress(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            clock["call"] = time.monotonic()

        def on_step_end(self, args, state, control, **kwargs):
            now = time.monotonic()
            if curve:
                stats = curve[-1]
                stats.seconds = now - clock["step"]
                echo(
                    f"step {stats.step:3d}  reward {stats.reward_mean:.2f}  "
                    f"exact {stats.success:6.1%} ({stats.solved}/{stats.trainable})  "
                    f"{stats.seconds:5.1f} s/step (rollouts {stats.rollout_seconds:.1f} s)  "
                    f"elapsed {now - started:5.0f} s"
                )
            clock["step"] = now
            if goal_reached(curve, config.target) or now - started > config.budget:
                control.should_training_stop = True

    batch = config.prompts_per_step * config.generations
    args = GRPOConfig(
        output_dir=str(out / "trainer"),
        use_cpu=True,
        # float32: TRL's default bf16 autocast makes its log-probs differ from the sampled
        # ones by up to 0.65 on this model (the trained tokens are sampled in float32).
        bf16=False,
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=1,
        num_generations=config.generations,
        max_completion_length=config.max_new_tokens,
        temperature=config.temperature,
        learning_rate=config.learning_rate,
        lr_scheduler_type="constant",
        max_steps=config.max_steps,
        beta=0.0,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=config.seed,
        disable_tqdm=True,
    )
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=grader_reward,
        args=args,
        train_dataset=dataset,
        rollout_func=rollouts,
        callbacks=[Progress()],
    )
    echo(
        f"agentrl learn: GRPO on {config.tasks} write-file tasks, {config.prompts_per_step} "
        f"prompts x {config.generations} rollouts per step, goal {config.target:.0%} exact "
        f"success (mean of the last {GOAL_WINDOW} steps) within {config.budget:.0f} s"
    )
    try:
        trainer.train()
    finally:
        rollouts.close()
    wall = time.monotonic() - started
    reached = goal_reached(curve, config.target)
    report = {
        "goal_reached": reached,
        "target": config.target,
        "steps": len(curve),
        "success": [round(s.success, 4) for s in curve],
        "reward_mean": [round(s.reward_mean, 4) for s in curve],
        "seconds_per_step": [round(s.seconds, 1) for s in curve],
        "rollout_seconds": [round(s.rollout_seconds, 1) for s in curve],
        "wall_seconds": round(wall, 1),
        "peak_rss_gb": round(peak_rss_gb(), 2),
        "config": attrs.asdict(config),
    }
    (out / "curve.json").write_text(json.dumps(report, indent=2) + "\n")
    png = plot_curve(out / "learning_curve.png", [s.success for s in curve], target=config.target)
    echo(f"curve: {png} · rollouts: agentrl view {out / 'rollouts'}")
    base = curve[0].success if curve else 0.0
    last = report["success"][-GOAL_WINDOW:]
    verdict = "REACHED" if reached else "NOT REACHED"
    echo(
        f"goal {verdict}: exact success {base:.0%} at step 1, last {len(last)} steps "
        f"{', '.join(f'{v:.0%}' for v in last)} (goal {config.target:.0%}); "
        f"{len(curve)} steps in {wall:.0f} s, peak RSS {report['peak_rss_gb']:.1f} GB"
    )
    return report


@click.command()
@click.option("--model", "model", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--out", default="runs/learn", show_default=True)
@click.option("--tasks", default=64, show_default=True, type=click.IntRange(1))
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--prompts-per-step", default=4, show_default=True, type=click.IntRange(1))
@click.option("--generations", default=4, show_default=True, type=click.IntRange(2))
@click.option("--lr", "learning_rate", default=3e-5, show_default=True, type=float)
@click.option("--temperature", default=0.7, show_default=True, type=float)
@click.option("--max-new-tokens", default=40, show_default=True, type=click.IntRange(1))
@click.option("--max-steps", default=40, show_default=True, type=click.IntRange(1))
@click.option("--budget", default=900.0, show_default=True, type=float, help="Seconds.")
@click.option("--target", default=0.6, show_default=True, type=float)
@click.option("--max-turns", default=1, show_default=True, type=click.IntRange(1))
def main(**options: Any) -> None:
    """GRPO through real agentrl rollouts on a CPU; exits 1 when the goal is not reached."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    report = learn(LearnConfig(**options))
    raise SystemExit(0 if report["goal_reached"] else 1)


if __name__ == "__main__":
    main()
