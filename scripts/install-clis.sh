#!/usr/bin/env bash
# Install the pinned agent CLIs the real-CLI tests drive into .cache/clis/ (gitignored).
#
#   .cache/clis/bin/claude          @anthropic-ai/claude-code 2.1.332 (native binary; runs on
#                                   Node 20 even though the package declares engines.node >= 22)
#   .cache/clis/bin/claude-2.1.197  @anthropic-ai/claude-code 2.1.197 (the newest declaring
#                                   node >= 18: what a plain npm install picks on Node 20)
#   .cache/clis/bin/codex           @openai/codex 0.171.0
#
# Idempotent: a CLI whose pinned version is already installed is left alone, so a second
# run takes well under a second. Override the pins with CLAUDE_CODE_VERSION / CODEX_VERSION.
set -euo pipefail

CLAUDE_CODE_VERSION=${CLAUDE_CODE_VERSION:-2.1.332}
CLAUDE_CODE_NODE18_VERSION=${CLAUDE_CODE_NODE18_VERSION:-2.1.197}
CODEX_VERSION=${CODEX_VERSION:-0.171.0}

root="$(cd "$(dirname "$0")/.." && pwd)"
dest="${AGENTRL_CLI_DIR:-$root/.cache/clis}"
mkdir -p "$dest/bin"

if ! command -v npm >/dev/null 2>&1; then
    echo "install-clis: npm is not installed; install Node.js >= 20 with npm, then rerun $0" >&2
    exit 1
fi

# install <package> <version> <binary name> [<link name>]
install() {
    local package=$1 version=$2 binary=$3 link=${4:-$3}
    local prefix="$dest/$binary-$version"
    local stamp="$prefix/.installed"
    if [[ -f $stamp && -x $prefix/node_modules/.bin/$binary ]]; then
        ln -sfn "$prefix/node_modules/.bin/$binary" "$dest/bin/$link"
        return 0
    fi
    echo "install-clis: installing $package@$version into $prefix" >&2
    rm -rf "$prefix"
    mkdir -p "$prefix"
    # --engine-strict=false: claude-code declares node >= 22 but ships a native binary.
    npm install --prefix "$prefix" --no-save --no-audit --no-fund --no-package-lock \
        --engine-strict=false --loglevel=error "$package@$version" >&2
    if [[ ! -x $prefix/node_modules/.bin/$binary ]]; then
        echo "install-clis: $package@$version installed but $binary is missing under $prefix" >&2
        exit 1
    fi
    touch "$stamp"
    ln -sfn "$prefix/node_modules/.bin/$binary" "$dest/bin/$link"
}

install @anthropic-ai/claude-code "$CLAUDE_CODE_VERSION" claude
install @anthropic-ai/claude-code "$CLAUDE_CODE_NODE18_VERSION" claude "claude-$CLAUDE_CODE_NODE18_VERSION"
install @openai/codex "$CODEX_VERSION" codex
