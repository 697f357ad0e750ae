"""The spec's port checks: every port a node binds (its port, its cluster bus port, its plaintext and exporter
ports) is at most 65535 and taken once per address; a bastion's port is a port. Findings as in
opsctl.spec.crosschecks."""

from __future__ import annotations

import re
from collections.abc import Iterator

from opsctl.server.versions import has_directive, parse_version
from opsctl.spec.layout import MAX_PORT, Layout, Node, endpoint, exporter_port_problems
from opsctl.spec.model import CLUSTER_BUS_OFFSET, Host, Spec

Finding = tuple[tuple[str | int, ...], str, str]

DEFAULT_PORTS = {6379, 26379}


def check_ports(spec: Spec, nodes: Layout) -> Iterator[Finding]:
    """Default ports, ports above 65535 and clashes of node and cluster bus ports on any address a node binds;
    findings on one field are grouped into one problem."""
    taken: dict[tuple[str, int], tuple[str, bool]] = {}  # (address, port) -> (whose, a bus port)
    default: dict[tuple[str | int, ...], list[str]] = {}
    too_high: dict[tuple[str | int, ...], list[tuple[str, int, bool]]] = {}
    for node in nodes.nodes:
        path = port_path(spec, node.name, node.is_sentinel)
        if node.port in DEFAULT_PORTS and not spec.hardening.allow_default_port:
            default.setdefault(path, []).append(node.name)
        for port, what in own_ports(node):
            bus = port != node.port
            if port > MAX_PORT:
                too_high.setdefault(_bus_path(spec, path) if bus else path, []).append((node.name, port, bus))
                continue
            # every address it binds: a bind address of another host's (one machine) clashes there too
            clash = next(((a, o) for a in node.listens_on if (o := taken.get((a, port)))), None)
            if clash:
                address, other = clash
                at = _bus_path(spec, path) if bus or other[1] else path
                yield (at, f"{what} and {other[0]} both use {endpoint(address, port)}",
                       "change a base port, cluster.bus_port_offset or nodes.<name>.port" if spec.topology == "cluster"
                       else "change a base port, or nodes.<name>.port")
            for address in node.listens_on:
                taken.setdefault((address, port), (what, bus))
    for path, names in default.items():
        yield (path, f"{_names(names)} would listen on the default port {nodes.node(names[0]).port}",
               "pick another port (scanners try the default first) or set hardening.allow_default_port: true")
    for path, high in too_high.items():
        yield _too_high(spec, path, high)


def check_bus_offset(spec: Spec) -> Iterator[Finding]:
    """Another bus offset needs cluster-port (and CLUSTER MEET's bus port argument): Redis 7.0 on."""
    offset = spec.cluster.bus_port_offset if spec.cluster else CLUSTER_BUS_OFFSET
    if offset != CLUSTER_BUS_OFFSET and not has_directive(spec.server.flavor, parse_version(spec.server.version),
                                                          "cluster-port"):
        yield (("cluster", "bus_port_offset"), f"{spec.server.flavor} {spec.server.version} has no cluster-port: its "
               f"bus port is always port + {CLUSTER_BUS_OFFSET}", "use Redis >= 7.0 or Valkey, or leave "
               "bus_port_offset out")


def _bus_path(spec: Spec, path: tuple[str | int, ...]) -> tuple[str | int, ...]:
    """Where a bus port's problem is located: at a bus_port_offset the spec changed, else at the node's port."""
    offset_changed = spec.cluster_or_default().bus_port_offset != CLUSTER_BUS_OFFSET
    return ("cluster", "bus_port_offset") if offset_changed and path[0] != "nodes" else path


def own_ports(node: Node) -> list[tuple[int, str]]:
    """(port, what it is) for the ports a node binds itself: its port, and its cluster bus port if it has one."""
    ports = [(node.port, node.name)]
    return ports if node.bus_port is None else [*ports, (node.bus_port, f"{node.name}'s cluster bus port")]


def _names(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _too_high(spec: Spec, path: tuple[str | int, ...], high: list[tuple[str, int, bool]]) -> Finding:
    name, port, bus = high[0]
    offset = spec.cluster_or_default().bus_port_offset
    what = f"{name}'s cluster bus port {port} (port + {offset})" if bus else f"{name}'s port {port}"
    more = f" (and {len(high) - 1} more)" if len(high) > 1 else ""
    limit = (f"a cluster node's port + cluster.bus_port_offset ({offset}) must stay at or below 65535" if bus
             else "ports end at 65535")
    return (path, f"{what} is above 65535{more}", f"lower it: {limit}")


def port_path(spec: Spec, name: str, sentinel: bool) -> tuple[str | int, ...]:
    if name in spec.nodes and spec.nodes[name].port:
        return ("nodes", name, "port")
    if sentinel:
        return ("sentinel", "port")
    section = {"cluster": "cluster", "standalone": "standalone"}.get(spec.topology, "replication")
    return (section, "port" if section == "standalone" else "base_port")


def check_exporter_ports(spec: Spec, nodes: Layout) -> Iterator[Finding]:
    """metrics.exporter: every exporter's port can be bound (opsctl.spec.layout); the first problem is named."""
    if not spec.metrics.exporter:
        return
    problems = exporter_port_problems(nodes, spec.metrics.port_offset, spec.tls.enabled and spec.tls.plaintext_port)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        yield (("metrics", "port_offset"), problems[0] + more,
               "pick another metrics.port_offset, or move the base port so no node listens on another's exporter port")


def check_bastion_port(index: int, host: Host) -> Iterator[Finding]:
    """The form allows up to 5 digits after the colon (model.Bastion): the port must also be a port."""
    found = re.search(r":([0-9]{1,5})$", host.bastion or "")
    if found and not 1 <= int(found[1]) <= MAX_PORT:
        yield (("hosts", index, "bastion"), f"bastion port {found[1]} is outside 1..{MAX_PORT}",
               "give the jump host's SSH port, e.g. ops@jump.example.com:2222 (default 22)")
