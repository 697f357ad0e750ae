"""What deploy.yml installs on a host: one self-extracting shell script per host (playbooks/files/opsctl-install.sh plus
tar archives `base`, `node-<node>`, and `once-<node>` for files written only when missing). Pure: data in, bytes out.

Every member's owner, group, mode and a fixed mtime are in the archive, so tar --diff finds nothing when nothing
changed: a second deploy reports no change.

The host settings a deploy writes beside the nodes (pure): the kernel settings the Redis documentation asks for
and log rotation, one file of each per spec under /etc (the spec's last node purged removes them). The installer
applies the kernel settings at once and reports what a host refuses (docs/remote.md, "Host settings").

Stage what deploy.yml ships from the control machine: one installer per host (opsctl/providers/remote/bundle.py).
I/O: reads the install and control scripts and a given server binary."""

from __future__ import annotations

import io
import json
import os
import shlex
import stat
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from opsctl import data_dir
from opsctl.base.errors import OpsctlError
from opsctl.base.record import DataMismatch, read_fields
from opsctl.providers.remote.inventory import binary_path, node_vars, remote_root, service_user, settings_path
from opsctl.spec.deployed import DeployedAs, NodeRecord
from opsctl.spec.layout import Node, deployed_record
from opsctl.spec.load import LoadedSpec
from opsctl.spec.model import Host, Spec
from opsctl.state.safefs import write_private

WRITTEN_ONCE = frozenset({"sentinel.conf"})
HOSTS_FILE = "hosts.json"  # in the spec's root on each host: the hosts table (hosts_table)
HOST_KEYS = ("name", "address", "ssh_user", "ssh_key", "ssh_port", "bastion", "admin_via_ssh")
FIXED_MTIME = 0


def plain_name(name: str) -> str:
    """A node file's name, refused unless it is a plain name (it becomes a path on the host)."""
    if not name or "/" in name or name.startswith("."):
        raise OpsctlError(f"refusing file name {name!r}", hint="node files are plain names such as redis.conf")
    return name


@dataclass(frozen=True)
class Member:
    """One file (data) or folder (data None) at an absolute path on the host."""

    path: str
    owner: str
    group: str
    mode: int
    data: bytes | None = None


def settings_text(spec: Spec, node: Node) -> str:
    """nodes/<node>.env, sourced by bin/opsctl-node (as root: root-owned, never the service user's)."""
    values = node_vars(spec, node)
    lines = [f"# Written by opsctl deploy: settings of node {node.name} for bin/opsctl-node. No secrets here.",
             f"OPSCTL_UNIT={shlex.quote(values['unit'])}", f"OPSCTL_DIR={shlex.quote(values['dir'])}",
             f"OPSCTL_BIN={shlex.quote(binary_path(spec))}", f"OPSCTL_CONF={shlex.quote(values['conf'])}",
             f"OPSCTL_ARGS={shlex.quote('--sentinel' if node.is_sentinel else '')}",
             f"OPSCTL_PID={shlex.quote(values['pid'])}", f"OPSCTL_LOG={shlex.quote(values['log'])}",
             f"OPSCTL_PORT={shlex.quote(str(values['port']))}", f"OPSCTL_USER={shlex.quote(service_user(spec))}"]
    return "\n".join(lines) + "\n"


def host_members(spec: Spec, script: bytes, binary: bytes | None, hosts: bytes | None = None) -> list[Member]:
    """The spec's root and its shared folders, the control script, the server binary when one is given, and the
    hosts table (HOSTS_FILE) when given."""
    root, user = remote_root(spec), service_user(spec)
    members = [Member(root.rsplit("/", 1)[0], "root", "root", 0o755), Member(root, "root", user, 0o750),
               Member(f"{root}/bin", "root", user, 0o750), Member(f"{root}/nodes", "root", "root", 0o700),
               Member(f"{root}/bin/opsctl-node", "root", "root", 0o700, script)]
    if binary is not None:
        members.append(Member(binary_path(spec), "root", user, 0o750, binary))
    if hosts is not None:
        members.append(Member(f"{root}/{HOSTS_FILE}", "root", "root", 0o600, hosts))
    return members


def hosts_table(hosts: Sequence[Host], tombstones: Mapping[str, Mapping[str, object]] | None = None) -> bytes:
    """HOSTS_FILE: how to reach each host that holds the spec's nodes (name, address and SSH settings; no secret:
    ssh_key is a path on the control machine). A host later removed from the spec is found through it, to drain.
    tombstones: retired nodes' placements (name -> their record's `deployed`), carried on every host the deploy
    touches, so a run with a fresh state dir never gives a retired name again once the host that held its
    tombstone is gone from the spec (docs/changing-the-fleet.md). Without any, the table is the plain list."""
    entries = [{key: h.model_dump()[key] for key in HOST_KEYS} for h in hosts]
    data: object = entries if not tombstones else {
        "hosts": entries, "retired": {name: dict(placed) for name, placed in sorted(tombstones.items())}}
    return (json.dumps(data, indent=1, sort_keys=isinstance(data, dict)) + "\n").encode()


def parse_hosts_table(text: str | None) -> list[Host]:
    """The hosts HOSTS_FILE names; [] for none or an unreadable file (it is a hint for finding hosts, not state)."""
    try:
        data = json.loads(text or "[]")
        entries = data.get("hosts", []) if isinstance(data, dict) else data
        return [Host(**{key: entry[key] for key in HOST_KEYS}) for entry in entries] if isinstance(entries, list) \
            else []
    except (ValueError, TypeError, KeyError, AttributeError, OpsctlError):
        return []


def parse_tombstones(text: str | None) -> dict[str, NodeRecord]:
    """The retired nodes' placements HOSTS_FILE carries, as tombstone records (retired, deployed); {} for none or
    an unreadable file, and a placement that is not one is left out."""
    try:
        data = json.loads(text or "[]")
    except ValueError:
        return {}
    retired = data.get("retired") if isinstance(data, dict) else None
    if not isinstance(retired, dict):
        return {}
    found = {}
    for name, placed in retired.items():
        try:
            found[str(name)] = NodeRecord(retired=True, deployed=read_fields(DeployedAs, placed))
        except DataMismatch:
            continue
    return found


def setting_members(spec: Spec) -> list[Member]:
    """The host's settings for the spec under /etc (root's, world-readable as those folders expect)."""
    return [Member(path, "root", "root", 0o644, text.encode()) for path, text in (
        (sysctl_path(spec), sysctl_text(spec)), (tmpfiles_path(spec), tmpfiles_text(spec)),
        (logrotate_path(spec), logrotate_text(spec)))]


def node_members(spec: Spec, node: Node, files: Mapping[str, str], retired: bool = False) -> list[Member]:
    """The node's folder, its settings (none for a retired node: nothing starts it) and its files (all but those
    written once)."""
    folder, user = node_vars(spec, node)["dir"], service_user(spec)
    members = [Member(folder, user, user, 0o700)]
    if not retired:
        members.append(Member(settings_path(spec, node), "root", "root", 0o600, settings_text(spec, node).encode()))
    members += [Member(f"{folder}/{plain_name(name)}", user, user, 0o600, text.encode())
                for name, text in sorted(files.items()) if name not in WRITTEN_ONCE]
    return members


def archive(members: Sequence[Member]) -> bytes:
    """An uncompressed tar of members, paths relative to / (unarchive with dest: /), byte for byte the same
    for the same members."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for member in members:
            info = tarfile.TarInfo(member.path.lstrip("/"))
            info.uname, info.gname, info.uid, info.gid = member.owner, member.group, 0, 0
            info.mode, info.mtime = member.mode, FIXED_MTIME
            if member.data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(member.data)
                tar.addfile(info, io.BytesIO(member.data))
    return out.getvalue()


def once_members(spec: Spec, node: Node, files: Mapping[str, str]) -> list[Member]:
    """The node's files written only when the host has none (sentinel.conf)."""
    folder, user = node_vars(spec, node)["dir"], service_user(spec)
    return [Member(f"{folder}/{plain_name(name)}", user, user, 0o600, text.encode())
            for name, text in sorted(files.items()) if name in WRITTEN_ONCE]


def host_parts(spec: Spec, nodes: Sequence[Node], files: Mapping[str, Mapping[str, str]], script: bytes,
               binary: bytes | None, hosts: bytes | None = None,
               retired: frozenset[str] = frozenset()) -> list[tuple[str, bytes]]:
    """The archives of one host's installer, in order: `base` (with the host's settings under /etc), then
    `node-<node>` and `once-<node>` per node (a `once-` archive only where the node has such a file)."""
    parts = [("base", archive([*host_members(spec, script, binary, hosts), *setting_members(spec)]))]
    for node in nodes:
        named = files.get(node.name, {})
        parts.append((f"node-{node.name}", archive(node_members(spec, node, named, node.name in retired))))
        once = once_members(spec, node, named)
        if once:
            parts.append((f"once-{node.name}", archive(once)))
    return parts


def installer(body: str, user: str, root: str, parts: Sequence[tuple[str, bytes]]) -> bytes:
    """opsctl-install.sh (body) with its placeholders filled and the archives appended after its `exit`."""
    table: list[str] = []
    at = 0
    for name, data in parts:
        table.append(f"{name} {at} {len(data)}")
        at += len(data)
    filled = {"@USER@": shlex.quote(user), "@ROOT@": shlex.quote(root), "@PARTS@": shlex.quote("\n".join(table)),
              "@PAYLOAD_BYTES@": str(at)}
    text = body
    for placeholder, value in filled.items():
        if text.count(placeholder) != 1:
            raise ValueError(f"the installer script must hold {placeholder} once")
        text = text.replace(placeholder, value)
    if not text.endswith("exit 0\n"):
        raise ValueError("the installer script must end with `exit 0`: the archives follow it")
    return text.encode() + b"".join(data for _name, data in parts)


def host_installers(spec: Spec, nodes: Sequence[Node], files: Mapping[str, Mapping[str, str]], body: str,
                    script: bytes, binary: bytes | None, hosts: bytes | None = None,
                    retired: frozenset[str] = frozenset()) -> dict[str, bytes]:
    """`install-<host>.sh` -> the installer for that host's nodes among `nodes` (byte for byte the same for the
    same input); hosts: the hosts table every base archive carries; retired: nodes that get their record only."""
    names = sorted({n.host for n in nodes})
    return {f"install-{host}.sh": installer(body, service_user(spec), remote_root(spec), host_parts(
        spec, [n for n in nodes if n.host == host], files, script, binary, hosts, retired)) for host in names}


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


FileMap = Mapping[str, Mapping[str, str]]


BINARY_LIMIT = 512 << 20  # a server binary is tens of MB; /dev/zero or a FIFO must not be read forever


def read_binary(path: str) -> bytes:
    """The server binary to ship: a regular file (a link to one is fine) of at most BINARY_LIMIT bytes."""
    fix = "set server.binary to the server's executable file on this machine"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO must not block the open
    except OSError as exc:
        raise OpsctlError(f"cannot read the server binary {path}", str(exc.strerror), fix) from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OpsctlError(f"the server binary {path} is not a regular file", hint=fix)
        if info.st_size > BINARY_LIMIT:
            raise OpsctlError(f"the server binary {path} is too big ({info.st_size} bytes, at most {BINARY_LIMIT})",
                              hint=fix)
        return handle.read(BINARY_LIMIT + 1)[:BINARY_LIMIT]


def stage(loaded: LoadedSpec, files_dir: Path, files: FileMap, hosts: Sequence[Host] = (),
          tombstones: Mapping[str, Mapping[str, object]] | None = None) -> None:
    """Write the installers for these nodes (node name -> file name -> text; retired nodes' tombstones too) under
    files_dir, 0600; hosts: the hosts table their base archives carry (none without), with the tombstones known
    (name -> placement) and those of the nodes this run retires."""
    spec = loaded.spec
    nodes = [n for n in [*loaded.layout.nodes, *loaded.layout.retired] if n.name in files]
    scripts = data_dir("playbooks") / "files"
    body = (scripts / "opsctl-install.sh").read_text()
    control = (scripts / "opsctl-node.sh").read_bytes()
    binary = read_binary(loaded.server_binary) if loaded.server_binary else None
    retiring = {n.name: deployed_record(n) for n in loaded.layout.retired}
    table = hosts_table(hosts, {**(tombstones or {}), **retiring}) if hosts else None
    retired = frozenset(n.name for n in loaded.layout.retired)
    for name, data in host_installers(spec, nodes, files, body, control, binary, table, retired).items():
        write_private(files_dir / name, data)
