#!/bin/sh
# opsctl-node ACTION NODE: start, stop or report one opsctl-managed node (installed by playbooks/deploy.yml).
# Settings come from the root-owned nodes/NODE.env beside this script's bin/ directory. Prints one word first:
# started|running|stopped|absent, then the pid. Where systemd runs and the node has a unit, systemd does the work.
set -eu
action=${1:?action}
node=${2:?node}
root=$(dirname "$(dirname "$(readlink -f "$0")")")
env_file="$root/nodes/$node.env"
[ -f "$env_file" ] || { echo "absent"; exit 0; }
# shellcheck disable=SC1090
. "$env_file"

pid_of() { [ -s "$OPSCTL_PID" ] && cat "$OPSCTL_PID" || true; }
# A zombie (exited, not yet reaped by its parent or init) counts as dead: kill -0 still succeeds on it.
zombie() { [ "$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)" = Z ]; }
running() { kill -0 "$1" 2>/dev/null && ! zombie "$1"; }
alive() { p=$(pid_of); [ -n "$p" ] && running "$p"; }
listening() { ss -Hltn "sport = :$OPSCTL_PORT" 2>/dev/null | grep -q .; }
use_systemd() { [ -d /run/systemd/system ] && [ -f "/etc/systemd/system/$OPSCTL_UNIT.service" ]; }

wait_until() {
  i=0
  while ! "$@"; do
    i=$((i + 1))
    if [ "$i" -gt 600 ]; then return 1; fi
    sleep 0.05
  done
}

start() {
  if alive; then echo "running $(pid_of)"; return 0; fi
  rm -f "$OPSCTL_PID"
  if use_systemd; then
    systemctl start "$OPSCTL_UNIT"
  else
    cd "$OPSCTL_DIR"
    # shellcheck disable=SC2086
    setpriv --reuid="$OPSCTL_USER" --regid="$OPSCTL_USER" --init-groups --inh-caps=-all \
      "$OPSCTL_BIN" "$OPSCTL_CONF" $OPSCTL_ARGS </dev/null >/dev/null 2>&1
  fi
  if ! wait_until alive || ! wait_until listening; then
    echo "failed: $node did not start listening on port $OPSCTL_PORT; last log lines:"
    tail -n 15 "$OPSCTL_LOG" 2>/dev/null || true
    exit 1
  fi
  echo "started $(pid_of)"
}

stop() {
  if ! alive; then echo "stopped"; return 0; fi
  p=$(pid_of)
  if use_systemd; then systemctl stop "$OPSCTL_UNIT"; else kill -TERM "$p"; fi
  if ! wait_until not_alive; then kill -KILL "$p" 2>/dev/null || true; fi
  echo "stopped $p"
}

not_alive() { ! running "$p"; }

case "$action" in
  start) start ;;
  stop) stop ;;
  status) if alive; then echo "running $(pid_of)"; else echo "stopped"; fi ;;
  *) echo "usage: opsctl-node start|stop|status NODE" >&2; exit 2 ;;
esac
