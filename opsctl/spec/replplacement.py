"""Placement of a replication or Sentinel topology from (spec, what is deployed): a deployed server or sentinel
keeps its name, host, port and recorded role for life, and a retired name is never given again. Why: a replica's
data and a sentinel's learned state live where it was deployed. Pure. The rules: docs/changing-the-fleet.md,
"Replication and Sentinel".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from opsctl.spec.deployed import Deployed, name_index, recorded_role, sentinel_index, unpurged
from opsctl.spec.layout import (
    SENTINEL_PREFIX,
    Layout,
    Node,
    Shard,
    canonical_address,
    deployed_as,
    node_on,
    replication_hosts,
    replication_layout,
    sentinel_hosts,
)
from opsctl.spec.model import Host, Spec


def replication_placed(spec: Spec, deployed: Sequence[Deployed]) -> Layout:
    """The positional layout while every deployed node stands where it puts it; else a deployed node on a host the
    spec still gives a server (a sentinel) stays, each such host without one gets a new name (above every name
    deployed or recorded), and the ones on other hosts retire (a master among them fails over first: the
    planner's part)."""
    positional = replication_layout(spec)
    live = [d for d in deployed if not d.retired]
    if not any(d.retired for d in deployed) and all(_stands(positional, d) for d in live):
        return positional
    return _Placer(spec, deployed).layout()


def _stands(positional: Layout, d: Deployed) -> bool:
    node = positional.find(d.name)
    return node is not None and deployed_as(node) == {"host": d.host, "port": d.port, "role": d.role,
                                                      "shard": d.shard}


class _Placer:
    """One placement: a server on each server host, a sentinel on each sentinel host."""

    def __init__(self, spec: Spec, deployed: Sequence[Deployed]) -> None:
        self.spec = spec
        self.hosts = {h.name: h for h in spec.hosts}
        self.deployed = deployed
        self.live = [d for d in deployed if not d.retired]
        self.next_server = max([0, *(name_index(spec, d.name) or 0 for d in deployed)]) + 1
        self.next_sentinel = max([0, *(sentinel_index(spec, d.name) or 0 for d in deployed)]) + 1
        self.reasons: dict[str, str] = {}

    def layout(self) -> Layout:
        master_host, replica_hosts = replication_hosts(self.spec)
        servers = [d for d in self.live if d.role != "sentinel"]
        nodes = self._place(servers, [master_host, *replica_hosts], self._new_server)
        nodes.sort(key=lambda n: (n.role != "master", n.host != master_host.name))  # recorded master first
        retired = self._retired(servers, nodes)
        if self.spec.topology == "sentinel":
            sentinels = [d for d in self.live if d.role == "sentinel"]
            watching = self._place(sentinels, sentinel_hosts(self.spec), self._new_sentinel)
            nodes += watching
            retired += self._retired(sentinels, watching)
        undone = self._retired(unpurged(self.deployed), [])  # tombstones whose purge a killed run left undone
        for node in undone:
            self.reasons[node.name] = f"{node.name} on {node.host}: retired, its purge was left undone by a run " \
                                      "that stopped"
        retired += undone
        shard = Shard(1, nodes[0].name, tuple(n.name for n in nodes[1:] if not n.is_sentinel))
        orphans = tuple(d.name for d in self.live if d.host not in self.hosts and not d.address)
        return Layout(tuple(nodes), (shard,), retired=tuple(retired), reasons=tuple(sorted(self.reasons.items())),
                      orphans=orphans)

    def _place(self, deployed: list[Deployed], hosts: list[Host], new: Callable[[Host], Node]) -> list[Node]:
        """A node per host: the one deployed there (name, port and recorded role kept), else a new one."""
        out = []
        for host in hosts:
            there = next((d for d in deployed if d.host == host.name), None)
            out.append(new(host) if there is None else
                       node_on(self.spec, there.name, host, there.port, recorded_role(there), there.shard))
        return out

    def _new_server(self, host: Host) -> Node:
        k = self.next_server
        self.next_server += 1
        name = f"{self.spec.name}-{k}"
        self.reasons[name] = f"{name} on {host.name}: new replica ({host.name} holds a server in the spec)"
        return node_on(self.spec, name, host, self.spec.replication_or_default().base_port + k - 1, "replica", 1)

    def _new_sentinel(self, host: Host) -> Node:
        i = self.next_sentinel
        self.next_sentinel += 1
        name = f"{self.spec.name}-{SENTINEL_PREFIX}-{i}"
        self.reasons[name] = f"{name} on {host.name}: new sentinel (the spec's sentinel hosts include {host.name})"
        return node_on(self.spec, name, host, self.spec.sentinel_or_default().port, "sentinel", None)

    def _retired(self, deployed: list[Deployed], kept: list[Node]) -> list[Node]:
        """The deployed nodes not kept: at their host's address, or at their recorded one once the host left the
        spec (a record without one is an orphan, which the planner refuses)."""
        names = {n.name for n in kept}
        out = []
        for d in deployed:
            if d.name in names or (d.host not in self.hosts and not d.address):
                continue
            if d.host in self.hosts:
                node = node_on(self.spec, d.name, self.hosts[d.host], d.port, recorded_role(d), d.shard)
                why = f"{d.name} on {d.host}: retired, the spec no longer places one there"
            else:
                address = canonical_address(d.address or "")
                node = Node(d.name, d.host, address, d.port, recorded_role(d), d.shard, bind=(address,))
                why = f"{d.name} on {d.host}: retired, {d.host} removed from the spec"
            self.reasons[d.name] = why
            out.append(node)
        return out
