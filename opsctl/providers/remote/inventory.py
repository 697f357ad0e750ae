"""The Ansible inventory of a spec (pure): groups per topology and role, host vars for SSH and the nodes.

No secrets in the inventory: the node files (which hold the password) go from opsctl_files_dir as archives
(opsctl/providers/remote/bundle.py) through no_log tasks. The layout on a host: docs/remote.md, "What lands on a
host"."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

import yaml

from opsctl.base.errors import OpsctlError, echo
from opsctl.render import NodePaths
from opsctl.render.directives import TLS_CA_FILE, TLS_CERT_FILE, TLS_KEY_FILE
from opsctl.spec.layout import Node, valid_host, valid_port
from opsctl.spec.load import LoadedSpec
from opsctl.spec.model import Host, Spec

REMOTE_ROOT = "/var/lib/opsctl"
OS_PACKAGES = {"redis": "redis-server", "valkey": "valkey-server"}
REMOTE_PYTHON = "/usr/bin/python3"  # fixed, not discovered: a login shell (pyenv, conda) may shadow it
ROLE_GROUPS = {"master": "masters", "replica": "replicas", "sentinel": "sentinels"}


def remote_root(spec: Spec) -> str:
    return f"{REMOTE_ROOT}/{spec.name}"


def service_user(spec: Spec) -> str:
    return spec.server.service_user


def binary_path(spec: Spec) -> str:
    """Where the server runs from on a host: the shipped binary in bin/, else the OS package's."""
    if spec.server.binary:
        return f"{remote_root(spec)}/bin/{spec.server.flavor}-server"
    return f"/usr/bin/{spec.server.flavor}-server"


def remote_paths(spec: Spec, node: Node) -> NodePaths:
    base = f"{remote_root(spec)}/{node.name}"
    conf = "sentinel.conf" if node.is_sentinel else "redis.conf"
    return NodePaths(dir=base, conf=f"{base}/{conf}", acl=f"{base}/users.acl", log=f"{base}/server.log",
                     pid=f"{base}/server.pid")


def settings_path(spec: Spec, node: Node) -> str:
    """nodes/<node>.env under the spec's root: bin/opsctl-node's settings for the node (there once deployed)."""
    return f"{remote_root(spec)}/nodes/{node.name}.env"


def unit_name(node: Node) -> str:
    return f"opsctl-{node.name}"


def node_file_names(spec: Spec, node: Node) -> list[str]:
    tls = [TLS_CA_FILE, TLS_CERT_FILE, TLS_KEY_FILE] if spec.tls.enabled else []
    if node.is_sentinel:
        return ["sentinel.conf", *tls]
    return [*(["redis.conf", "users.acl"] if spec.auth.mode == "acl" else ["redis.conf"]), *tls]


def node_vars(spec: Spec, node: Node, files: list[str] | None = None) -> dict[str, Any]:
    paths = remote_paths(spec, node)
    return {"name": node.name, "role": node.role, "shard": node.shard, "address": node.address,
            "port": node.port, "unit": unit_name(node), "dir": paths.dir, "conf": paths.conf, "pid": paths.pid,
            "log": paths.log, "files": node_file_names(spec, node) if files is None else files}


def parse_bastion(text: str, user: str) -> tuple[str, str, int]:
    """`[user@]address[:port]` (a bracketed IPv6 address may carry a port) as (user, address, port); a port that is
    not 1..65535 in plain digits, or no address, is refused (never a socket call to another port)."""
    login, _, rest = text.rpartition("@")
    address, port_text = rest, "22"
    if rest.startswith("["):
        address, _, tail = rest[1:].partition("]")
        port_text = tail[1:] if tail.startswith(":") else "22" if not tail else ""
    elif rest.count(":") == 1:
        address, _, port_text = rest.partition(":")
    if not valid_port(port_text) or not address or not valid_host(address):
        raise OpsctlError(f"{echo(text)} is not [user@]address[:port] with a port from 1 to 65535",
                          hint="e.g. ops@jump.example.com:2222, or the name of a host of the spec")
    return login or user, address, int(port_text)


def ssh_options(known_hosts: str, key: str | None) -> list[str]:
    options = ["-o", f"UserKnownHostsFile={known_hosts}", "-o", "StrictHostKeyChecking=yes"]
    return options + (["-o", "IdentitiesOnly=yes"] if key else [])


def proxy_command(spec: Spec, host: Host, known_hosts: str) -> str | None:
    """The ProxyCommand that reaches host through its bastion (a host of the spec or [user@]addr[:port])."""
    if not host.bastion:
        return None
    named = next((h for h in spec.hosts if h.name == host.bastion), None)
    if named is not None:
        login, port, key = f"{named.ssh_user or 'root'}@{named.address}", named.ssh_port, named.ssh_key
    else:
        user, address, port = parse_bastion(host.bastion, host.ssh_user or "root")
        login, key = f"{user}@{address}", host.ssh_key
    argv = ["ssh", *ssh_options(known_hosts, key), *(["-i", key] if key else []), "-p", str(port), "-W",
            "%h:%p", login]
    return shlex.join(argv)


def host_vars(spec: Spec, host: Host, known_hosts: str) -> dict[str, Any]:
    options = ssh_options(known_hosts, host.ssh_key)
    proxy = proxy_command(spec, host, known_hosts)
    if proxy:
        options += ["-o", f"ProxyCommand={proxy}"]
    values: dict[str, Any] = {"ansible_host": host.address, "ansible_port": host.ssh_port,
                              "ansible_user": host.ssh_user or "root", "ansible_ssh_common_args": shlex.join(options)}
    if host.ssh_key:
        values["ansible_ssh_private_key_file"] = host.ssh_key
    return values


def group_name(text: str) -> str:
    return text.replace("-", "_")


def build_inventory(loaded: LoadedSpec, files_dir: str, known_hosts: str,
                    only: dict[str, list[str]] | None = None, removed: Sequence[Host] = ()) -> dict[str, Any]:
    """The inventory as data. only: node name -> file names, to deploy just those (default: all nodes; a retired
    node's tombstone only when named). removed: hosts the spec no longer has that still hold its nodes (being
    drained). Every group name starts with opsctl_<spec>_ (masters, replicas, sentinels, the topology): inventories
    merge without a clash."""
    spec = loaded.spec
    nodes = [n for n in loaded.layout.nodes if only is None or n.name in only]
    nodes += [n for n in loaded.layout.retired if only is not None and n.name in only]
    hosts: dict[str, Any] = {}
    roles: dict[str, dict[str, None]] = {group: {} for group in ROLE_GROUPS.values()}
    for host in [*spec.hosts, *removed]:
        mine = [n for n in nodes if n.host == host.name]
        if not mine:
            continue
        hosts[host.name] = {**host_vars(spec, host, known_hosts),
                            "opsctl_nodes": [node_vars(spec, n, only.get(n.name) if only else None) for n in mine]}
        for n in mine:
            roles[ROLE_GROUPS[n.role]][host.name] = None
    prefix = group_name(f"opsctl_{spec.name}")
    children = {f"{prefix}_{group}": {"hosts": members} for group, members in roles.items() if members}
    top = {"vars": group_vars(loaded, files_dir),
           "children": {f"{prefix}_{spec.topology}": {"hosts": {h: None for h in hosts}}, **children}}
    return {"all": {"hosts": hosts, "children": {prefix: top}}}


def group_vars(loaded: LoadedSpec, files_dir: str) -> dict[str, Any]:
    spec = loaded.spec
    values: dict[str, Any] = {
        "opsctl_spec": spec.name, "opsctl_root": remote_root(spec), "opsctl_flavor": spec.server.flavor,
        "opsctl_service_user": service_user(spec), "opsctl_binary_path": binary_path(spec),
        "opsctl_os_package": OS_PACKAGES[spec.server.flavor],
        "opsctl_files_dir": files_dir, "ansible_python_interpreter": REMOTE_PYTHON,
    }
    if loaded.server_binary:
        values["opsctl_server_binary"] = loaded.server_binary
    return values


class _UnsafeDumper(yaml.SafeDumper):
    """Every string as `!unsafe`: Ansible templates inventory values, so a spec value such as
    ssh_user: "{{ lookup('pipe', 'id') }}" would otherwise run on the controller. Nothing opsctl writes
    into an inventory is meant to be templated."""


def _unsafe_text(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("!unsafe", text)


def _mapping(dumper: yaml.SafeDumper, data: dict[Any, Any]) -> yaml.MappingNode:
    """Keys (host, group and variable names) stay plain; values are tagged."""
    pairs = [(dumper.represent_str(str(key)), dumper.represent_data(value)) for key, value in data.items()]
    return yaml.MappingNode("tag:yaml.org,2002:map", pairs, flow_style=False)


_UnsafeDumper.add_representer(str, _unsafe_text)
_UnsafeDumper.add_representer(dict, _mapping)


def inventory_yaml(inventory: dict[str, Any]) -> str:
    """The inventory as Ansible reads it, with no value Ansible would template."""
    return yaml.dump(inventory, Dumper=_UnsafeDumper, sort_keys=False, default_flow_style=False,
                     allow_unicode=True)


def inventory_text(inventory: dict[str, Any], source: str) -> str:
    header = f"# Ansible inventory generated by `opsctl inventory` from {source!r}. No secrets in here.\n"
    return header + inventory_yaml(inventory)


def inventory_script_form(inventory: dict[str, Any]) -> dict[str, Any]:
    """The inventory in Ansible's JSON form, the one an inventory script answers to --list (and `ansible-inventory
    --list` prints): every group {hosts: [...], children: [...], vars}, each host's vars under _meta.hostvars. Every
    string value wrapped as {"__ansible_unsafe": ...}, JSON's spelling of the YAML form's !unsafe (never templated)."""
    hostvars: dict[str, Any] = {}
    groups: dict[str, Any] = {"_meta": {"hostvars": hostvars}}

    def walk(name: str, group: dict[str, Any]) -> None:
        members = group.get("hosts") or {}
        for host, values in members.items():
            hostvars.setdefault(host, {}).update(_unsafe_json(values or {}))
        children = group.get("children") or {}
        entry = groups.setdefault(name, {})
        entry.update({"hosts": list(members)} if members else {})
        entry.update({"vars": _unsafe_json(group["vars"])} if group.get("vars") else {})
        entry.update({"children": list(children)} if children else {})
        for child, sub in children.items():
            walk(child, sub or {})

    walk("all", inventory["all"])
    return groups


def _unsafe_json(value: Any) -> Any:
    if isinstance(value, str):
        return {"__ansible_unsafe": value}
    if isinstance(value, dict):
        return {key: _unsafe_json(v) for key, v in value.items()}
    if isinstance(value, list):
        return [_unsafe_json(v) for v in value]
    return value
