"""The host settings a deploy writes beside the nodes (pure): the kernel settings the Redis documentation asks for
and log rotation, one file of each per spec under /etc (the spec's last node purged removes them). The installer
applies the kernel settings at once and reports what a host refuses (docs/remote.md, "Host settings")."""

from __future__ import annotations

from opsctl.providers.remote.inventory import remote_root, service_user
from opsctl.spec.model import Spec

DEFAULT_TCP_BACKLOG = 511  # what opsctl renders (render.directives.network) unless the spec's config says otherwise
THP_FILES = ("/sys/kernel/mm/transparent_hugepage/enabled", "/sys/kernel/mm/transparent_hugepage/defrag")


def sysctl_path(spec: Spec) -> str:
    return f"/etc/sysctl.d/60-opsctl-{spec.name}.conf"


def tmpfiles_path(spec: Spec) -> str:
    return f"/etc/tmpfiles.d/opsctl-{spec.name}-thp.conf"


def logrotate_path(spec: Spec) -> str:
    return f"/etc/logrotate.d/opsctl-{spec.name}"


def host_setting_paths(spec: Spec) -> tuple[str, str, str]:
    return sysctl_path(spec), tmpfiles_path(spec), logrotate_path(spec)


def tcp_backlog(spec: Spec) -> int:
    """The largest tcp-backlog a node of the spec listens with: net.core.somaxconn caps it silently."""
    values = [spec.config.get("tcp-backlog"), *(o.config.get("tcp-backlog") for o in spec.nodes.values())]
    return max([DEFAULT_TCP_BACKLOG, *(int(v) for v in values if v is not None and str(v).isdigit())])


def sysctl_text(spec: Spec) -> str:
    """overcommit 1: a fork for BGSAVE/AOF rewrite must not fail for want of memory it will not touch;
    somaxconn >= tcp-backlog: else the kernel truncates the servers' listen backlog."""
    return (f"# Written by opsctl deploy for spec {spec.name}: what the Redis documentation asks of a host.\n"
            f"vm.overcommit_memory = 1\nnet.core.somaxconn = {max(tcp_backlog(spec), 1024)}\n")


def tmpfiles_text(spec: Spec) -> str:
    """Transparent huge pages off at every boot (systemd-tmpfiles): they stall forks and raise latency."""
    lines = [f"# Written by opsctl deploy for spec {spec.name}: transparent huge pages off (Redis latency, forks)."]
    return "\n".join([*lines, *(f"w {path} - - - - never" for path in THP_FILES)]) + "\n"


def logrotate_text(spec: Spec) -> str:
    """copytruncate: the servers keep their log file open and reopen it on no signal."""
    user = service_user(spec)
    return (f"# Written by opsctl deploy for spec {spec.name}: the servers' logs, rotated in place.\n"
            f"{remote_root(spec)}/*/server.log {{\n    su {user} {user}\n    daily\n    maxsize 100M\n    rotate 7\n"
            "    missingok\n    notifempty\n    compress\n    delaycompress\n    copytruncate\n}\n")
