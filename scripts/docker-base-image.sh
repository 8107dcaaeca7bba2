#!/usr/bin/env bash
# The test suite's base image, built offline from the apt mirror and cached.
#
#   DOCKER_HOST=unix://... scripts/docker-base-image.sh [CACHE_DIR]   prints the image name
#
# mmdebstrap --variant=minbase (python3, git, ca-certificates) writes a tarball, cached
# under CACHE_DIR (default .cache/docker) by a key of the suite and package list, then
# `docker import`s it as agentrl-base:KEY unless the daemon already has that tag.
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${1:-.cache/docker}
suite=bookworm
packages=python3,python3-pytest,python-is-python3,git,ca-certificates
key=$(printf '%s %s minbase' "$suite" "$packages" | sha256sum | cut -c1-12)
image="agentrl-base:$key"
tarball="$cache/base-$key.tar"
if docker image inspect "$image" >/dev/null 2>&1; then
    echo "$image"
    exit 0
fi
mkdir -p "$cache"
if [[ ! -s $tarball ]]; then
    command -v mmdebstrap >/dev/null || { echo "mmdebstrap is not installed (apt: mmdebstrap)" >&2; exit 2; }
    # mmdebstrap picks the output format by the name's extension: the partial file ends in .tar.
    partial="$cache/partial-$key.tar"
    mmdebstrap --quiet --variant=minbase --include="$packages" "$suite" "$partial" >&2
    mv "$partial" "$tarball"
fi
docker import "$tarball" "$image" >/dev/null
echo "$image"
