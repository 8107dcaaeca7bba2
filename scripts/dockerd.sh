#!/usr/bin/env bash
# A private Docker daemon for the test suite: no bridge, no iptables, everything under DIR.
#
#   scripts/dockerd.sh start DIR   start it (if not running); prints its DOCKER_HOST
#   scripts/dockerd.sh stop DIR    stop it by pid; remove its cgroups and /run leftovers
#
# DIR should be short (the daemon's unix socket lives in it: 108-byte path limit).
# Storage: overlay2, or vfs where overlay2 does not mount here.
set -euo pipefail
cmd=${1:?usage: dockerd.sh start|stop DIR}
dir=${2:?usage: dockerd.sh start|stop DIR}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
sock="$dir/docker.sock"
pidfile="$dir/dockerd.pid"
cgroup="agentrl-dockerd-$(basename "$dir")"

running() { [[ -s $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

start_with() {
    local driver=$1
    cat > "$dir/daemon.json" <<JSON
{"deprecated-key-path": "$dir/key.json", "cgroup-parent": "$cgroup"}
JSON
    mkdir -p "$dir/root" "$dir/exec"
    setsid dockerd --config-file "$dir/daemon.json" \
        --iptables=false --ip-forward=false --ip-masq=false --bridge=none \
        --storage-driver="$driver" --data-root "$dir/root" --exec-root "$dir/exec" \
        --pidfile "$pidfile" -H "unix://$sock" \
        < /dev/null >> "$dir/dockerd.log" 2>&1 &
    local pid=$! i=0
    while ! DOCKER_HOST="unix://$sock" docker version >/dev/null 2>&1; do
        if ! kill -0 "$pid" 2>/dev/null || ((i++ > 200)); then
            kill "$pid" 2>/dev/null || true
            return 1
        fi
        sleep 0.05
    done
}

stop() {
    if [[ -s $pidfile ]]; then
        local pid i=0
        pid=$(cat "$pidfile")
        kill -TERM "$pid" 2>/dev/null || true
        while kill -0 "$pid" 2>/dev/null && ((i++ < 200)); do sleep 0.05; done
        kill -KILL "$pid" 2>/dev/null || true
        rm -f "$pidfile"
    fi
    # What the daemon leaves behind: its cgroup parent in each hierarchy, its /run plugins.
    for d in /sys/fs/cgroup/*/"$cgroup" /sys/fs/cgroup/"$cgroup"; do
        [[ -d $d ]] && find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
    done
    rmdir /run/docker/plugins /run/docker 2>/dev/null || true
}

case $cmd in
start)
    command -v dockerd >/dev/null || { echo "dockerd is not installed (apt: docker.io)" >&2; exit 2; }
    if ! running; then
        start_with overlay2 || { stop; rm -rf "$dir/root"; start_with vfs; } || {
            echo "dockerd did not start; see $dir/dockerd.log:" >&2
            tail -5 "$dir/dockerd.log" >&2
            stop
            exit 1
        }
    fi
    echo "unix://$sock"
    ;;
stop) stop ;;
*) echo "usage: dockerd.sh start|stop DIR" >&2; exit 2 ;;
esac
