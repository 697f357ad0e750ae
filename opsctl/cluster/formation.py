"""The steps of a cluster past each server's own: form it, join the nodes it does not know, point replicas at their
shard's master, then the slot steps. Pure."""

from __future__ import annotations

from collections.abc import Collection

from opsctl.observe.replies import LINE_ID
from opsctl.plan.facts import Facts, NodeFacts
from opsctl.plan.masters import cluster_endpoints, current_master, has_slots
from opsctl.plan.replication import follows
from opsctl.plan.servers import restarting
from opsctl.plan.steps import FormCluster, JoinCluster, Replicate, Step
from opsctl.slots.slotplan import slot_steps
from opsctl.spec.layout import Layout, Node


def cluster_steps(layout: Layout, facts: Facts, moving: Collection[str] = (),
                  filling: Collection[int] = ()) -> list[Step]:
    members = [n.name for n in layout.servers]
    if all(_unclustered(facts[m]) for m in members):
        first = layout.shards[0].master
        return [FormCluster(first, "no node belongs to a cluster yet", tuple(members))]
    via = next((m for m in members if not _unclustered(facts[m])), members[0])
    steps: list[Step] = []
    rejoining = {m for m in members if rejoins(layout.node(m), facts)}
    for m in members:
        if m in rejoining:
            continue
        if restarting(facts[m]):
            steps.append(JoinCluster(m, "no node serving slots knows it (a scale-in removed it, or a creation "
                                        "stopped before it met the cluster): it joins as a new node, reset first "
                                        "if it comes back with an identity the cluster forgot", via))
        elif _unclustered(facts[m]) or not _knows_cluster(facts[m], facts[via]):
            steps.append(JoinCluster(m, "not part of the cluster", via))
    for shard in layout.shards:
        master = current_master(shard, layout, facts)
        master_me = facts[master].myself
        master_id = master_me.id if master_me else None
        for name in shard.members:
            me = facts[name].myself
            linked = me is not None and master_id is not None and me.master_id == master_id
            if name == master or linked or has_slots(facts[name]) or name in rejoining:
                continue
            steps.append(Replicate(name, f"should replicate {follows(master, moving)} (shard {shard.index})",
                                   master))
    masters = [current_master(shard, layout, facts) for shard in layout.shards]
    return steps + slot_steps(layout, facts, masters, filling)



def rejoins(node: Node, facts: Facts) -> bool:
    """A cluster node that is down but that the running nodes still know: its nodes.conf brings it back by itself.
    One they do not know (a scale-in removed and forgot it) joins again as a new node. Asked are the running
    nodes that serve slots (a removed node serves none, its old view does not count); with none to ask, every
    node that is down is taken to come back by itself."""
    if not restarting(facts[node.name]):
        return False
    known = cluster_endpoints(facts)
    return known is None or node.endpoint in known


def _unclustered(f: NodeFacts) -> bool:
    """A node that is new or alone: not running yet, or knows only itself and has no slots."""
    if not f.running or f.cluster_nodes is None:
        return True
    return len(f.cluster_nodes) <= 1 and not has_slots(f)


def _knows_cluster(f: NodeFacts, via: NodeFacts) -> bool:
    """f and via know each other (a node that knows the cluster from an old nodes.conf is not known back)."""
    me, mine = via.myself, f.myself
    return me is None or (me.id in map(LINE_ID, f.cluster_nodes or ())  # `in` over a map: the scan runs in C
                          and (mine is None or mine.id in map(LINE_ID, via.cluster_nodes or ())))
