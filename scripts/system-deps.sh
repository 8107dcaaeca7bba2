#!/usr/bin/env bash
# Install the system tools the test suite uses, when they are missing.
set -euo pipefail
need=()
# The local sandbox shows the host's /usr: node, python3 and git must live there.
# The docker sandbox's tests start their own dockerd and build their base image offline.
# `agentrl view`'s browser tests drive Debian's chromium (playwright's own download is not used).
for tool in bwrap:bubblewrap socat:socat git:git patch:patch /usr/bin/node:nodejs /usr/bin/python3:python3 \
    dockerd:docker.io mmdebstrap:mmdebstrap chromium:chromium; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || need+=("${tool##*:}")
done
if ((${#need[@]})); then
    if [[ $(id -u) -ne 0 ]]; then
        echo "missing system packages: ${need[*]} (install them with your package manager)" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
