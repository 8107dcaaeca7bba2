"""The POSIX sh programs that run inside a ``local`` sandbox.

``init.sh`` is the sandbox's long-lived main process: it starts one socat relay per
service (127.0.0.1:PORT -> the bound unix socket), reports ready, then reads requests from
a FIFO and starts each exec detached (``run.sh``) in its own session. The host side talks
to it only through ``/.agentrl/ctl`` (a host directory bound read-only: the FIFOs and
each request's ``cmd.sh``, ``env.sh`` and ``user``, laid out by the host) and
``/.agentrl/out`` (the one writable area: ``ID.out``, ``ID.err``, ``ID.pgid``, ``ID.rc``,
``ID.kill``, ``ready`` and read_file's ``NAME.xfer``), so the sandbox needs nothing but
``sh`` (``socat`` when services are bound, ``unshare`` from util-linux for
``user="root"``). When ``init.sh`` exits the whole sandbox goes with it.

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
for p in $AGENTRL_SERVICE_PORTS; do
  command -v socat >/dev/null 2>&1 || fail "error: socat is not installed in the sandbox root; it relays 127.0.0.1:$p to the host service"
  socat "TCP-LISTEN:$p,bind=127.0.0.1,reuseaddr,fork" "UNIX-CONNECT:/.agentrl/services/$p.sock" &
done
for p in $AGENTRL_SERVICE_PORTS; do
  hex=$(printf '%04X' "$p"); i=0
  until grep -q "^ *[0-9]*: 0100007F:$hex 00000000:0000 0A" /proc/net/tcp; do
    i=$((i+1)); [ $i -gt 500 ] && fail "error: the relay for port $p did not start"
    sleep 0.01
  done
done
unset AGENTRL_SERVICE_PORTS
exec 3<> "$C/queue"
echo ready > "$O/ready.tmp" && mv "$O/ready.tmp" "$O/ready"
echo ready > "$C/done"
while IFS= read -r line <&3; do
  case "$line" in
    run\ *) id=${line#run }
      case $id in ''|*[!0-9a-f]*) continue ;; esac
      ( setsid sh /.agentrl/bin/run.sh "$id" < /dev/null > /dev/null 2>&1 3<&- & ) 2>/dev/null || {
        echo "agentrl: could not start the command: the sandbox's process limit is reached" 2>/dev/null > "$O/$id.err"
        echo 126 2>/dev/null > "$O/$id.rc"; echo "$id" > "$C/done"; } ;;
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

RUN_SH = (
    _KILLGROUP
    + r"""
d=/.agentrl/ctl/req/$1 o=/.agentrl/out/$1
read -r user < "$d/user"
if command -v bash >/dev/null 2>&1; then shell=bash; else shell=sh; fi
inner='. "$1/env.sh" || exit 126; cd "$AGENTRL_WORKDIR" || exit 1; unset AGENTRL_WORKDIR; exec "$2" "$1/cmd.sh"'
wrap=
if [ "$user" = root ]; then
  if command -v unshare >/dev/null 2>&1; then wrap="unshare --map-root-user --"
  else echo "agentrl: user='root' needs unshare (util-linux) in the sandbox root" > "$o.err"
       echo 126 > "$o.rc"; echo "$1" > /.agentrl/ctl/done; exit 0; fi
fi
# The command gets a session (and process group) of its own: killing it spares this script,
# which still writes the exit code.
setsid $wrap sh -c "$inner" sh "$d" "$shell" < /dev/null > "$o.out" 2> "$o.err" &
echo $! > "$o.pgid.tmp" && mv "$o.pgid.tmp" "$o.pgid"
# A kill that came before the pgid was recorded found nothing to kill but left a marker.
[ -e "$o.kill" ] && killgroup $!
wait $!
rc=$?
echo $rc > "$o.rc.tmp" && mv "$o.rc.tmp" "$o.rc"
# The exit code rides on the notification too: a full output area cannot lose it.
echo "$1 $rc" > /.agentrl/ctl/done
"""
)
