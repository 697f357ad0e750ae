"""(spec, observed facts) -> Plan. Pure: no I/O, every step with its reason.

This module orders the phases: the refusals (refusals), each shard's steps in rolling order (rolling, node_steps),
the topology's own (cluster_steps, replication_steps), password rotation, the closing wait. Repairs of a killed run
that decide who takes writes are planned alone first; apply plans the rest after them."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from opsctl.cluster.deadnodes import forget_dead, promote_orphans
from opsctl.cluster.formation import cluster_steps, rejoins
from opsctl.metrics.exporter import exporter_steps
from opsctl.observe.replies import LINE_ID
from opsctl.plan.desired import DesiredNode
from opsctl.plan.facts import Facts, fingerprint
from opsctl.plan.masters import current_master
from opsctl.plan.refusals import (
    refuse_bus_port_clash,
    refuse_empty_master_restart,
    refuse_empty_master_start,
    refuse_layout_change,
    refuse_removed_hosts,
    refuse_unsafe_server_change,
)
from opsctl.plan.replication import finish_failover_steps, replication_steps, with_sentinel_steps
from opsctl.plan.replshape import DRAIN_FIRST as REPLICATED_DRAIN_FIRST
from opsctl.plan.replshape import drain_failovers as replicated_drains
from opsctl.plan.replshape import retire_steps
from opsctl.plan.rolling import maintenance_failovers, refuse_unmovable, shard_steps
from opsctl.plan.rotation import after_rotation, rotation_steps
from opsctl.plan.servers import renames_changed
from opsctl.plan.shape import DRAIN_FIRST, drain_failovers, summary, synced_before_retiring, with_placement_reasons
from opsctl.plan.steps import AssignSlots, CloseSlots, Failover, FormCluster, Plan, RestartNode, Step, WaitConverged
from opsctl.server.versions import Version, parse_version
from opsctl.spec.layout import Layout
from opsctl.spec.load import LoadedSpec


def make_plan(loaded: LoadedSpec, desired: Mapping[str, DesiredNode], facts: Facts, spec_digest: str,
              filling: Collection[int] = ()) -> Plan:
    """filling: the shards a scale-out was filling when its run stopped (the slot journal's, read by the shell)."""
    layout = loaded.layout
    server = (loaded.spec.server.flavor, parse_version(loaded.spec.server.version))
    _refuse_unsafe(loaded, facts, server)
    if loaded.spec.topology in ("replication", "sentinel") and (drains := replicated_drains(layout, facts)):
        return _repairs_first(loaded, drains, REPLICATED_DRAIN_FIRST, facts, spec_digest)
    if loaded.spec.topology == "cluster":
        refuse_layout_change(layout, facts)
        refuse_bus_port_clash(layout, facts)
        if promotions := promote_orphans(loaded, facts):
            return _repairs_first(loaded, promotions, PROMOTE_FIRST, facts, spec_digest)
        if failovers := drain_failovers(loaded.spec, layout, facts):
            return _repairs_first(loaded, failovers, DRAIN_FIRST, facts, spec_digest)
    together = renames_changed(layout, desired, facts)
    steps: list[Step] = []
    for shard in layout.shards:
        steps += shard_steps(layout, shard, desired, facts, server, together, loaded.spec.topology)
    topology = loaded.spec.topology
    waiting = _masters_coming_back(layout, facts) if topology == "cluster" else []
    if waiting:
        return _start_first(loaded, steps, waiting, facts, spec_digest)
    if topology != "standalone":  # after the shards' config steps: the held hosts' replicas are never promoted
        steps += maintenance_failovers(loaded.spec, layout, facts, {s.node for s in steps if isinstance(s, Failover)})
    moving = {s.node for s in steps if isinstance(s, Failover)}
    replan = False
    if topology == "cluster":
        cluster = cluster_steps(layout, facts, moving, filling)
        repairs = [s for s in cluster if isinstance(s, (AssignSlots, CloseSlots))]
        if moving and repairs:
            return _repairs_first(loaded, repairs, SLOTS_FIRST, facts, spec_digest)
        closing = any(isinstance(s, CloseSlots) for s in repairs)  # the moves are planned once nothing is open
        if closing and any(shard.index in filling for shard in layout.shards):
            return _repairs_first(loaded, repairs, FILL_AFTER_REPAIRS, facts, spec_digest)
        steps += [*synced_before_retiring(loaded.spec, layout, cluster), *forget_dead(layout, facts)]
        replan = closing
    elif topology in ("replication", "sentinel"):
        finish = finish_failover_steps(layout, facts)
        if finish and any(isinstance(s, RestartNode) for s in steps):
            return _repairs_first(loaded, finish, FINISH_FIRST, facts, spec_digest)
        steps += finish + replication_steps(layout, facts, moving)
    if topology == "sentinel":
        steps = with_sentinel_steps(loaded, desired, facts, steps, moving)
    if topology in ("replication", "sentinel"):
        steps += retire_steps(layout, facts, steps)
    rotation = rotation_steps(loaded, desired, facts)
    steps = rotation + after_rotation(rotation, steps)
    steps += _closing_wait(layout, topology, facts, steps)
    steps += exporter_steps(loaded, desired, facts)  # last: an exporter needs its node's files and user, not more
    notes = (CLOSE_THEN_MOVES,) if replan else () if steps else (_why_nothing(loaded, facts),)
    steps = with_placement_reasons(layout, steps)
    return Plan(loaded.spec.name, spec_digest, fingerprint(facts), tuple(steps), notes, replan=replan,
                summary=summary(layout, facts, steps))


def _refuse_unsafe(loaded: LoadedSpec, facts: Facts, server: tuple[str, Version]) -> None:
    """The refusals every topology's plan starts with (a cluster's own follow in make_plan)."""
    refuse_unsafe_server_change(facts, server)
    refuse_empty_master_restart(loaded, facts)
    refuse_empty_master_start(loaded, facts)
    if loaded.spec.topology != "standalone":
        refuse_removed_hosts(loaded.layout)
        refuse_unmovable(loaded.spec, loaded.layout)


def _closing_wait(layout: Layout, topology: str, facts: Facts, steps: Sequence[Step]) -> list[Step]:
    """The plan's last wait: until every node agrees after steps; with no step, until what a stopped run left
    settles (cluster_state, gossip, replica links, sentinel counts); none where a FormCluster waits itself."""
    first = layout.nodes[0].name
    if topology != "standalone" and steps and not isinstance(steps[-1], FormCluster):  # it waits itself
        return [WaitConverged(first, "wait until every node agrees")]
    if steps:
        return []
    if topology == "cluster" and (settling := _settling(layout, facts)):
        return [WaitConverged(first, f"formed, but cluster_state is not ok yet on {', '.join(settling)} (a run "
                              "stopped before it settled): wait until it is")]
    if topology == "cluster" and (unaware := _unaware(layout, facts)):
        return [WaitConverged(first, f"{', '.join(unaware)} not known to every node yet (a run stopped before "
                              "gossip spread them): wait until every node knows them")]
    if topology != "cluster" and (linking := _linking(layout, facts)):
        return [WaitConverged(first, f"{', '.join(linking)} not linked to the master yet (started a moment ago, "
                              "or a run stopped before it settled): wait until linked")]
    if topology == "sentinel" and (recounting := _recounting(layout, facts)):
        return [WaitConverged(first, f"{', '.join(recounting)} count fewer replicas or sentinels than run (a run "
                              "stopped after a SENTINEL RESET): wait until they count them again (hellos every "
                              "2 s, the master's INFO every 10 s)")]
    return []


def _masters_coming_back(layout: Layout, facts: Facts) -> list[str]:
    """Shard masters that are down and come back by themselves from their nodes.conf (a whole shard or the whole
    cluster was stopped): until they run, their slots look unowned and the cluster looks unformed."""
    masters = [current_master(shard, layout, facts) for shard in layout.shards]
    return [m for m in masters if rejoins(layout.node(m), facts)]


def _start_first(loaded: LoadedSpec, steps: list[Step], waiting: list[str], facts: Facts, spec_digest: str) -> Plan:
    """Only the down nodes' steps now (they start and rejoin with their slots and data); apply observes again
    once they run and plans the rest (config changes, joins, replicas, slot moves, the wait) from what it sees."""
    note = (f"{', '.join(waiting)} {'is a shard master' if len(waiting) == 1 else 'are shard masters'} that "
            "stopped with the cluster's nodes.conf: started first, they rejoin with their slots and data; "
            "apply then observes again and plans the rest")
    first = tuple(s for s in steps if not facts[s.node].running)
    return Plan(loaded.spec.name, spec_digest, fingerprint(facts), first, (note,), replan=True)


SLOTS_FIRST = ("slots a killed run left open or unserved are repaired first: a failover refuses while slots are "
               "open, and the repair decides which masters take writes; apply then observes again and plans the rest")
FILL_AFTER_REPAIRS = ("slots a killed run left open are closed first: the moves that finish its scale-out are "
                      "planned from what closing leaves; apply then observes again and plans them")
CLOSE_THEN_MOVES = ("slots a killed run left open are closed in this plan; the moves and removals still to make (a "
                    "scale-in's drain, say) are planned from what closing leaves: apply then observes again and "
                    "plans them")
PROMOTE_FIRST = ("the shards whose master went with its host get a master first: without a majority of masters the "
                 "cluster cannot elect one (nor with one, past a replica's election limit); apply then observes "
                 "again and replaces the host's nodes (start, join, replicate, forget the dead ids)")
FINISH_FIRST = ("the interrupted failover is finished first: a restart would lift its fence (two masters taking "
                "writes), and finishing it decides the master; apply then observes again and plans the rest")


def _repairs_first(loaded: LoadedSpec, repairs: Sequence[Step], note: str, facts: Facts, spec_digest: str) -> Plan:
    """Only the repairs of what a killed run left, when the plan also restarts nodes (in a cluster: fails masters
    over) or closes slots while a scale-out is unfinished; apply observes again once they ran and plans the rest.
    Why: they decide who takes which writes (the rolling order, the failover before a restart, the master a step
    names), and a scale-out's moves are planned from what closing leaves."""
    return Plan(loaded.spec.name, spec_digest, fingerprint(facts), tuple(repairs), (note,), replan=True)


def _settling(layout: Layout, facts: Facts) -> list[str]:
    """Cluster nodes that answer but do not report cluster_state ok (yet)."""
    return [n.name for n in layout.servers
            if facts[n.name].reachable and facts[n.name].info.get("cluster_state", "ok") != "ok"]


def _linking(layout: Layout, facts: Facts) -> list[str]:
    """Replicas that answer, but whose link to their master is not up (yet)."""
    return [n.name for n in layout.servers
            if facts[n.name].reachable and (r := facts[n.name].role) and r.kind == "replica" and r.link != "connected"]


def _unaware(layout: Layout, facts: Facts) -> list[str]:
    """Running cluster nodes some other running node does not list yet (gossip still spreading a node the cluster
    met: every node learns it within a few pings)."""
    ids = {n.name: me.id for n in layout.servers if facts[n.name].reachable and (me := facts[n.name].myself)}
    named = {node_id: name for name, node_id in ids.items()}
    unknown: set[str] = set()
    for name in ids:  # set differences, not a loop over every pair: n views of n nodes at 1000 nodes
        unknown |= named.keys() - set(map(LINE_ID, facts[name].cluster_nodes or ()))
    return sorted(named[node_id] for node_id in unknown)


def _recounting(layout: Layout, facts: Facts) -> list[str]:
    """Sentinels that answer but count fewer replicas or sentinels than run: reset, still learning them again."""
    replicas = sum(1 for n in layout.shards[0].replicas if facts[n].running)
    sentinels = sum(1 for n in layout.sentinels if facts[n.name].running)
    return [n.name for n in layout.sentinels if facts[n.name].reachable and (k := facts[n.name].sentinel_knows)
            and (k[0] < replicas or k[1] < sentinels)]


def _why_nothing(loaded: LoadedSpec, facts: Facts) -> str:
    count = len(facts)
    nodes = "the node runs, its config matches" if count == 1 else f"all {count} nodes run, their configs match"
    return (f"nothing to do: {nodes} the spec, "
            f"and the {loaded.spec.topology} topology is formed (roles inside a shard are not drift)")
