"""What deploy.yml writes under a spec's root on a host, as tar archives: one per host (folders, the control
script, a given server binary) and one per node (its folder, settings and files). Pure: data in, bytes out.

One unarchive per archive replaces a module run per folder and per file over SSH. Owner, group and mode of
every member are in the archive and every mtime is fixed, so unarchive's compare (tar --diff) finds nothing
to change when nothing changed: a second deploy reports no change. Owners are names (the host maps them to its
ids). sentinel.conf is never bundled: Sentinel rewrites it, and deploy.yml writes it only when missing.
"""

from __future__ import annotations

import io
import shlex
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from opsctl.errors import OpsctlError
from opsctl.remote.inventory import binary_path, node_vars, remote_root, service_user
from opsctl.spec.layout import Node
from opsctl.spec.model import Spec

WRITTEN_ONCE = frozenset({"sentinel.conf"})
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


def host_members(spec: Spec, script: bytes, binary: bytes | None) -> list[Member]:
    """The spec's root and its shared folders, the control script, and the server binary when one is given."""
    root, user = remote_root(spec), service_user(spec)
    members = [Member(root.rsplit("/", 1)[0], "root", "root", 0o755), Member(root, "root", user, 0o750),
               Member(f"{root}/bin", "root", user, 0o750), Member(f"{root}/nodes", "root", "root", 0o700),
               Member(f"{root}/bin/opsctl-node", "root", "root", 0o700, script)]
    if binary is not None:
        members.append(Member(binary_path(spec), "root", user, 0o750, binary))
    return members


def node_members(spec: Spec, node: Node, files: Mapping[str, str]) -> list[Member]:
    """The node's folder, its settings and its files (all but those written once)."""
    folder, user = node_vars(spec, node)["dir"], service_user(spec)
    settings = settings_text(spec, node).encode()
    members = [Member(folder, user, user, 0o700),
               Member(f"{remote_root(spec)}/nodes/{node.name}.env", "root", "root", 0o600, settings)]
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


def host_archives(spec: Spec, nodes: Sequence[Node], files: Mapping[str, Mapping[str, str]], script: bytes,
                  binary: bytes | None) -> dict[str, bytes]:
    """Archive name -> bytes. `host-<host>.tar`: everything for that host's nodes, one unarchive per host;
    for a run narrowed to some nodes (opsctl_only): `base-<host>.tar` (no node) and `node-<node>.tar`."""
    base = host_members(spec, script, binary)
    of_node = {n.name: node_members(spec, n, files.get(n.name, {})) for n in nodes}
    out: dict[str, bytes] = {}
    for host in sorted({n.host for n in nodes}):
        out[f"host-{host}.tar"] = archive([*base, *(m for n in nodes if n.host == host for m in of_node[n.name])])
        out[f"base-{host}.tar"] = archive(base)
    return out | {f"node-{name}.tar": archive(members) for name, members in of_node.items()}
