"""Any trainer: run agentrl rollouts and hand their token-exact samples to your own update.

Builds one rollout stack (engine client, middleware, harness, sandboxes, grader), runs the
example tasks through Claude Code in bubblewrap sandboxes, and turns every
``TrainingSample`` into the arrays a policy-gradient step reads. Point it at any
token-level engine agentrl speaks (SGLang's ``/generate``, vLLM's ``/inference/v1/generate``)::

    python examples/trainers/any_trainer.py --engine sglang --engine-url http://127.0.0.1:30000 \\
        --tokenizer /models/Qwen3-8B --cli-dir .cache/clis

``train_step`` is where a trainer's own code goes; here it only checks and summarises.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import pathlib

from agentrl.graders.tasks import load_tasks
from agentrl.rollout.stack import Stack, StackOptions

TASKS = pathlib.Path(__file__).resolve().parents[1] / "tasks" / "scaleswe.jsonl"


def train_step(samples) -> dict:
    """What a trainer consumes: per sample the ids, the mask, the sampled log-probs, the reward."""
    batch = []
    for s in samples:
        response = s.tokens[s.prompt_length :]
        assert len(response) == len(s.loss_mask) == len(s.rollout_logprobs) == s.response_length
        batch.append(
            {
                "input_ids": list(s.tokens),
                "response_start": s.prompt_length,
                "loss_mask": list(s.loss_mask),  # 1: the engine sampled it, train on it
                "old_logprobs": list(s.rollout_logprobs),  # as sampled, for the ratio
                "reward": s.reward,
            }
        )
    return {
        "samples": len(batch),
        "trained_tokens": sum(sum(b["loss_mask"]) for b in batch),
        "rewards": [b["reward"] for b in batch],
    }


async def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="sglang")
    parser.add_argument("--engine-url", required=True)
    parser.add_argument("--tokenizer", required=True, help="the served model's tokenizer directory")
    parser.add_argument("--cli-dir", required=True, help="holds bin/claude (agentrl install-clis)")
    parser.add_argument("--tasks", type=pathlib.Path, default=TASKS)
    parser.add_argument("--limit", type=int, default=1, help="how many tasks to run")
    args = parser.parse_args(argv)

    options = StackOptions(
        harness="claude_code",
        sandbox="local",  # bubblewrap on this machine; e2b or docker elsewhere
        grader="scaleswe",
        engine=args.engine,
        engine_url=args.engine_url,
        tokenizer=args.tokenizer,
        tool_parser="hermes",
        cli_dir=args.cli_dir,
        rollout={"agent_time_budget": 300, "eval_timeout": 300},
    )
    steps = []
    async with Stack(options) as stack:
        rows = load_tasks(args.tasks, grader=stack.grader)[: args.limit]
        results = await asyncio.gather(*(stack.rollout(row.task, k) for k, row in enumerate(rows)))
    for result in results:
        if result.remove_sample:  # infra or grader failure: never a reward that trains
            logging.warning("%s: %s, not trained", result.instance_id, result.outcome.value)
            continue
        step = {"instance_id": result.instance_id, "outcome": result.outcome.value}
        step.update(train_step(result.samples))
        logging.info("%s", step)
        steps.append(step)
    return steps


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    asyncio.run(main())
