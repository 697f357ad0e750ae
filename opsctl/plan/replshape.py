"""What a plan does when a replication or Sentinel topology changes shape (spec.replplacement): the master on a
host leaving the spec fails over first, the nodes placement retired go once the new ones are synced, sentinels
forget them (SENTINEL RESET), and a sentinel quorum is never raised above the sentinels running. Pure."""

from __future__ import annotations

from collections.abc import Sequence

from opsctl.base.errors import RefusedError
from opsctl.plan.facts import Facts
from opsctl.plan.steps import Failover, RemoveNode, SentinelReset, StartNode, Step, WaitConverged
from opsctl.spec.layout import Layout, Node

DRAIN_FIRST = ("the master on a host that no longer holds a server fails over first (graceful, the failover runbook), "
               "never restarted elsewhere; apply then observes again and plans the rest")


def _follows(layout: Layout, node: Node, facts: Facts) -> list[str]:
    """The shard's members that replicate node now (their own ROLE)."""
    shard = layout.shards[0]
    return [m for m in shard.members if m in facts and (r := facts[m].role) is not None
            and r.kind == "replica" and r.master == (node.address, node.port)]


def drain_failovers(layout: Layout, facts: Facts) -> list[Failover]:
    """A graceful failover away from each retired server that is a master now, to a member the spec keeps;
    refused (exit 3) when no kept member follows it: removing it would lose its data."""
    steps = []
    for node in layout.retired:
        f = facts.get(node.name)
        if node.is_sentinel or f is None or f.role is None or f.role.kind != "master":
            continue
        if not _follows(layout, node, facts):
            raise RefusedError(f"{node.name} is the master now and no server the spec keeps replicates it",
                               f"{layout.reason(node.name) or node.name}: removing it would lose its data, and a "
                               "failover needs a synced replica elsewhere",
                               "keep its host in the spec until a replica elsewhere follows it (apply once with "
                               "the host kept and another replica host added), then remove it")
        steps.append(Failover(node.name, f"{layout.reason(node.name) or node.name}: the master now, failed over "
                                         "to a synced member elsewhere first", shard=1))
    return steps


def retire_steps(layout: Layout, facts: Facts, planned: Sequence[Step]) -> list[Step]:
    """The retired nodes' removal (stop, purge, a tombstone record), after a wait when this plan adds servers (they
    sync before the ones they replace go); then SENTINEL RESET when any went or a sentinel still counts more
    replicas or sentinels than the layout has."""
    gone: list[Step] = [RemoveNode(n.name, "stop it, purge its folder, keep its record as a tombstone", purge=True)
                        for n in sorted(layout.retired, key=lambda n: n.is_sentinel)]
    servers = {n.name for n in layout.servers}
    if gone and any(isinstance(s, StartNode) and s.node in servers for s in planned):
        gone.insert(0, WaitConverged(layout.nodes[0].name, "wait until the new replicas synced, before the nodes "
                                                           "they replace go"))
    fresh = {s.node for s in planned if isinstance(s, StartNode) and (s.node not in facts
                                                                        or facts[s.node].recorded_digest is None)}
    adding = (len(fresh & set(layout.shards[0].replicas)), len(fresh & {n.name for n in layout.sentinels}))
    stale = stale_sentinels(layout, facts, adding)
    if layout.sentinels and (any(isinstance(s, RemoveNode) for s in gone) or stale):
        why = f"{', '.join(stale)} count nodes that are gone" if stale else "forget the nodes removed"
        gone.append(SentinelReset(layout.sentinels[0].name, f"{why}: SENTINEL RESET, one sentinel at a time"))
    return gone


def stale_sentinels(layout: Layout, facts: Facts, adding: tuple[int, int] = (0, 0)) -> list[str]:
    """Running sentinels that will count more replicas or sentinels than the layout has once the plan's new ones
    (adding: replicas, sentinels) joined: removed or dead ones not forgotten (a dead host's nodes replaced at a new
    address stay counted at the old one)."""
    replicas, sentinels = len(layout.shards[0].replicas), len(layout.sentinels)
    return [n.name for n in layout.sentinels if n.name in facts and (k := facts[n.name].sentinel_knows)
            and (k[0] + adding[0] > replicas or k[1] + adding[1] > sentinels)]

