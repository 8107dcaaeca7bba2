#!/usr/bin/env bash
# Coding-agent RL with slime and agentrl on a multi-node Ray cluster (colocated training
# and rollout, 8 GPUs per node). Run it on the Ray head node from a long-lived shell
# (tmux), not under nohup: Ray's child processes die with a short-lived parent.
#
#   export SLIME_DIR=/root/slime MEGATRON_DIR=/root/Megatron-LM
#   export HF_CHECKPOINT=/models/Qwen3-30B-A3B REF_LOAD=/models/Qwen3-30B-A3B_torch_dist
#   export PROMPT_DATA=/data/swe_train.jsonl E2B_API_KEY=e2b_...
#   export HOSTFILE=/root/hostfile            # one worker IP per line (passwordless ssh)
#   bash examples/slime/run_coding_agent.sh
#
# Every node needs slime's image plus `pip install '/path/to/agentrl[e2b]'` (a checkout: the
# name agentrl on PyPI is another project; the rollout manager,
# which imports agentrl.slime, may be placed on any node). docs/slime.md explains each
# setting; the AGENTRL_* defaults below are the ones to review for a new cluster.

set -euo pipefail

# ---------------------------------------------------------------- paths and cluster
SLIME_DIR="${SLIME_DIR:?set SLIME_DIR to the slime checkout (it holds train.py)}"
MEGATRON_DIR="${MEGATRON_DIR:-/root/Megatron-LM}"
HF_CHECKPOINT="${HF_CHECKPOINT:?set HF_CHECKPOINT to the Hugging Face model directory}"
REF_LOAD="${REF_LOAD:?set REF_LOAD to the model in Megatron torch_dist format}"
PROMPT_DATA="${PROMPT_DATA:?set PROMPT_DATA to the task JSONL (prompt / label / metadata)}"
HOSTFILE="${HOSTFILE:-/root/hostfile}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
RUN_ROOT="${RUN_ROOT:-${PWD}/runs/coding_agent_$(date +%Y%m%d_%H%M%S)}"

MASTER_ADDR="${MASTER_ADDR:-$(hostname -I | awk '{print $1}')}"
RAY_PORT="${RAY_PORT:-6379}"
DASHBOARD_PORT="${DASHBOARD_PORT:-8265}"
export MASTER_ADDR
export GLOO_SOCKET_IFNAME="${GLOO_SOCKET_IFNAME:-eth0}"
export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-${GLOO_SOCKET_IFNAME}}"

WORKERS=()
if [[ -f "${HOSTFILE}" ]]; then
  while read -r ip _; do
    [[ -z "${ip}" || "${ip}" == \#* || "${ip}" == "${MASTER_ADDR}" ]] && continue
    WORKERS+=("${ip}")
  done < "${HOSTFILE}"
fi
NUM_NODES=$((1 + ${#WORKERS[@]}))
TOTAL_GPUS=$((NUM_NODES * GPUS_PER_NODE))

# ---------------------------------------------------------------- model
# Megatron architecture flags come from slime's own model scripts (MODEL_ARGS).
MODEL_SCRIPT="${MODEL_SCRIPT:-qwen3-30B-A3B.sh}"
set +u  # slime's model scripts may read unset variables
# shellcheck disable=SC1090
source "${SLIME_DIR}/scripts/models/${MODEL_SCRIPT}"
set -u

# The middleware parses the model's raw output with the same parsers SGLang would use, so
# these must match the served model (docs/slime.md lists the mapping):
#   Qwen3 (hybrid thinking):         qwen25 + qwen3
#   Qwen3-Coder:                     qwen3_coder, no reasoning parser
#   Qwen3.5 / Qwen3.6:               qwen3_coder + qwen3
TOOL_CALL_PARSER="${TOOL_CALL_PARSER:-qwen25}"
REASONING_PARSER="${REASONING_PARSER-qwen3}"  # set it empty for models without one
# Qwen3's <|im_end|> and <|endoftext|>.
STOP_TOKEN_IDS="${STOP_TOKEN_IDS:-151645 151643}"

# ---------------------------------------------------------------- router policy
# agentrl sends every model call of a rollout with `X-SMG-Routing-Key: <session id>`; a
# policy that honours the header keeps the rollout on one engine (warm prefix cache).
# slime's --router-policy takes its choices from the installed sglang-router, so ask it:
#   consistent_hashing  slime's own image's router (the header, hashed onto the engines)
#   manual              the released sglang-router 0.3.2 on PyPI, which rejects
#                       consistent_hashing: sticky per header value (a new key goes to a
#                       random engine, then stays there)
#   (neither)           no --router-policy: the router's default, cache_aware, which ignores
#                       the header and routes by prompt-prefix match (usually the same
#                       engine for a session's turns, not always; under load imbalance it
#                       goes to the least-loaded engine and that turn recomputes its prompt)
# ROUTER_POLICY overrides the choice (empty: pass no --router-policy).
router_policies() {
  python3 - <<'PY'
import re
import subprocess
import sys

try:
    out = subprocess.run(
        [sys.executable, "-m", "sglang_router.launch_router", "--help"],
        capture_output=True, text=True, timeout=120,
    ).stdout
except (OSError, subprocess.SubprocessError):
    out = ""
found = re.search(r"--(?:router-)?policy \{([^}]*)\}", out)
print(" ".join(found.group(1).split(",")) if found else "")
PY
}
if [[ -z "${ROUTER_POLICY+set}" ]]; then
  ROUTER_POLICY=""
  ROUTER_CHOICES="$(router_policies)"
  for policy in consistent_hashing manual; do
    if [[ " ${ROUTER_CHOICES} " == *" ${policy} "* ]]; then
      ROUTER_POLICY="${policy}"
      break
    fi
  done
  if [[ -z "${ROUTER_POLICY}" ]]; then
    echo "warning: the installed sglang-router offers neither consistent_hashing nor manual" \
      "(choices: ${ROUTER_CHOICES:-none found}); using its default policy, which ignores" \
      "X-SMG-Routing-Key (see docs/slime.md, router policy)" >&2
  fi
fi

# ---------------------------------------------------------------- lengths and batch
MAX_CONTEXT_LEN="${MAX_CONTEXT_LEN:-65536}"   # per rollout (whole session), and sample cap
MAX_RESPONSE_LEN="${MAX_RESPONSE_LEN:-16384}" # per model call
ROLLOUT_BATCH_SIZE="${ROLLOUT_BATCH_SIZE:-8}" # prompts per step
N_SAMPLES="${N_SAMPLES:-8}"                   # rollouts per prompt (the GRPO group)

# ---------------------------------------------------------------- parallelism
TP="${TP:-4}"
PP="${PP:-1}"
CP="${CP:-2}"
EP="${EP:-8}"
ETP="${ETP:-1}"
ROLLOUT_GPUS_PER_ENGINE="${ROLLOUT_GPUS_PER_ENGINE:-8}"

# ---------------------------------------------------------------- agentrl (agent side)
# slime example names (SWE_*, ADAPTER_*) are honoured when the AGENTRL_* name is unset.
export AGENTRL_HARNESS="${AGENTRL_HARNESS:-${SWE_AGENT:-claude_code}}"
export AGENTRL_SANDBOX="${AGENTRL_SANDBOX:-e2b}"
# The grader names; AGENTRL_*_PROTOCOL are agentrl's older names for them.
export AGENTRL_TRAIN_GRADER="${AGENTRL_TRAIN_GRADER:-${AGENTRL_TRAIN_PROTOCOL:-${SWE_TRAIN_PROTOCOL:-scaleswe}}}"
export AGENTRL_EVAL_GRADER="${AGENTRL_EVAL_GRADER:-${AGENTRL_EVAL_PROTOCOL:-${SWE_EVAL_PROTOCOL:-${AGENTRL_TRAIN_GRADER}}}}"
# Sandboxes dial the rollout manager's node; `auto` finds it wherever Ray placed it.
export AGENTRL_PUBLIC_HOST="${AGENTRL_PUBLIC_HOST:-${ADAPTER_PUBLIC_HOST:-auto}}"
export AGENTRL_BIND_HOST="${AGENTRL_BIND_HOST:-${ADAPTER_BIND_HOST:-0.0.0.0}}"
export AGENTRL_PORT="${AGENTRL_PORT:-${ADAPTER_PORT:-18001}}"
export AGENTRL_AGENT_TIME_BUDGET="${AGENTRL_AGENT_TIME_BUDGET:-${SWE_AGENT_TIME_BUDGET_SEC:-1800}}"
export AGENTRL_EVAL_TIMEOUT="${AGENTRL_EVAL_TIMEOUT:-${SWE_EVAL_TIMEOUT_SEC:-600}}"
export AGENTRL_BOOT_CONCURRENCY="${AGENTRL_BOOT_CONCURRENCY:-${SWE_BOOT_CONCURRENCY:-16}}"
# Claude Code: compact well before the context budget (compaction forks a new chain),
# no web tools, no slash commands. A JSON list of CLI arguments.
if [[ "${AGENTRL_HARNESS}" == claude_code && -z "${AGENTRL_CLAUDE_CODE_EXTRA_ARGS:-}" \
      && -z "${SLIME_AGENT_CC_EXTRA_ARGS:-}" ]]; then
  AGENTRL_CLAUDE_CODE_EXTRA_ARGS="$(python3 -c '
import json, sys
settings = {"autoCompactEnabled": True, "autoCompactWindow": int(sys.argv[1])}
print(json.dumps(["--settings", json.dumps(settings), "--disable-slash-commands",
                  "--disallowedTools", "WebFetch", "WebSearch"]))
' $((MAX_CONTEXT_LEN * 3 / 4)))"
  export AGENTRL_CLAUDE_CODE_EXTRA_ARGS
fi
export E2B_API_KEY="${E2B_API_KEY:-e2b_0000000000000000000000000000000000000000}"
export no_proxy="127.0.0.1,localhost,${MASTER_ADDR}${no_proxy:+,${no_proxy}}"
export NO_PROXY="${no_proxy}"

python3 -c "import agentrl.slime" || {
  echo "agentrl is not importable here; pip install '/path/to/agentrl[e2b]' (a checkout) on every node" >&2
  exit 1
}

# ---------------------------------------------------------------- Ray cluster
mkdir -p "${RUN_ROOT}/rollout_dumps"
ray stop --force >/dev/null 2>&1 || true
ray start --head --node-ip-address "${MASTER_ADDR}" --port "${RAY_PORT}" \
  --num-gpus "${GPUS_PER_NODE}" --disable-usage-stats \
  --dashboard-host 0.0.0.0 --dashboard-port "${DASHBOARD_PORT}"
for ip in ${WORKERS[@]+"${WORKERS[@]}"}; do
  echo "starting Ray worker on ${ip}"
  ssh -o StrictHostKeyChecking=no "root@${ip}" \
    "python3 -c 'import agentrl.slime' && ray stop --force >/dev/null 2>&1; \
     ray start --address ${MASTER_ADDR}:${RAY_PORT} --node-ip-address ${ip} \
       --num-gpus ${GPUS_PER_NODE} --disable-usage-stats" &
done
wait
deadline=$((SECONDS + ${RAY_WAIT_SEC:-300}))
until [[ "$(ray status 2>/dev/null | grep -c 'node_')" -ge "${NUM_NODES}" ]]; do
  if ((SECONDS > deadline)); then
    echo "only $(ray status 2>/dev/null | grep -c 'node_') of ${NUM_NODES} Ray nodes joined;" \
      "check the workers in ${HOSTFILE} (ssh, ray start, import agentrl.slime)" >&2
    exit 1
  fi
  echo "waiting for ${NUM_NODES} Ray nodes..."
  sleep 5
done

# Everything the rollout manager needs, wherever Ray places it.
RUNTIME_ENV_JSON="$(PYTHONPATH_VALUE="${MEGATRON_DIR}:${SLIME_DIR}" python3 - <<'PY'
import json
import os

prefixes = ("AGENTRL_", "SWE_", "ADAPTER_", "SLIME_AGENT_", "E2B_")
env = {k: v for k, v in os.environ.items() if k.startswith(prefixes)}
for key in ("no_proxy", "NO_PROXY", "MASTER_ADDR", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
    if key in os.environ:
        env[key] = os.environ[key]
env["PYTHONPATH"] = os.environ["PYTHONPATH_VALUE"]
env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
env["NCCL_NVLS_ENABLE"] = "0"
print(json.dumps({"env_vars": env}))
PY
)"

# ---------------------------------------------------------------- slime arguments
CKPT_ARGS=(
  --hf-checkpoint "${HF_CHECKPOINT}"
  --ref-load "${REF_LOAD}"
)

ROLLOUT_ARGS=(
  --custom-generate-function-path agentrl.slime.generate
  --custom-reward-post-process-path agentrl.slime.reward_post_process
  --prompt-data "${PROMPT_DATA}"
  --input-key prompt
  --label-key label
  --metadata-key metadata
  --num-rollout "${NUM_ROLLOUT:-100}"
  --rollout-batch-size "${ROLLOUT_BATCH_SIZE}"
  --n-samples-per-prompt "${N_SAMPLES}"
  --rollout-max-context-len "${MAX_CONTEXT_LEN}"
  --rollout-max-response-len "${MAX_RESPONSE_LEN}"
  --rollout-temperature 1.0
  --rollout-top-p 1.0
  # shellcheck disable=SC2206
  --rollout-stop-token-ids ${STOP_TOKEN_IDS}
  --num-steps-per-rollout 1
  # Steps count rollouts, not samples: one step = every rollout of the batch.
  --global-batch-size $((ROLLOUT_BATCH_SIZE * N_SAMPLES))
  --save-debug-rollout-data "${RUN_ROOT}/rollout_dumps/rollout_{rollout_id}.pt"
)

PERF_ARGS=(
  --tensor-model-parallel-size "${TP}"
  --sequence-parallel
  --pipeline-model-parallel-size "${PP}"
  --context-parallel-size "${CP}"
  --expert-model-parallel-size "${EP}"
  --expert-tensor-parallel-size "${ETP}"
  --recompute-granularity full
  --recompute-method uniform
  --recompute-num-layers 1
  # Fan-out makes the sample count per step vary: only dynamic batching handles it.
  --use-dynamic-batch-size
  --max-tokens-per-gpu $((MAX_CONTEXT_LEN / CP))
  --log-probs-chunk-size 1024
)

ALGO_ARGS=(
  --advantage-estimator grpo
  --kl-loss-coef 0.00
  --kl-loss-type low_var_kl
  --entropy-coef 0.00
  --eps-clip 0.2
  --eps-clip-high 0.28
)

OPTIMIZER_ARGS=(
  --optimizer adam
  --lr 1e-6
  --lr-decay-style constant
  --weight-decay 0.1
  --adam-beta1 0.9
  --adam-beta2 0.98
  --optimizer-cpu-offload
  --overlap-cpu-optimizer-d2h-h2d
  --use-precision-aware-optimizer
)

SGLANG_ARGS=(
  --rollout-num-gpus "${TOTAL_GPUS}"
  --rollout-num-gpus-per-engine "${ROLLOUT_GPUS_PER_ENGINE}"
  --sglang-mem-fraction-static 0.7
  --sglang-tool-call-parser "${TOOL_CALL_PARSER}"
)
if [[ -n "${ROUTER_POLICY}" ]]; then
  # Each rollout's turns go to one engine (session affinity, warm prefix cache).
  SGLANG_ARGS+=(--router-policy "${ROUTER_POLICY}")
fi

if [[ -n "${REASONING_PARSER}" ]]; then
  SGLANG_ARGS+=(--sglang-reasoning-parser "${REASONING_PARSER}")
fi

MISC_ARGS=(
  --attention-dropout 0.0
  --hidden-dropout 0.0
  --accumulate-allreduce-grads-in-fp32
  --attention-softmax-in-fp32
  --attention-backend flash
  --colocate
)
# Deliberately absent (they break with fan-out, see docs/slime.md, "Pitfalls"): --group-rm,
# --partial-rollout, --log-passrate, --rollout-top-p other than 1, and slime's own dynamic
# filters (--dynamic-sampling-filter-path agentrl.slime.check_reward_nonzero_std works).

cd "${SLIME_DIR}"
ray job submit --address "http://127.0.0.1:${DASHBOARD_PORT}" \
  --runtime-env-json "${RUNTIME_ENV_JSON}" \
  -- python3 -u train.py \
  --actor-num-nodes "${NUM_NODES}" \
  --actor-num-gpus-per-node "${GPUS_PER_NODE}" \
  "${MODEL_ARGS[@]}" \
  "${CKPT_ARGS[@]}" \
  "${ROLLOUT_ARGS[@]}" \
  "${PERF_ARGS[@]}" \
  "${ALGO_ARGS[@]}" \
  "${OPTIMIZER_ARGS[@]}" \
  "${SGLANG_ARGS[@]}" \
  "${MISC_ARGS[@]}" \
  2>&1 | tee "${RUN_ROOT}/run.log"
