"""Placement from (spec, what is deployed): a deployed node keeps its name, host, port and shard for life, and a
retired name is never given again. Why: a node's data, files and cluster identity live where it was deployed. Pure:
the shell (opsctl.runtime.opening) reads the records. The rules: docs/changing-the-fleet.md, "Identity".
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import replace

from opsctl.base.frozen import Frozen, frozen
from opsctl.spec.deployed import Deployed, NodeRecord, deployed_from_records, name_index, recorded_role, unpurged
from opsctl.spec.layout import (
    Layout,
    Node,
    Shard,
    bus_port,
    canonical_address,
    cluster_layout,
    deployed_as,
    layout,
    node_on,
)
from opsctl.spec.load import LoadedSpec
from opsctl.spec.model import Host, Spec
from opsctl.spec.replplacement import replication_placed


@frozen
class Move(Frozen):
    """A cluster member moved to another host to even out load (opsctl.plan.spread): replaced there by a new name,
    then retired as a drained one is; target "" when its replacement is deployed already (a run stopped part way)."""

    name: str
    shard: int
    source: str
    target: str
    reason: str


def placed_layout(spec: Spec, deployed: Sequence[Deployed], serving: Collection[str] = (),
                  moves: Sequence[Move] = ()) -> Layout:
    """The layout of spec given what is deployed (see the module's docstring; replication and Sentinel:
    spec.replplacement); standalone: spec's layout.
    serving: the nodes that are their shard's master now (the shell asks the cluster): never retired as surplus,
    because a retired master would be drained of its slots like a removed shard instead of staying its master.
    moves: the members to move to even out load (cluster only)."""
    if spec.topology in ("replication", "sentinel"):
        return replication_placed(spec, deployed)
    if spec.topology != "cluster":
        return layout(spec)
    live = [d for d in deployed if not d.retired and d.shard is not None and name_index(spec, d.name)]
    deepest = max([spec.cluster_or_default().masters, *(d.shard or 0 for d in live)])
    wide = cluster_layout(spec, masters=deepest)
    if not moves and all(_stands(wide, d) for d in live) and not any(d.retired for d in deployed):
        return _positional(spec, wide, live)
    return _Placer(spec, deployed, serving, moves).layout()


def with_placement(loaded: LoadedSpec, records: Mapping[str, NodeRecord],
                   serving: Collection[str] = (), moves: Sequence[Move] = ()) -> LoadedSpec:
    """loaded with its layout placed from the nodes' records (what the provider found deployed); serving, moves:
    see placed_layout."""
    placed = placed_layout(loaded.spec, deployed_from_records(records), serving, moves)
    return loaded if placed == loaded.layout else replace(loaded, layout=placed)


def recorded_nodes(spec: Spec, layout: Layout, deployed: Sequence[Deployed]) -> tuple[Node, ...]:
    """The nodes the records know beside the layout's kept and retired ones (tombstones, and nodes no placement
    reaches any more), where they were deployed: on their host of the spec, else at their recorded address (a
    record without one on a host the spec lost names no place, and is left out). What destroy removes with the
    rest, so nothing of the topology stays behind."""
    placed = {n.name for n in (*layout.nodes, *layout.retired)}
    hosts = {h.name: h for h in spec.hosts}
    out = []
    for d in deployed:
        if d.name in placed or (d.host not in hosts and not d.address):
            continue
        if d.host in hosts:
            out.append(node_on(spec, d.name, hosts[d.host], d.port, recorded_role(d), d.shard))
        else:
            out.append(drained_node(spec, d))
    return tuple(out)


def drained_node(spec: Spec, d: Deployed) -> Node:
    """A deployed node on a host the spec no longer lists, at its recorded address (with its bus port: the cluster
    knows it there until it is forgotten)."""
    address = canonical_address(d.address or "")
    role = recorded_role(d)
    return Node(d.name, d.host, address, d.port, role, d.shard, bind=(address,),
                bus_port=bus_port(spec, d.port, role))


def surplus_members(layout: Layout) -> list[Node]:
    """Retired members of shards the layout keeps (a replica count went down): which one retires depends on who is
    the shard's master now, so the shell asks the cluster before it trusts the choice (placed_layout's serving)."""
    kept = {s.index for s in layout.shards}
    return [n for n in layout.retired if n.shard in kept]


def _stands(wide: Layout, d: Deployed) -> bool:
    node = wide.find(d.name)
    return node is not None and deployed_as(node) == {"host": d.host, "port": d.port, "role": d.role,
                                                      "shard": d.shard}


def _positional(spec: Spec, wide: Layout, live: Iterable[Deployed]) -> Layout:
    """Today's layout, and the deployed nodes of shards past cluster.masters as retired."""
    now = cluster_layout(spec)
    names = {n.name for n in now.nodes}
    retired = tuple(wide.node(d.name) for d in live if d.name not in names)
    return Layout(now.nodes, now.shards, retired=retired)


class _Placer:
    """One placement: deployed members kept, surplus retired, missing members placed (in shard order)."""

    def __init__(self, spec: Spec, deployed: Sequence[Deployed], serving: Collection[str] = (),
                 moves: Sequence[Move] = ()) -> None:
        self.spec = spec
        self.moves = {m.name: m for m in moves}
        self.moving_to: dict[int, list[Move]] = {}
        for m in moves:
            if m.target:
                self.moving_to.setdefault(m.shard, []).append(m)
        self.serving = set(serving)
        self.topo = spec.cluster_or_default()
        self.hosts = {h.name: h for h in spec.hosts}
        self.deployed = deployed
        self.live = [d for d in deployed if not d.retired and d.shard is not None]
        used = [name_index(spec, d.name) or 0 for d in deployed]
        self.next_index = max([0, *used]) + 1
        self.load = {h.name: 0 for h in spec.hosts}
        self.masters = {h.name: 0 for h in spec.hosts}
        self.ports: dict[str, set[int]] = {h.name: set() for h in spec.hosts}
        self.reasons: dict[str, str] = {}
        self.orphans = tuple(d.name for d in self.live if d.host not in self.hosts and not d.address)
        self.drained = [d for d in self.live if d.host not in self.hosts and d.address]
        self.replacing: dict[int, list[Deployed]] = {}
        for d in self.drained:
            self.replacing.setdefault(d.shard or 0, []).append(d)

    def layout(self) -> Layout:
        kept, retired = self._kept()
        nodes: list[Node] = []
        shards: list[Shard] = []
        standing = {index: [self._keep(d, index) for d in kept.get(index, [])]
                    for index in range(1, self.topo.masters + 1)}  # every host's load known before a new node
        for index, placed in standing.items():
            had = len(placed)
            while len(placed) < self.topo.replicas_per_master + 1:
                placed.append(self._new(index, placed, had))
            nodes += placed
            shards.append(Shard(index, placed[0].name, tuple(n.name for n in placed[1:])))
        gone = tuple(self._retired(d) for d in retired if d.host in self.hosts) + tuple(map(self._drain, self.drained))
        gone += tuple(self._unpurged())
        return Layout(tuple(nodes), tuple(shards), retired=gone, reasons=tuple(sorted(self.reasons.items())),
                      orphans=self.orphans, moved=tuple(sorted(n.name for n in gone if n.name in self.moves)))

    def _kept(self) -> tuple[dict[int, list[Deployed]], list[Deployed]]:
        """Deployed members by shard (recorded master first), and the ones to retire: shards past cluster.masters
        and a shard's surplus members (one sharing a host with another member first, then the newest), never the
        shard's master now (serving; without word from the cluster, the recorded master)."""
        by_shard: dict[int, list[Deployed]] = {}
        retired: list[Deployed] = []
        for d in sorted(self.live, key=lambda d: (d.role != "master", name_index(self.spec, d.name) or 0)):
            if d.host not in self.hosts:
                continue
            if (d.shard or 0) > self.topo.masters:
                retired.append(d)
            elif d.name in self.moves:
                retired.append(d)
                self.reasons[d.name] = self.moves[d.name].reason
            else:
                by_shard.setdefault(d.shard or 0, []).append(d)
        for index, members in by_shard.items():
            surplus = len(members) - (self.topo.replicas_per_master + 1)
            if surplus <= 0:
                continue
            hosts = [m.host for m in members]
            head = next((m for m in members if m.name in self.serving), members[0])
            ranked = sorted((m for m in members if m is not head), key=lambda m: (
                hosts.count(m.host) > 1, m.role != "master", name_index(self.spec, m.name) or 0))
            for d in ranked[-surplus:]:
                members.remove(d)
                retired.append(d)
                self.reasons[d.name] = (f"{d.name} on {d.host}: surplus replica of shard {index}, retired "
                                        f"(replicas_per_master {len(hosts) - 1} -> {self.topo.replicas_per_master})")
        return by_shard, retired

    def _keep(self, d: Deployed, index: int) -> Node:
        self._take(d.host, d.port, d.role == "master")
        return self._node(d.name, self.hosts[d.host], d.port, d.role, index)

    def _unpurged(self) -> list[Node]:
        """Tombstones whose purge a killed run left undone: retired again, so the plan purges them."""
        out = []
        for d in unpurged(self.deployed):
            if d.shard is None or not (d.host in self.hosts or d.address):
                continue
            out.append(self._retired(d) if d.host in self.hosts else self._drain(d))
            self.reasons[d.name] = f"{d.name} on {d.host}: retired, its purge was left undone by a run that stopped"
        return out

    def _retired(self, d: Deployed) -> Node:
        self._take(d.host, d.port, False)
        return self._node(d.name, self.hosts[d.host], d.port, d.role, d.shard)

    def _drain(self, d: Deployed) -> Node:
        """A node on a host the spec no longer lists, at its recorded address: retired once replaced elsewhere."""
        self.reasons.setdefault(d.name, f"{d.name} on {d.host}: retired, {d.host} removed from the spec")
        return drained_node(self.spec, d)

    def _node(self, name: str, host: Host, port: int, role: str, shard: int | None) -> Node:
        return node_on(self.spec, name, host, port, "master" if role == "master" else "replica", shard)

    def _take(self, host: str, port: int, master: bool) -> None:
        self.load[host] = self.load.get(host, 0) + 1
        self.masters[host] = self.masters.get(host, 0) + int(master)
        self.ports.setdefault(host, set()).add(port)

    def _new(self, index: int, placed: list[Node], had: int) -> Node:
        master = not placed
        taken = {n.host for n in placed}
        eligible = [h for h in self.spec.hosts if h.name not in taken]
        if not eligible:  # spec checks refuse more members than hosts; placed anyway, never silently dropped
            eligible = list(self.spec.hosts)
        order = list(self.spec.hosts)
        host = min(eligible, key=lambda h: ((h.maintenance, self.masters[h.name]) if master else (False, 0),
                                            self.load[h.name], order.index(h)))  # a held host serves no master
        if (moved := self.moving_to.get(index)) and moved[0].target in self.hosts:
            host = self.hosts[moved[0].target]  # the move's target: chosen by load, apart from the shard
        k = self.next_index
        self.next_index += 1
        name = f"{self.spec.name}-{k}"
        port = self._free_port(host.name, self.topo.base_port + k - 1)
        self._take(host.name, port, master)
        if master:
            why = f"{name} on {host.name}: master of new shard {index} (cluster.masters is {self.topo.masters})"
        elif had == 0:
            why = f"{name} on {host.name}: replica of new shard {index}"
        else:
            why = (f"{name} on {host.name}: new replica of shard {index} "
                   f"(replicas_per_master {had - 1} -> {self.topo.replicas_per_master})")
        lost = self.replacing.get(index)
        if moved := self.moving_to.get(index):
            mover = moved.pop(0)
            why = f"{name} on {host.name}: replaces {mover.name} of shard {index} (moved off {mover.source})"
            self.reasons[mover.name] = f"{mover.reason}: replaced by {name}, synced, then retired"
        elif lost:
            old = lost.pop(0)
            why = f"{name} on {host.name}: replaces {old.name} of shard {index} ({old.host} removed from the spec)"
            self.reasons[old.name] = (f"{old.name} on {old.host}: replaced by {name} on {host.name}, then retired: "
                                      f"{old.host} removed from the spec")
        self.reasons[name] = why
        return self._node(name, host, port, "master" if master else "replica", index)

    def _free_port(self, host: str, port: int) -> int:
        """port, or the next one up whose own and bus port no node on host uses (either way round)."""
        used, offset = self.ports.get(host, set()), self.topo.bus_port_offset
        taken = used | {p + offset for p in used} | {p - offset for p in used}
        while port in taken or port + offset in taken:
            port += 1
        return port


def drained(spec: Spec, layout: Layout) -> list[Node]:
    """The retired nodes on hosts the spec no longer lists (a removed host being drained), or moved off their host to
    even out load (layout.moved), in a shard it keeps."""
    hosts = {h.name for h in spec.hosts}
    kept = {s.index for s in layout.shards}
    return [n for n in layout.retired if (n.host not in hosts or n.name in layout.moved) and n.shard in kept]


def with_member(layout: Layout, name: str, absent: Collection[str] = ()) -> Layout:
    """layout with the retired node name back in its shard as a replica member and without the absent ones (its
    replacements not started yet): the view a failover away from it needs while it is still the shard's master."""
    node = Layout(layout.retired).node(name)
    shards = tuple(replace(s, replicas=(*(r for r in s.replicas if r not in absent), name))
                   if s.index == node.shard else s for s in layout.shards)
    return replace(layout, nodes=(*layout.nodes, node), shards=shards,
                   retired=tuple(n for n in layout.retired if n.name != name))
