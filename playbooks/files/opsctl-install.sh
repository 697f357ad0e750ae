#!/bin/sh
# opsctl-install start|nostart|check all|only [NODE...]: what deploy.yml installs on one host, in one script run (no
# Python on the host): the service user and group when missing (an existing user, e.g. the OS package's redis, is used as it
# is: usermod fails while it runs a server), then the tar archives opsctl appended to this script
# (opsctl/providers/remote/bundle.py). `base`: the spec's folders, bin/opsctl-node and a given server binary; `node-NODE`:
# the node's folder, settings and files; `once-NODE`: files written only when missing (sentinel.conf: Sentinel
# rewrites it). `base` also holds the spec's host settings under /etc (sysctl.d, tmpfiles.d, logrotate.d), whose
# kernel settings the script then applies, reporting `not tuned: WHAT` for any the host refuses. An archive is
# extracted only where GNU tar's compare finds a difference (mode, owner, size,
# content, a missing file), so a second run changes nothing. `only` narrows the run to the named nodes (names of
# other hosts' nodes are ignored; none: the base archive alone). Prints `changed: WHAT` per change, then
# `init: systemd|other`, never a file's content (the archives hold passwords). With `start`, where systemd does
# not run, the script then starts its nodes (bin/opsctl-node start: `started PID` or `running PID` each), so a
# deploy needs one SSH task per host. With `check` it changes nothing and prints `would change: WHAT` per change,
# with tar's lines naming each differing file below it (Ansible's --check). OPSCTL_INSTALL_ROOT (default /) is for
# tests.
set -eu
OPSCTL_USER=@USER@
OPSCTL_ROOT=@ROOT@
PARTS=@PARTS@
PAYLOAD_BYTES=@PAYLOAD_BYTES@

dest=${OPSCTL_INSTALL_ROOT:-/}
payload_start=$(($(wc -c <"$0") - PAYLOAD_BYTES))

# part NAME: the bytes of one archive on stdout (empty when this host has no such archive)
part() {
  printf '%s\n' "$PARTS" | while read -r name offset size; do
    if [ "$name" = "$1" ]; then tail -c "+$((payload_start + offset + 1))" "$0" | head -c "$size"; fi
  done
}

has_part() { printf '%s\n' "$PARTS" | grep -q "^$1 "; }

# install NAME: extract the archive where the host differs from it (mode, owner, size, content, missing file); in
# check mode name the archive and tar's lines about its differing members (paths and reasons, never content)
install() {
  if [ "$start" = check ]; then
    if ! differs=$(part "$1" | LC_ALL=C tar --diff -C "$dest" -f - 2>&1); then
      echo "would change: $1"
      printf '%s\n' "$differs" | sed 's/^tar: //; s/^/  /'
    fi
  elif ! part "$1" | tar --diff -C "$dest" -f - >/dev/null 2>&1; then
    part "$1" | tar --extract --same-owner --same-permissions -C "$dest" -f -
    echo "changed: $1"
  fi
}

# install_once NAME: extract the archive when one of its files is missing on the host (a dangling link counts as
# missing: tar replaces the link, never follows it)
install_once() {
  missing=""
  for path in $(part "$1" | tar --list -f -); do  # paths of plain names: no spaces
    if [ ! -e "$dest/$path" ]; then missing=yes; fi
  done
  if [ -n "$missing" ] && [ "$start" = check ]; then
    echo "would change: $1"
  elif [ -n "$missing" ]; then
    part "$1" | tar --extract --same-owner --same-permissions -C "$dest" -f -
    echo "changed: $1"
  fi
}

usage() { echo "usage: $0 start|nostart|check all|only [NODE...]" >&2; exit 2; }
case "${1:-}" in
  start | nostart | check) start=$1; shift ;;
  *) usage ;;
esac
case "${1:-}" in
  all) # shellcheck disable=SC2046 # node names are [a-z0-9-]
    set -- $(printf '%s\n' "$PARTS" | sed -n 's/^node-\([^ ]*\) .*/\1/p') ;;
  only) shift ;;
  *) usage ;;
esac

if ! getent group "$OPSCTL_USER" >/dev/null && [ "$start" = check ]; then
  echo "would change: group $OPSCTL_USER"
elif ! getent group "$OPSCTL_USER" >/dev/null; then
  groupadd --system "$OPSCTL_USER"
  echo "changed: group $OPSCTL_USER"
fi
if ! getent passwd "$OPSCTL_USER" >/dev/null && [ "$start" = check ]; then
  echo "would change: user $OPSCTL_USER"
elif ! getent passwd "$OPSCTL_USER" >/dev/null; then
  useradd --system --gid "$OPSCTL_USER" --shell /usr/sbin/nologin --home-dir /nonexistent --no-create-home \
    "$OPSCTL_USER"
  echo "changed: user $OPSCTL_USER"
fi

# tune_sysctl KEY WANTED eq|min: the kernel setting now (the sysctl.d file keeps it across reboots). A setting the
# host does not let root change (a container, a read-only /proc/sys) is reported, never fatal.
tune_sysctl() {
  file=/proc/sys/$(printf '%s' "$1" | tr . /)
  now=$(cat "$file" 2>/dev/null) || { echo "not tuned: $1 (not on this host)"; return 0; }
  if [ "$now" = "$2" ] || { [ "$3" = min ] && [ "$now" -ge "$2" ]; }; then return 0; fi
  if [ "$start" = check ] && [ -w "$file" ]; then
    echo "would change: $1 $now -> $2"
  elif [ "$start" != check ] && (printf '%s\n' "$2" >"$file") 2>/dev/null; then
    echo "changed: $1 $now -> $2"
  else
    echo "not tuned: $1 (now $now, wanted $2: the host refuses it)"
  fi
}

# tune_thp FILE: transparent huge pages off now (the tmpfiles.d file keeps them off across reboots)
tune_thp() {
  now=$(cat "$1" 2>/dev/null) || return 0
  case $now in *"[never]"*) return 0 ;; esac
  if [ "$start" = check ] && [ -w "$1" ]; then
    echo "would change: $1 -> never"
  elif [ "$start" != check ] && (echo never >"$1") 2>/dev/null; then
    echo "changed: $1 -> never"
  else
    echo "not tuned: $1 (now $now, wanted never: the host refuses it)"
  fi
}

install base
# on the host itself only: OPSCTL_INSTALL_ROOT (tests) never touches this machine's kernel
if [ "$dest" = / ]; then
  part base | tar --extract --to-stdout --wildcards -f - 'etc/sysctl.d/*' | while read -r key _eq value; do
    case $key in '' | '#'*) continue ;; net.core.somaxconn) mode=min ;; *) mode=eq ;; esac
    tune_sysctl "$key" "$value" "$mode"
  done
  for thp in /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/defrag; do
    tune_thp "$thp"
  done
fi
mine=""
for node; do
  if has_part "node-$node"; then install "node-$node"; mine="$mine $node"; fi
  if has_part "once-$node"; then install_once "once-$node"; fi
done

# Where systemd runs, the playbook writes the units and starts the nodes after this script.
if [ -d /run/systemd/system ]; then
  echo "init: systemd"
else
  echo "init: other"
  if [ "$start" = start ]; then
    for node in $mine; do "$dest$OPSCTL_ROOT/bin/opsctl-node" start "$node"; done
  fi
fi
exit 0
