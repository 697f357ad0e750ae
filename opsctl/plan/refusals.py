"""What the planner refuses before it plans a step: a server change that breaks replication mid-rollout, a master
that would restart empty and be copied, a deployed node the spec makes another. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from opsctl.base.errors import RefusedError
from opsctl.plan.facts import Facts, NodeFacts
from opsctl.plan.masters import start_master
from opsctl.plan.servers import restarting
from opsctl.server.versions import Version, rolling_change_problem, server_text
from opsctl.spec.layout import MAX_PORT, Layout, deployed_as
from opsctl.spec.load import LoadedSpec


def refuse_unsafe_server_change(facts: Facts, server: tuple[str, Version]) -> None:
    """A server change that would break replication mid-rollout is refused before anything is touched."""
    for f in facts.values():
        running = f.server if f.reachable else None
        if running is None:
            continue
        problem = rolling_change_problem(running, server)
        if problem:
            raise RefusedError(f"cannot change {f.name} from {server_text(*running)} to {server_text(*server)}",
                               problem, "keep the current server version, or migrate the data to a new topology")



def refuse_empty_master_restart(loaded: LoadedSpec, facts: Facts) -> None:
    """Without persistence a master restarts empty, and its replicas would copy the empty data set; unless another
    node is the shard's master now (the down ones start as its replicas), even one promoted before it held a key."""
    persistence = loaded.spec.persistence
    if persistence.aof != "off" or persistence.rdb:
        return
    for shard in loaded.layout.shards:
        down = [m for m in shard.members if restarting(facts[m])]
        holding = [m for m in shard.members if facts[m].running and facts[m].role and facts[m].keys > 0]
        follow = start_master(loaded.layout, shard, facts) if down else None
        if down and holding and (follow is None or follow in down):
            raise RefusedError(
                f"{', '.join(down)} is down and runs without persistence: started now it would come back "
                f"empty as master, and {', '.join(holding)} would copy the empty data set",
                "persistence is off (aof: off, rdb: []), so nothing on disk survives a restart",
                f"promote a replica first (opsctl failover --shard {shard.index} --mode takeover --yes, or "
                "wait for the cluster or Sentinel to do it), then apply again")


def refuse_empty_master_start(loaded: LoadedSpec, facts: Facts) -> None:
    """A replication or Sentinel server that lost its folder (a dead host replaced: not running, no record) would
    start as the master when no running server is one (a retired one counts: it is failed over first) and none comes
    back from its files as the master, and the replicas holding the data would copy its empty data set. A replica is
    promoted first; the replacement then starts as its replica."""
    layout = loaded.layout
    if loaded.spec.topology not in ("replication", "sentinel"):
        return
    for shard in layout.shards:
        fresh = [m for m in shard.members if not facts[m].running and facts[m].recorded_digest is None]
        holding = sorted((m for m in shard.members if facts[m].running and facts[m].role and facts[m].keys > 0),
                         key=lambda m: -facts[m].keys)
        serving = [n for n in (*shard.members, *(r.name for r in layout.retired))  # a retired one drains first
                   if n in facts and facts[n].running and (role := facts[n].role) and role.kind == "master"]
        returning = [m for m in shard.members if restarting(facts[m]) and _recorded_role(facts[m]) == "master"]
        follow = start_master(layout, shard, facts) if fresh else None
        if fresh and holding and not serving and not returning and (follow is None or follow in fresh):
            raise RefusedError(
                f"{', '.join(fresh)} would start empty as the master: no running server is the master, and "
                f"{', '.join(holding)} ({facts[holding[0]].keys} keys) would copy the empty data set",
                f"{', '.join(fresh)} has no record and does not run (its host was replaced and its data went with "
                "it); a replication topology without Sentinel promotes no replica by itself",
                f"promote the replica holding the data by hand first: REPLICAOF NO ONE on {holding[0]} (in "
                "password mode under its derived name: `opsctl render -f SPEC --dir -` prints it; with Sentinel, wait "
                "until it promotes one), then apply again: the others and the replacement become its replicas "
                "(docs/runbooks/failover.md)")


def _recorded_role(f: NodeFacts) -> str | None:
    was = f.record.deployed
    return was.role if was is not None else None


def refuse_layout_change(layout: Layout, facts: Facts) -> None:
    """A deployed node keeps its shard, role, host and port: a spec that derives others for its name (another
    cluster.replicas_per_master, hosts in another order) would restart it as another node. Compared with the
    record of what it was deployed as, not with live roles (failovers move those legitimately)."""
    moved = []
    for node in layout.servers:
        was = facts[node.name].record.deployed if node.name in facts else None
        now = deployed_as(node)
        if was is not None and was.identity() != now:
            moved.append(f"{node.name}: deployed as {_as_text(was.identity())}, the spec now makes it {_as_text(now)}")
    if moved:
        raise RefusedError(f"the spec changes what {len(moved)} deployed node(s) are", "\n".join(moved),
                           "a running node cannot move to another shard, role, host or port: keep "
                           "cluster.replicas_per_master and the hosts list as deployed (add shards with "
                           "cluster.masters); for another shape deploy a new topology and migrate the data")


def _as_text(deployed: Mapping[str, object]) -> str:
    return (f"shard {deployed.get('shard')} {deployed.get('role')} on {deployed.get('host')} "
            f"port {deployed.get('port')}")



def refuse_removed_hosts(layout: Layout) -> None:
    """Deployed nodes on a host the spec no longer lists whose record has no address (written before opsctl kept
    one): the host's entry held it, so nothing could stop or forget them once they are drained elsewhere."""
    if layout.orphans:
        raise RefusedError(f"{', '.join(layout.orphans)} run on a host the spec no longer lists, and their records "
                           "do not say at which address",
                           "removing a host drains it (each node replaced elsewhere, masters failed over, then "
                           "forgotten, stopped and purged), which needs each node's address: records written before "
                           "opsctl kept addresses lack it",
                           "put the host back in hosts and apply once with a config change (the records are rewritten "
                           "with the address), then remove it again (docs/changing-the-fleet.md)")


def refuse_bus_port_clash(layout: Layout, facts: Facts) -> None:
    """A node restarted onto a bus port another running node at its address still holds (cluster.bus_port_offset
    changed by the gap between their ports) cannot bind it, and since that holder restarts later in the rolling
    order, every re-run fails at the same node: refused up front, with an offset that avoids it."""
    live = _live_bus_ports(layout, facts)
    clashes = [(n, holder) for n in layout.servers if n.bus_port is not None
               and (holder := live.get((n.address, n.bus_port))) not in (None, n.name)]
    if not clashes:
        return
    node, holder = clashes[0]
    offset = (node.bus_port or 0) - node.port
    where = "; ".join(f"{n.name}'s new bus port {n.bus_port} on {n.address} is {h}'s bus port now" for n, h in clashes)
    free = _offset_avoiding(layout, live, offset)
    suggest = f"e.g. {free}" if free else "one that no node's port plus it makes another node's bus port now"
    raise RefusedError(f"cluster.bus_port_offset {offset} would restart {node.name} onto a bus port {holder} holds",
                       f"{where}: the restart cannot bind it while {holder} runs with its old offset, and every "
                       "re-run stops at the same node", f"choose another cluster.bus_port_offset ({suggest}), or "
                       "change it in two steps through one that clashes with nothing")


def _live_bus_ports(layout: Layout, facts: Facts) -> dict[tuple[str, int], str]:
    """(address, bus port) -> the node holding it now, as each running node's own CLUSTER NODES line says."""
    return {(n.address, me.bus_port): n.name for n in layout.servers
            if (f := facts.get(n.name)) is not None and f.reachable and (me := f.myself) is not None}


def _offset_avoiding(layout: Layout, live: dict[tuple[str, int], str], offset: int) -> int | None:
    """The nearest offset above offset that puts no node's bus port on a live bus port or a port at its address."""
    ports = {(n.address, n.port) for n in layout.nodes}
    for candidate in range(offset + 1, MAX_PORT):
        buses = [((n.address, n.port + candidate), n.name) for n in layout.servers]
        if all(port[1] <= MAX_PORT and port not in ports and live.get(port, name) == name for port, name in buses):
            return candidate
    return None
