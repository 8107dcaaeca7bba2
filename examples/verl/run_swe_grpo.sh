#!/usr/bin/env bash
# GRPO on SWE tasks with verl 0.9.1 and agentrl's agent loop (Claude Code in E2B sandboxes).
# One node with 8 GPUs; vLLM serves rollouts. Set MODEL, DATA (prepare_data.py's parquet
# files), E2B_API_KEY, and public_host in agent_loop.yaml.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
MODEL=${MODEL:-Qwen/Qwen3-8B}
DATA=${DATA:-$HOME/data/swe}

python3 -m verl.trainer.main_ppo \
  algorithm.adv_estimator=grpo \
  data.train_files="$DATA/train.parquet" \
  data.val_files="$DATA/val.parquet" \
  data.train_batch_size=32 \
  data.max_prompt_length=32768 \
  data.max_response_length=32768 \
  data.filter_overlong_prompts=False \
  data.return_raw_chat=True \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.actor.ppo_mini_batch_size=32 \
  actor_rollout_ref.actor.use_dynamic_bsz=True \
  actor_rollout_ref.actor.ppo_max_token_len_per_gpu=65536 \
  actor_rollout_ref.actor.loss_agg_mode=token-mean \
  actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.mode=async \
  actor_rollout_ref.rollout.n=8 \
  actor_rollout_ref.rollout.prompt_length=32768 \
  actor_rollout_ref.rollout.response_length=32768 \
  actor_rollout_ref.rollout.calculate_log_probs=True \
  actor_rollout_ref.rollout.agent.num_workers=8 \
  actor_rollout_ref.rollout.agent.agent_loop_config_path="$HERE/agent_loop.yaml" \
  actor_rollout_ref.rollout.agent.default_agent_loop=agentrl \
  trainer.n_gpus_per_node=8 \
  trainer.nnodes=1 \
  trainer.total_epochs=1 \
  trainer.logger='["console"]' \
  "$@"
