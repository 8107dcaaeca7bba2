"""The POSIX sh program that runs inside a ``local`` sandbox.

``init.sh`` is the sandbox's long-lived main process: it starts one socat relay per
service (127.0.0.1:PORT -> the bound unix socket), reports ready, then reads requests from
a FIFO and starts each exec detached. The host side talks to it only through
``/.agentrl/ctl`` (a host directory bound read-only: the FIFOs and each request's
``env.sh``, ``user`` and, for a command too long for an argument, ``cmd.sh``, laid out by
the host) and ``/.agentrl/out`` (the one writable area: ``ID.out``, ``ID.err``,
``ID.pgid``, ``ID.rc``, ``ID.kill``, ``ready`` and read_file's ``NAME.xfer``), so the
sandbox needs nothing but ``sh`` (``socat`` when services are bound, ``unshare`` from
util-linux for ``user="root"``). When ``init.sh`` exits the whole sandbox goes with it.

An exec costs the sandbox two processes: ``init.sh`` forks a supervisor (a function of
its own, no exec), which forks the command; the command sources its ``env.sh`` and execs
``setsid`` (a session and process group of its own, so a kill spares the supervisor),
``unshare --map-root-user`` for root, then ``bash -c CMD`` (``sh`` without bash), which
itself execs a lone simple command. Programs are resolved once, at start (the root is
read-only), and no file is written by rename: the host takes ``ID.rc`` only whole (a
newline ends it) and the exit code also rides on the done line.

Lines on the request FIFO can also be written by a process in the sandbox (a FIFO on a
read-only mount is still writable); they can only run requests the host laid out in
``ctl/req`` or kill the sandbox's own commands, so that stays in the sandbox's own trust
domain. ``init.sh`` ignores an id that is not lower-case hex.
"""

from __future__ import annotations

CTL = "/.agentrl/ctl"
OUT = "/.agentrl/out"
BIN = "/.agentrl/bin"
SERVICES = "/.agentrl/services"

#: Kill a command by its leader's pid, then its process group: the leader may not have
#: called setsid yet (then there is no group, but it has no children either).
_KILLGROUP = r"""
killgroup() { kill -KILL "$1" 2>/dev/null; kill -KILL "-$1" 2>/dev/null; }
"""

INIT_SH = (
    _KILLGROUP
    + r"""
C=/.agentrl/ctl O=/.agentrl/out
fail() { printf '%s\n' "$*" >&2; printf '%s\n' "$*" > "$O/ready.tmp"; mv "$O/ready.tmp" "$O/ready"; echo ready > "$C/done"; exit 1; }
for t in setsid mv; do
  command -v $t >/dev/null 2>&1 || fail "error: the sandbox root has no '$t'; the local sandbox needs sh, setsid and mv (util-linux, coreutils) in the image"
done
# Resolved once (the root is read-only): an exec then runs no PATH search of its own.
setsid=$(command -v setsid) unshare=$(command -v unshare) shell=$(command -v bash || command -v sh)
for p in $AGENTRL_SERVICE_PORTS; do
  command -v socat >/dev/null 2>&1 || fail "error: socat is not installed in the sandbox root; it relays 127.0.0.1:$p to the host service"
  socat "TCP-LISTEN:$p,bind=127.0.0.1,reuseaddr,fork" "UNIX-CONNECT:/.agentrl/services/$p.sock" &
done
# Whether 127.0.0.1:$1 (hex) listens, read from /proc/net/tcp with builtins only.
listening() {
  while read -r _ local remote state _; do
    [ "$local $remote $state" = "0100007F:$1 00000000:0000 0A" ] && return 0
  done < /proc/net/tcp
  return 1
}
for p in $AGENTRL_SERVICE_PORTS; do
  hex=$(printf '%04X' "$p"); i=0
  until listening "$hex"; do
    i=$((i+1)); [ $i -gt 500 ] && fail "error: the relay for port $p did not start"
    sleep 0.01
  done
done
unset AGENTRL_SERVICE_PORTS
# run ID: supervise one request (this shell's child, no exec): start its command in a
# session of its own, record its pgid, wait, and report the exit code (the code rides on
# the done line too: a full output area cannot lose it). The command is this process's
# own child, which sources the request's env.sh (its environment, workdir and, in "$@",
# what the shell runs) and execs setsid (then unshare for root) then the shell itself.
run() {
  r=$1 d=$C/req/$1 o=$O/$1 user= wrap= p=
  # Only when this shell cannot fork the command (the sandbox's process limit).
  trap 'echo "agentrl: could not start the command: the sandbox process limit is reached" > "$o.err"; echo 126 > "$o.rc"; echo "$r 126" > "$C/done"' EXIT
  read -r user < "$d/user"
  if [ "$user" = root ]; then
    if [ -z "$unshare" ]; then
      trap - EXIT
      echo "agentrl: user='root' needs unshare (util-linux) in the sandbox root" > "$o.err"
      echo 126 > "$o.rc"; echo "$r 126" > "$C/done"; return
    fi
    wrap="$unshare --map-root-user --"
  fi
  (
    trap - EXIT
    . "$d/env.sh" || exit 126
    w=$AGENTRL_WORKDIR
    unset AGENTRL_WORKDIR
    if [ $# -eq 0 ]; then set -- "$d/cmd.sh"; else set -- -c "$1" "${shell##*/}"; fi
    cd "$w" 2>/dev/null && exec "$setsid" $wrap "$shell" "$@"
    [ -n "$wrap" ] || { cd "$w"; exit 1; }
    # Root may enter what the agent's uid may not: it changes directory once unshared.
    exec "$setsid" $wrap "$shell" -c 'cd "$1" || exit 1; shift; exec "$@"' sh "$w" "$shell" "$@"
  ) < /dev/null > "$o.out" 2> "$o.err" &
  p=$!
  trap - EXIT
  # Written in place, not by rename (no process): a FIFO the command put there is skipped
  # rather than blocked on; the host reads ID.rc only whole, and the done line has the code.
  [ -p "$o.pgid" ] || echo "$p" > "$o.pgid"
  # A kill that came before the pgid was recorded found nothing to kill but left a marker.
  [ -e "$o.kill" ] && killgroup "$p"
  wait "$p"
  rc=$?
  [ -p "$o.rc" ] || echo "$rc" > "$o.rc"
  echo "$r $rc" > "$C/done"
}
exec 3<> "$C/queue"
echo ready > "$O/ready.tmp" && mv "$O/ready.tmp" "$O/ready"
echo ready > "$C/done"
while IFS= read -r line <&3; do
  case "$line" in
    run\ *) id=${line#run }
      case $id in ''|*[!0-9a-f]*) continue ;; esac
      run "$id" < /dev/null > /dev/null 2>&1 3<&- &
      # Forget finished supervisors (a shell keeps a record of every background job).
      jobs > /dev/null 2>&1 ;;
    # `true`, not `:`: a failed redirection of a special builtin would end this shell.
    kill\ *) id=${line#kill }
      case $id in ''|*[!0-9a-f]*) continue ;; esac
      true 2>/dev/null > "$O/$id.kill"
      g=; read -r g < "$O/$id.pgid" 2>/dev/null; [ -n "$g" ] && killgroup "$g" ;;
    exit) exit 0 ;;
  esac
done
"""
)
