#!/usr/bin/env bash
# Install the pinned agent CLIs into .cache/clis/ (or $AGENTRL_CLI_DIR): a wrapper around
# `agentrl install-clis`, which holds the pins (src/agentrl/harnesses/install_clis.py) and
# takes the same overrides (CLAUDE_CODE_VERSION, CLAUDE_CODE_NODE18_VERSION, CODEX_VERSION,
# QWEN_CODE_VERSION).
# Extra arguments are passed on (e.g. --only codex).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
agentrl="$root/.venv/bin/agentrl"
if [[ ! -x $agentrl ]]; then
    agentrl=$(command -v agentrl) || {
        echo "install-clis: agentrl is not installed; run make deps first (or install agentrl from this checkout: pip install .)" >&2
        exit 1
    }
fi
exec "$agentrl" install-clis --dest "${AGENTRL_CLI_DIR:-$root/.cache/clis}" "$@"
