#!/usr/bin/env bash
# The example tasks' own images, built offline on the base image; prints their names.
#
#   DOCKER_HOST=unix://... scripts/docker-example-images.sh [CACHE_DIR]
#
# semver_lite-1 (examples/tasks/swebench.jsonl) boots from swebench's locally built
# instance image: its name is asked from agentrl (`agentrl images list --json`, the rule a
# boot uses), so it follows swebench's naming and the host's architecture. Each missing one
# is examples/tasks/images/Dockerfile on agentrl-base (scripts/docker-base-image.sh, whose
# CACHE_DIR this passes on), built with no network; a present one is left as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
base=$(bash scripts/docker-base-image.sh "${1:-.cache/docker}")
options='{}'
[[ -n ${DOCKER_HOST:-} ]] && options="{\"docker_host\": \"$DOCKER_HOST\"}"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
listing=$(PYTHONPATH=src "$python" -m agentrl.cli images list examples/tasks/swebench.jsonl \
    --grader auto --sandbox docker --sandbox-options "$options" --json 2>"$log") ||
    { cat "$log" >&2; exit 1; }
missing=$(printf '%s\n' "$listing" | "$python" -c '
import json, sys
for line in sys.stdin:
    if line.strip():
        need = json.loads(line)
        if not need["present"] and need["candidates"]:
            print(need["candidates"][0])
')
for image in $missing; do
    DOCKER_BUILDKIT=0 docker build --network none -q --build-arg "BASE=$base" -t "$image" \
        examples/tasks/images >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
done
printf '%s\n' "$listing" | "$python" -c '
import json, sys
for line in sys.stdin:
    if line.strip():
        print(json.loads(line)["image"])
'
