"""Placement is computed, not typed: derive every node (name, host, port, role, shard) from a spec.

Masters spread across hosts round-robin; replica r of shard s sits r hosts further on, so a replica is
never on its master's host and no two members of a shard share a host. Names are stable: shard s owns
names <name>-k for k in ((s-1)*(R+1), s*(R+1)], so adding shards appends names.

Addresses and endpoints, written one way: IP addresses compared in their canonical form (::1 and
0:0:0:0:0:0:0:1 are one host), IPv6 endpoints printed with brackets ([::1]:7000). Pure.

Where each node's redis_exporter listens (the node's address at its port + metrics.port_offset) and the spec
rule that it can be bound: one place for the port, read by validation, the targets and the provider.

Which certificate files a node uses (node override > host > tls section). Pure."""

from __future__ import annotations

import functools
import ipaddress
import re
from dataclasses import field
from typing import Literal

from opsctl.base.frozen import Frozen, frozen
from opsctl.base.record import ascii_decimal
from opsctl.spec.model import CLUSTER_BUS_OFFSET, PLAINTEXT_PORT_OFFSET, FileRef, Host, Spec, TlsFiles

PUBLIC_BINDS = {"0.0.0.0", "*", "::", "-::*", "::0"}  # every interface: hardening.allow_public_bind

Role = Literal["master", "replica", "sentinel"]

SENTINEL_PREFIX = "sentinel"


@frozen
class Node(Frozen):
    name: str
    host: str
    address: str
    port: int
    role: Role
    shard: int | None = None
    bind: tuple[str, ...] = ()
    config: tuple[tuple[str, str | int | bool], ...] = ()
    bus_port: int | None = None  # a cluster server's bus port (port + cluster.bus_port_offset); None: no bus

    @property
    def endpoint(self) -> str:
        return endpoint(self.address, self.port)

    @property
    def names_bus_port(self) -> bool:
        """Its cluster bus port is not the servers' own port + 10000: cluster-port renders it, CLUSTER MEET names it
        (Redis 6.2's MEET takes none, so the default stays unnamed)."""
        return self.bus_port is not None and self.bus_port != self.port + CLUSTER_BUS_OFFSET

    @property
    def listens_on(self) -> tuple[str, ...]:
        """The addresses its ports (and bus port) are bound on: its address and each bind address; not an
        every-interface bind, which covers its own machine only (whose nodes share its address)."""
        return tuple(dict.fromkeys(a for a in (self.address, *self.bind) if a not in PUBLIC_BINDS))

    @property
    def is_sentinel(self) -> bool:
        return self.role == "sentinel"


@frozen
class Shard(Frozen):
    index: int
    master: str
    replicas: tuple[str, ...]

    @property
    def members(self) -> tuple[str, ...]:
        return (self.master, *self.replicas)


@frozen
class Layout(Frozen):
    nodes: tuple[Node, ...]
    shards: tuple[Shard, ...] = ()
    problems: tuple[str, ...] = field(default=())
    retired: tuple[Node, ...] = ()  # deployed nodes the spec no longer has (spec.placement): drained, then removed
    reasons: tuple[tuple[str, str], ...] = ()  # node name -> why placement added or retired it
    orphans: tuple[str, ...] = ()  # deployed nodes whose host the spec no longer lists
    moved: tuple[str, ...] = ()  # retired nodes replaced on another host to even out load (spec.placement.Move)

    # Cached (a layout never changes): the planner asks for them per node and per shard, n times over n nodes.
    @functools.cached_property
    def servers(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if not n.is_sentinel)

    @functools.cached_property
    def sentinels(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.is_sentinel)

    @functools.cached_property
    def _by_name(self) -> dict[str, Node]:
        return {node.name: node for node in reversed(self.nodes)}  # reversed: the first of a name wins, as before

    def node(self, name: str) -> Node:
        found = self._by_name.get(name)
        if found is None:
            raise KeyError(name)
        return found

    def find(self, ref: str) -> Node | None:
        """A node by name or address:port (IP addresses compared in canonical form, IPv6 with or without brackets)."""
        wanted = split_endpoint(ref)
        return next((n for n in self.nodes if ref == n.name or (wanted and wanted == (n.address, n.port))), None)

    def shard_of(self, name: str) -> Shard | None:
        return next((s for s in self.shards if name in s.members), None)

    def reason(self, name: str) -> str | None:
        """Why placement added or retired the node (None: it stands where it stood)."""
        return dict(self.reasons).get(name)


def deployed_as(node: Node) -> dict[str, str | int | None]:
    """What a node is in the layout, kept in its record when its config is written: a later spec that derives
    another shard, role, host or port for the same name would make it a different node."""
    return {"host": node.host, "port": node.port, "role": node.role, "shard": node.shard}


def deployed_record(node: Node) -> dict[str, str | int | None]:
    """deployed_as plus the host's address, which is data, not identity (refusals compare deployed_as only): a
    drained host's nodes are stopped and forgotten by it once the host has left the spec."""
    return {**deployed_as(node), "address": node.address}


def host_bind(host: Host) -> tuple[str, ...]:
    return tuple(canonical_address(a) for a in host.bind) if host.bind else (canonical_address(host.address),)


def node_on(spec: Spec, name: str, host: Host, port: int, role: Role, shard: int | None) -> Node:
    """The node name on host at port (nodes.<name>.port wins), with its per-node config."""
    override = spec.nodes.get(name)
    port = override.port if override and override.port else port
    return Node(
        name=name,
        host=host.name,
        address=canonical_address(host.address),
        port=port,
        role=role,
        shard=shard,
        bind=host_bind(host),
        config=tuple(sorted(override.config.items())) if override else (),
        bus_port=bus_port(spec, port, role),
    )


def bus_port(spec: Spec, port: int, role: Role) -> int | None:
    """The cluster bus port of a node at port: port + cluster.bus_port_offset in a cluster, else None (no bus)."""
    if spec.topology != "cluster" or role == "sentinel":
        return None
    return port + spec.cluster_or_default().bus_port_offset


def _hosts_by_name(spec: Spec) -> dict[str, Host]:
    return {h.name: h for h in spec.hosts}


def cluster_layout(spec: Spec, masters: int | None = None) -> Layout:
    topo = spec.cluster_or_default()
    shard_count = topo.masters if masters is None else masters
    per_shard = topo.replicas_per_master + 1
    nodes: list[Node] = []
    shards: list[Shard] = []
    for s in range(shard_count):
        members: list[str] = []
        for r in range(per_shard):
            k = s * per_shard + r + 1
            host = spec.hosts[(s + r) % len(spec.hosts)]
            name = f"{spec.name}-{k}"
            nodes.append(node_on(spec, name, host, topo.base_port + k - 1, "master" if r == 0 else "replica", s + 1))
            members.append(name)
        shards.append(Shard(s + 1, members[0], tuple(members[1:])))
    return Layout(tuple(nodes), tuple(shards))


def standalone_layout(spec: Spec) -> Layout:
    topo = spec.standalone_or_default()
    hosts = _hosts_by_name(spec)
    host = hosts.get(topo.host or spec.hosts[0].name, spec.hosts[0])
    node = node_on(spec, f"{spec.name}-1", host, topo.port, "master", 1)
    return Layout((node,), (Shard(1, node.name, ()),))


def replication_hosts(spec: Spec) -> tuple[Host, list[Host]]:
    """The master host and replica hosts: by default the first host, then every other host."""
    topo = spec.replication_or_default()
    hosts = _hosts_by_name(spec)
    master = hosts.get(topo.master or spec.hosts[0].name, spec.hosts[0])
    if topo.replicas is None:
        return master, [h for h in spec.hosts if h.name != master.name]
    return master, [hosts[name] for name in topo.replicas if name in hosts]


def sentinel_hosts(spec: Spec) -> list[Host]:
    topo = spec.sentinel_or_default()
    hosts = _hosts_by_name(spec)
    if topo.hosts is None:
        return list(spec.hosts)
    return [hosts[name] for name in topo.hosts if name in hosts]


def replication_layout(spec: Spec) -> Layout:
    base = spec.replication_or_default().base_port
    master_host, replica_hosts = replication_hosts(spec)
    nodes = [node_on(spec, f"{spec.name}-1", master_host, base, "master", 1)]
    for i, host in enumerate(replica_hosts, start=1):
        nodes.append(node_on(spec, f"{spec.name}-{i + 1}", host, base + i, "replica", 1))
    if spec.topology == "sentinel":
        port = spec.sentinel_or_default().port
        for i, host in enumerate(sentinel_hosts(spec), start=1):
            nodes.append(node_on(spec, f"{spec.name}-{SENTINEL_PREFIX}-{i}", host, port, "sentinel", None))
    shard = Shard(1, nodes[0].name, tuple(n.name for n in nodes[1:] if n.role == "replica"))
    return Layout(tuple(nodes), (shard,))


def layout(spec: Spec) -> Layout:
    if spec.topology == "cluster":
        return cluster_layout(spec)
    if spec.topology == "standalone":
        return standalone_layout(spec)
    return replication_layout(spec)


def sentinel_master_name(spec: Spec) -> str:
    return spec.sentinel_or_default().master_name or spec.name


def sentinel_quorum(spec: Spec) -> int:
    topo = spec.sentinel_or_default()
    return topo.quorum or len(sentinel_hosts(spec)) // 2 + 1


MAX_PORT = 65535  # TCP's last port: every port opsctl derives or is given is checked against it


def canonical_address(address: str) -> str:
    """An IP address in its canonical text (compressed IPv6, no brackets); a host name in lowercase."""
    try:
        return str(ipaddress.ip_address(address.strip().removeprefix("[").removesuffix("]")))
    except ValueError:
        return address.strip().lower()


def endpoint(address: str, port: int) -> str:
    """address:port, with the address in brackets when it is IPv6 ([::1]:7000)."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


PORTS = range(1, MAX_PORT + 1)  # a port above MAX_PORT would quietly become another one in a socket call


def valid_port(text: str) -> bool:
    """1..65535 written in ASCII digits: no sign, no blank, no other script's digits."""
    return ascii_decimal(text, 1, MAX_PORT) is not None


def split_endpoint(text: str) -> tuple[str, int] | None:
    """'host:port', '[v6]:port' or 'v6:port' (the last colon separates the port) -> (canonical address, port); None
    for anything else: a host that is no address or name (empty, user@, a blank inside), a port outside 1..65535 or not
    in plain digits."""
    address, _, port = text.strip().rpartition(":")
    if not valid_port(port) or not valid_host(address):
        return None
    return canonical_address(address), int(port)


def valid_host(text: str) -> bool:
    """An IP address (IPv6 with or without brackets) or a DNS name: letters, digits, '.', '-', '_' only (no
    user@, no path, no blank: what would reach a resolver as something else)."""
    try:
        ipaddress.ip_address(text.removeprefix("[").removesuffix("]") if text.startswith("[") else text)
        return True
    except ValueError:
        return bool(_HOST.match(text))


_HOST = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9._\-]{0,252}[A-Za-z0-9_])?$")


def same_endpoint(a: str, b: str) -> bool:
    left, right = split_endpoint(a), split_endpoint(b)
    return left is not None and left == right


EXPORTER_PORT_OFFSET = 1000  # metrics.port_offset's default


def exporter_port(node: Node, offset: int = EXPORTER_PORT_OFFSET) -> int:
    """The port of the node's exporter: beside the node, so each node on a host gets its own."""
    return node.port + offset


def exporter_port_problems(layout: Layout, offset: int = EXPORTER_PORT_OFFSET, plaintext: bool = False) -> list[str]:
    """Exporter ports that cannot be bound: past 65535, or on an address where a node, a cluster bus or (plaintext:
    tls.plaintext_port) a node's plaintext port listens."""
    taken: dict[tuple[str, int], str] = {}
    for node in layout.nodes:
        for address in node.listens_on:  # a node binds every port on each of its addresses
            taken[(address, node.port)] = f"{node.name}'s port"
            if node.bus_port is not None:  # a cluster server's only: replication nodes and Sentinels have no bus
                taken[(address, node.bus_port)] = f"{node.name}'s cluster bus port"
            if plaintext:
                taken[(address, node.port + PLAINTEXT_PORT_OFFSET)] = f"{node.name}'s plaintext port"
    problems = []
    for node in layout.nodes:
        port = exporter_port(node, offset)
        if (too_high := _above_range(node, offset)) is not None:
            problems.append(too_high)
        elif (clash := taken.get((node.address, port))) is not None:
            problems.append(f"{node.name}: exporter port {port} on {node.address} is {clash}")
    return problems


def exporter_ports_above_range(layout: Layout, offset: int = EXPORTER_PORT_OFFSET) -> list[str]:
    """The exporter ports past 65535: no target can name one, whoever runs the exporters."""
    return [problem for node in layout.nodes if (problem := _above_range(node, offset)) is not None]


def _above_range(node: Node, offset: int) -> str | None:
    port = exporter_port(node, offset)
    return f"{node.name}: exporter port {port} (port {node.port} + {offset}) is above {MAX_PORT}" \
        if port > MAX_PORT else None


def node_refs(spec: Spec, node: Node) -> TlsFiles:
    host = next((h.tls for h in spec.hosts if h.name == node.host), None)
    override = spec.nodes[node.name].tls if node.name in spec.nodes else None
    layers = [t for t in (override, host) if t is not None]

    def pick(field: str) -> FileRef | None:
        chosen: FileRef | None = next((getattr(t, field) for t in layers if getattr(t, field) is not None),
                                      getattr(spec.tls, field))
        return chosen

    return TlsFiles(ca=pick("ca"), cert=pick("cert"), key=pick("key"))


def missing_refs(spec: Spec, node: Node) -> list[str]:
    """The files a node has none of, with given (not generated) certificates."""
    refs = node_refs(spec, node)
    return [name for name in ("ca", "cert", "key") if getattr(refs, name) is None]


def node_names(node: Node) -> tuple[str, ...]:
    """Subject alternative names of a generated node certificate: its address, then its host's name."""
    return (node.address, node.host) if node.host != node.address else (node.address,)
