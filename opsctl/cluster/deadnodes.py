"""Dead cluster nodes (issue 22, item 4): ids the running nodes flag as failed at an endpoint no node of the spec
has (a host replaced: its old address is gone with its nodes), or at a spec node's endpoint whose identity went with
its folder (a new machine at a dead host's address), are forgotten everywhere. A shard whose slots only such a
failed master holds: its replica is promoted (TAKEOVER) when the masters that answer are no majority (issue 33,
item 3), waited for when they are one, and a shard with no member left is refused with the way on. Pure."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from opsctl.base.errors import RefusedError
from opsctl.failover.promotion import (
    PING_GRACE_S,
    PING_PERIOD,
    choose_promotable,
    promotable_offsets,
    promotion_prechecks,
)
from opsctl.failover.verdicts import Target
from opsctl.observe.cluster_state import voting_masters
from opsctl.observe.replies import ClusterNodeLine, lines_where
from opsctl.plan.desired import rendered_values
from opsctl.plan.facts import Facts, NodeFacts
from opsctl.plan.steps import ForgetNodes, PromoteReplica
from opsctl.slots import ranges
from opsctl.spec.layout import Layout, Node, Shard, split_endpoint
from opsctl.spec.load import LoadedSpec


def dead_nodes(layout: Layout, facts: Facts) -> dict[str, str]:
    """id -> endpoint of every node that serves no slot, is gone (_gone: no node of the spec, nothing to wait for)
    and that a running server flags fail or fail? (not yet agreed), or, at an address no node of the spec or retired
    one has, has no link to: the members of a killed host go failing one by one (each after node_timeout without a
    PONG), and one not flagged yet when apply looks would be left known everywhere."""
    gone, down = _gone(layout, facts), _down(layout)
    found: dict[str, str] = {}
    for line in lines_where((f.cluster_nodes for f in facts.values()),
                            lambda line: down(line) and not line.slots and gone(line.endpoint, line.id)):
        found[line.id] = line.endpoint
    return found


def _down(layout: Layout) -> Callable[[ClusterNodeLine], bool]:
    """Whether a running node's view counts a peer as down: flagged fail or fail?, or, at an address no node of the
    spec or retired one has, not linked to (nothing there to come back)."""
    ours = {n.endpoint for n in (*layout.servers, *layout.retired)}
    return lambda line: line.is_failing or (line.link_state != "connected" and line.endpoint not in ours
                                            and not line.is_myself)


def _gone(layout: Layout, facts: Facts) -> Callable[[str, str], bool]:
    """Whether a failing (endpoint, id) is a node that will never answer: at an endpoint none of the layout's servers
    or retired nodes has, or at one whose node has another identity now: it runs with another id, or it is down and
    has no record (its folder went with its machine: a new machine at the dead host's address). A node that is down
    with its record comes back with its nodes.conf, its id unchanged."""
    ours = {n.endpoint for n in (*layout.servers, *layout.retired)}
    now: dict[str, str | None] = {}
    for node in layout.servers:
        f = facts.get(node.name)
        if f is not None and f.running and f.myself is not None:
            now[node.endpoint] = f.myself.id
        elif f is not None and not f.running and f.recorded_digest is None:
            now[node.endpoint] = None
    return lambda endpoint, node_id: endpoint not in ours or (endpoint in now and now[endpoint] != node_id)


def forget_dead(layout: Layout, facts: Facts) -> list[ForgetNodes]:
    """One CLUSTER FORGET step for the dead nodes (after the replacements joined: they learn the cluster's view)."""
    dead = dead_nodes(layout, facts)
    if not dead:
        return []
    where = ", ".join(sorted(set(dead.values())))
    return [ForgetNodes(layout.servers[0].name, f"{len(dead)} failed node(s) at {where}, gone with their machine "
                                                "(an address no node of the spec has, or a node there with a new "
                                                "identity): forgotten on every node", tuple(sorted(dead)))]


def promote_orphans(loaded: LoadedSpec, facts: Facts) -> list[PromoteReplica]:
    """The shards whose master went with its host (it serves slots, is down and gone: _lost), as (issue 33, item 3):
    - refused where no member of the shard answers: its data is gone from the fleet (restore it from a backup);
    - without a majority of slot-owning masters answering: a TAKEOVER of the replica holding the most of the master's
      stream (on another host if possible), judged by the forced promotion's checks (master-down, most-data): nobody
      can elect it;
    - with a majority: the cluster elects a replica by itself once they flag the master fail, but only while the
      replica's link has been down no longer than its election limit (_election_limit). A shard past it (a run
      promoted another shard, then stopped: the majority came back too late) gets a CLUSTER FAILOVER FORCE: it holds
      a vote the majority can pass, and skips the data-age check that keeps the replica from asking. Any other shard
      is waited for, as before."""
    layout = loaded.layout
    lost = lost_masters(layout, facts)
    if not lost:
        return []
    orphans = {dead: _orphaned(layout, facts, dead) for dead in lost}
    bare = [dead for dead, replicas in orphans.items() if not any(facts[r].reachable for r in replicas)]
    if bare:
        raise _no_member_left(layout, facts, [lost[dead] for dead in bare], orphans)
    votes = _voters(facts)
    majority = votes[0] > votes[1] // 2
    chosen = sorted(d for d in lost if _past_election(loaded, facts, orphans[d])) if majority else sorted(lost)
    if not chosen:
        raise _wait_for_election(loaded, facts, list(lost.values()), orphans, votes)
    return [_promotion(loaded, facts, lost[dead], orphans[dead], votes, majority) for dead in chosen]


def _wait_for_election(loaded: LoadedSpec, facts: Facts, lines: list[ClusterNodeLine],
                       orphans: dict[str, list[str]], votes: tuple[int, int]) -> RefusedError:
    where = ", ".join(sorted({line.endpoint for line in lines}))
    limit = max(_election_limit(loaded, loaded.layout.node(r)) for line in lines for r in orphans[line.id])
    return RefusedError(f"slots are served only by failed node(s) at {where}: their replica is not promoted yet",
                        f"{votes[0]} of {votes[1]} slot-owning masters answer, a majority: the cluster promotes a "
                        "replica by itself once they flag the master fail; starting a replacement there now "
                        "would serve those slots empty",
                        "wait for the cluster to promote a replica (cluster.node_timeout_ms) and apply again; a "
                        f"replica whose link is down longer than {limit:g} s is never elected (cluster."
                        "replica_validity_factor): apply then promotes it itself")


def _election_limit(loaded: LoadedSpec, replica: Node) -> float:
    """Seconds a replica's link to its master may be down and the replica still ask for an election: the server
    computes the data age on the replica, from its own settings (node timeout subtracted as the baseline),
    and asks no more once it passes ping period + node timeout x validity factor. inf with a factor of 0 (no limit)."""
    values = rendered_values(loaded, replica, {PING_PERIOD: "10", NODE_TIMEOUT: "15000", VALIDITY: "10"})
    factor, timeout_s = float(values[VALIDITY]), float(values[NODE_TIMEOUT]) / 1000
    return float(values[PING_PERIOD]) + timeout_s * (factor + 1) if factor else float("inf")


def _past_election(loaded: LoadedSpec, facts: Facts, replicas: list[str]) -> bool:
    """Every orphaned replica that answers has had its link down past its election limit: none asks for a vote."""
    def past(name: str) -> bool:
        down = facts[name].info.get("master_link_down_since_seconds", "")
        return down.isdigit() and float(down) > _election_limit(loaded, loaded.layout.node(name))
    answering = [r for r in replicas if facts[r].reachable]
    return bool(answering) and all(past(r) for r in answering)


NODE_TIMEOUT = "cluster-node-timeout"
VALIDITY = "cluster-replica-validity-factor"


def lost_masters(layout: Layout, facts: Facts) -> dict[str, ClusterNodeLine]:
    """id -> line of each master serving slots that is down and gone, as the running nodes list it; not where a master
    that answers claims all those slots in its own view (a promotion gossip is still spreading)."""
    gone, down = _gone(layout, facts), _down(layout)  # the others come back from their nodes.conf
    failed = list(lines_where((f.cluster_nodes for f in facts.values()), lambda line: down(line) and line.is_master
                              and bool(line.slots) and gone(line.endpoint, line.id)))
    if not failed:  # a healthy cluster: no slot to add up
        return {}
    claimed = {s for f in facts.values() if f.reachable and (me := f.myself) and me.is_master
               for s in ranges.expand(me.slots)}
    return {line.id: line for line in failed if not set(ranges.expand(line.slots)) <= claimed}


def _orphaned(layout: Layout, facts: Facts, dead: str) -> list[str]:
    """The spec's servers that replicate the dead master: each answering one by its own view, each silent one that
    comes back (not gone) by another's view (it may hold more of the stream: most-data waits for it)."""
    gone = _gone(layout, facts)
    named = {line.endpoint for f in facts.values() for line in f.cluster_nodes or ()
             if line.master_id == dead and not gone(line.endpoint, line.id)}
    return [n.name for n in layout.servers if (f := facts.get(n.name)) is not None
            and (((me := f.myself) is not None and me.master_id == dead) or (not f.reachable and n.endpoint in named))]


def _voters(facts: Facts) -> tuple[int, int]:
    """(slot-owning masters that answer, slot-owning masters) as the running nodes see them."""
    answering, serving = voting_masters(f.cluster_nodes for f in facts.values() if f.reachable and f.cluster_nodes)
    return len(answering), len(serving)


def _promotion(loaded: LoadedSpec, facts: Facts, dead: ClusterNodeLine, replicas: list[str], votes: tuple[int, int],
               majority: bool) -> PromoteReplica:
    """The promotion of the replica the forced promotion would choose, judged as it would be: the shard seen with
    the dead master at its old endpoint (the spec now puts its replacement elsewhere, or a new machine there), as
    the shell's probe of that endpoint found it (gone_probes: silent where nothing was probed)."""
    layout = loaded.layout
    shard = layout.shard_of(replicas[0])
    index = shard.index if shard else 0
    label = dead.endpoint
    host = next((n.host for n in layout.servers if n.address == dead.address), "(gone)")  # a new machine there
    was = Node(label, host, dead.address, dead.port, "master", index)
    judged = Shard(index, label, tuple(replicas))
    view = replace(layout, nodes=(*layout.nodes, was),
                   shards=tuple(judged if s.index == index else s for s in layout.shards))
    seen = {**facts, label: facts.get(label, NodeFacts(label, False))}
    ping_period = master_ping_period(loaded, label, shard)
    target = Target(index, label, choose_promotable(view, judged, label, seen))
    failing = [c for c in promotion_prechecks(view, seen, target, ping_period) if not c.passed]
    if failing:
        raise RefusedError(f"shard {index}: its master at {label} is gone with its host, and the cluster "
                           f"{'does not elect' if majority else 'cannot elect'} a replica ({votes[0]} of {votes[1]} "
                           "slot-owning masters answer), but opsctl cannot promote one either",
                           "; ".join(c.line() for c in failing),
                           UNPROMOTABLE[failing[0].name].format(period=ping_period + PING_GRACE_S)
                           if failing[0].name in UNPROMOTABLE else failing[0].hint)
    assert target.replica is not None  # most-data fails without one
    offsets = promotable_offsets(view, judged, seen, label)
    slots = ranges.text(dead.slots)
    why = (f"{votes[0]} of {votes[1]} slot-owning masters answer, but the replicas' link has been down past the "
           "time the cluster elects one (cluster.replica_validity_factor). CLUSTER FAILOVER FORCE"
           if majority else f"only {votes[0]} of {votes[1]} slot-owning masters answer: no majority is left to "
           f"elect a replica (it needs {votes[1] // 2 + 1}). CLUSTER FAILOVER TAKEOVER")
    return PromoteReplica(target.replica, f"shard {index}'s master at {label} (slots {slots}) is gone with its host, "
                          f"and {why} on {target.replica}, the replica holding the most of its stream (offset "
                          f"{offsets[target.replica]}): writes the master acknowledged past it reached no replica",
                          index, dead.id, label, slots, "force" if majority else "takeover")


def master_ping_period(loaded: LoadedSpec, was: str, shard: Shard | None) -> float:
    """The repl-ping-replica-period of the spec's node the dead master at endpoint was is (the master pings, and a
    node may override it): the spec's server at that endpoint, else its shard's declared master on its port (the
    host readdressed), else the shard's declared master."""
    layout = loaded.layout
    at = next((n for n in layout.servers if n.endpoint == was), None)
    port = (split_endpoint(was) or ("", 0))[1]
    declared = layout.node(shard.master) if shard else None
    node = at or (declared if declared and declared.port == port else None) or declared or layout.servers[0]
    return float(rendered_values(loaded, node, {PING_PERIOD: "10"})[PING_PERIOD])


# The way on when a check the forced failover shares refuses the promotion (its own hints name failover's options).
UNPROMOTABLE = {
    "master-down": "that master answers opsctl at its old address, or a replica still hears it: it runs, and its "
                   "host is not gone (a promotion beside it makes two masters taking writes). Stop it, or give its "
                   "host its address back in the spec; a master that has stopped is heard of no more within "
                   "{period:g} s of its last word (repl-ping-replica-period), then apply again",
    "most-data": "start the replicas of that shard that do not answer (one of them may hold more of the stream), "
                 "then apply again",
}


def _no_member_left(layout: Layout, facts: Facts, lines: list[ClusterNodeLine],
                    orphans: dict[str, list[str]]) -> RefusedError:
    where = "; ".join(f"{_shard_named(layout, facts, line, orphans[line.id])}slots {ranges.text(line.slots)} at "
                      f"{line.endpoint}" for line in sorted(lines, key=lambda line: line.endpoint))
    silent = sorted({r for line in lines for r in orphans[line.id]})
    start = f"if {', '.join(silent)} (its replica, down) still has its data, start it (or its host) and apply " \
        "again; otherwise " if silent else ""
    return RefusedError(f"a shard has no member left that answers: {where}, served only by a failed master gone with "
                        "its host", "starting a replacement there would serve those slots empty",
                        f"{start}restore that shard from a backup (opsctl restore, docs/backup.md), then "
                        "apply again")


def _shard_named(layout: Layout, facts: Facts, line: ClusterNodeLine, replicas: list[str]) -> str:
    """"shard N: " where the spec tells which: a replica of the dead master, a node of the spec at its endpoint, or the
    one shard every member of which is down without a record (gone with their machines)."""
    node = next((n.name for n in layout.servers if n.endpoint == line.endpoint), None)
    shard = layout.shard_of(replicas[0] if replicas else node or "")
    fresh = [s for s in layout.shards if all((f := facts.get(m)) is not None and not f.running
                                             and f.recorded_digest is None for m in s.members)]
    shard = shard or (fresh[0] if len(fresh) == 1 else None)
    return f"shard {shard.index}: " if shard else ""
