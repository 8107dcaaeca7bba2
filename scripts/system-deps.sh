#!/usr/bin/env bash
# Install the system tools the test suite uses, when they are missing.
set -euo pipefail

# How long to wait for another apt or dpkg (unattended-upgrades, a parallel job) to let go
# of its lock before giving up, in seconds.
APT_LOCK_WAIT=${APT_LOCK_WAIT:-600}

# apt-get "$@", waiting while another apt holds a lock instead of failing at once.
# DPkg::Lock::Timeout makes apt-get wait for dpkg's lock, but not for the package lists'
# lock that `apt-get update` takes (nor, on some apt versions, the archives' lock): those
# fail at once with "Could not get lock", so that failure is retried until the deadline.
apt_get() {
    local deadline=$((SECONDS + APT_LOCK_WAIT)) out status told=""
    while true; do
        status=0
        out=$(apt-get -o "DPkg::Lock::Timeout=$APT_LOCK_WAIT" "$@" 2>&1) || status=$?
        if ((status == 0)); then
            [[ -n $out ]] && printf '%s\n' "$out"
            return 0
        fi
        if ! grep -q "Could not get lock" <<<"$out" || ((SECONDS >= deadline)); then
            printf '%s\n' "$out" >&2
            return "$status"
        fi
        if [[ -z $told ]]; then
            echo "apt-get $1: another apt holds its lock; waiting up to ${APT_LOCK_WAIT}s" >&2
            told=1
        fi
        sleep 2
    done
}

main() {
    local need=() tool
    # The local sandbox shows the host's /usr: node, python3 and git must live there.
    # The docker sandbox's tests start their own dockerd and build their base image offline.
    # `agentrl view`'s browser tests drive Debian's chromium (playwright's own download is not used).
    for tool in bwrap:bubblewrap socat:socat git:git patch:patch /usr/bin/node:nodejs \
        /usr/bin/python3:python3 dockerd:docker.io mmdebstrap:mmdebstrap chromium:chromium; do
        command -v "${tool%%:*}" >/dev/null 2>&1 || need+=("${tool##*:}")
    done
    if ((${#need[@]})); then
        if [[ $(id -u) -ne 0 ]]; then
            echo "missing system packages: ${need[*]} (install them with your package manager)" >&2
            exit 1
        fi
        apt_get update -qq
        DEBIAN_FRONTEND=noninteractive apt_get install -y -qq "${need[@]}" >/dev/null
    fi
}

# Sourced (the tests call apt_get), it only defines the functions.
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    main "$@"
fi
