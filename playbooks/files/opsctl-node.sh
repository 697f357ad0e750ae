#!/bin/sh
# opsctl-node ACTION NODE: start, stop or report one opsctl-managed node (installed by playbooks/deploy.yml).
# Settings come from the root-owned nodes/NODE.env beside this script's bin/ directory. Prints one word first:
# started|running|stopped|absent|failed, then the pid. Where systemd runs and the node has a unit, systemd does
# the work. A node whose settings say OPSCTL_FOREGROUND=yes (a redis_exporter beside a node) does not daemonize:
# it is started in the background here, and its pidfile written for it.
#
# Exactly one party starts a node: start and stop hold a lock on the node's folder (flock), so the installer,
# restart.yml and opsctl's own start never launch a second server beside the first (it would fail with
# "Address already in use", and its pidfile would hide the first). A pidfile alone proves nothing (pids are
# reused, e.g. after a reboot): the node's server is a live process of the node's binary working in the node's
# folder, named by the pidfile or listening on the node's port. Such a server counts as started, and a pidfile
# that names anything else is never signalled.
set -eu
action=${1:?action}
node=${2:?node}
root=$(dirname "$(dirname "$(readlink -f "$0")")")
env_file="$root/nodes/$node.env"
[ -f "$env_file" ] || { echo "absent"; exit 0; }
# shellcheck disable=SC1090
. "$env_file"

pid_of() { [ -s "$OPSCTL_PID" ] && tr -cd '0-9' <"$OPSCTL_PID" | head -c 10 || true; }
# A zombie (exited, not yet reaped by its parent or init) counts as dead: kill -0 still succeeds on it.
zombie() { [ "$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)" = Z ]; }
running() { kill -0 "$1" 2>/dev/null && ! zombie "$1"; }
# ours PID: the process is this node's server: its binary (replaced on disk by an upgrade counts), in its folder.
ours() {
  running "$1" || return 1
  exe=$(readlink "/proc/$1/exe" 2>/dev/null) || return 1
  [ "${exe% (deleted)}" = "$(readlink -f "$OPSCTL_BIN")" ] &&
    [ "$(readlink "/proc/$1/cwd" 2>/dev/null)" = "$(readlink -f "$OPSCTL_DIR")" ]
}
# the first process listening on the node's port
listener() { ss -Hltnp "sport = :$OPSCTL_PORT" 2>/dev/null | sed -n 's/^[^"]*"[^"]*",pid=\([0-9]*\),.*/\1/p' | head -n 1; }
# server_pid: the node's server (the pidfile's, else the one on its port), empty when none runs
server_pid() {
  p=$(pid_of)
  if [ -n "$p" ] && ours "$p"; then echo "$p"; return 0; fi
  p=$(listener)
  if [ -n "$p" ] && ours "$p"; then echo "$p"; fi
}
listening() { ss -Hltn "sport = :$OPSCTL_PORT" 2>/dev/null | grep -q .; }
use_systemd() { [ -d /run/systemd/system ] && [ -f "/etc/systemd/system/$OPSCTL_UNIT.service" ]; }
as_user() { setpriv --reuid="$OPSCTL_USER" --regid="$OPSCTL_USER" --init-groups --inh-caps=-all "$@"; }

wait_until() {
  i=0
  while ! "$@"; do
    i=$((i + 1))
    if [ "$i" -gt 600 ]; then return 1; fi
    sleep 0.05
  done
}

# One start or stop of this node at a time on this host (the server never inherits the lock: 9<&-).
lock() {
  exec 9<"$OPSCTL_DIR"
  if ! flock -w 120 9; then echo "failed: another start or stop of $node holds its lock for 120 s"; exit 1; fi
}

# up: the server runs and listens; a pidfile naming a dead process (the server wrote it, then exited) ends the wait
up() { p=$(server_pid); [ -n "$p" ] && listening; }
settled() { up || { q=$(pid_of); [ -n "$q" ] && ! running "$q"; }; }

failed_start() {
  echo "failed: $node did not start listening on port $OPSCTL_PORT; last log lines:"
  tail -n 15 "$OPSCTL_LOG" 2>/dev/null || true
  exit 1
}

start() {
  lock
  p=$(server_pid)
  if [ -n "$p" ]; then
    wait_until listening || failed_start  # it may still be loading (a server writes its pidfile before it listens)
    # shellcheck disable=SC2016 # the pidfile names it again, written as the service user (never through a link)
    [ "$(pid_of)" = "$p" ] || as_user sh -c 'printf "%s\n" "$1" >"$2"' sh "$p" "$OPSCTL_PID"
    echo "running $p"
    return 0
  fi
  rm -f "$OPSCTL_PID"
  if use_systemd; then
    systemctl start "$OPSCTL_UNIT"
  elif [ "${OPSCTL_FOREGROUND:-}" = yes ]; then
    cd "$OPSCTL_DIR"
    set -f  # the arguments are words without spaces; an IPv6 [address] must not glob
    # shellcheck disable=SC2016,SC2086 # a process that does not daemonize (a redis_exporter): started in its own
    # session with an empty environment, it writes its pidfile and log as its user; the subshell execs it, so no
    # shell of this script stays behind holding the lock
    (
      exec </dev/null >/dev/null 2>&1 9<&-
      exec setpriv --reuid="$OPSCTL_USER" --regid="$OPSCTL_USER" --init-groups --inh-caps=-all setsid sh -c \
        'umask 077; printf "%s\n" "$$" >"$1"; log=$2; shift 2; exec env -i PATH=/usr/bin:/bin "$@" >>"$log" 2>&1' \
        sh "$OPSCTL_PID" "$OPSCTL_LOG" "$OPSCTL_BIN" $OPSCTL_ARGS
    ) &
    set +f
  else
    cd "$OPSCTL_DIR"
    # shellcheck disable=SC2086
    as_user "$OPSCTL_BIN" "$OPSCTL_CONF" $OPSCTL_ARGS </dev/null >/dev/null 2>&1 9<&-
  fi
  if ! wait_until settled || ! up; then failed_start; fi
  p=$(server_pid)
  # shellcheck disable=SC2016 # a unit's process found on its port: its pidfile names it from now on
  [ "$(pid_of)" = "$p" ] || as_user sh -c 'printf "%s\n" "$1" >"$2"' sh "$p" "$OPSCTL_PID"
  echo "started $p"
}

stop() {
  lock
  p=$(server_pid)
  if [ -z "$p" ]; then echo "stopped"; return 0; fi
  # systemd's stop sends one SIGTERM and waits for TimeoutStopSec: queued here without waiting, the loop below
  # asks again (a server it did not start is never its unit's)
  if use_systemd; then systemctl stop --no-block "$OPSCTL_UNIT" || true; fi
  tries=0
  if ! wait_until terminated; then kill -KILL "$p" 2>/dev/null || true; fi
  echo "stopped $p"
}

# SIGTERM, sent again every second (tries counts the looks, 20 a second): a server drops one it cannot act on yet
# (Redis 7.0 right after a full sync: "Writing initial AOF, can't exit.")
terminated() {
  if ! running "$p"; then return 0; fi
  if [ $((tries % 20)) -eq 0 ]; then kill -TERM "$p" 2>/dev/null || true; fi
  tries=$((tries + 1))
  return 1
}

case "$action" in
  start) start ;;
  stop) stop ;;
  status) p=$(server_pid); if [ -n "$p" ]; then echo "running $p"; else echo "stopped"; fi ;;
  *) echo "usage: opsctl-node start|stop|status NODE" >&2; exit 2 ;;
esac
