"""The steps of a replication or Sentinel topology changing shape (plan.replshape): a retired node stopped, purged
and kept as a tombstone; the sentinels told to forget it (SENTINEL RESET), one at a time, each waited for until it
knows the fleet again, so the others keep a quorum meanwhile. In a cluster: dead nodes forgotten everywhere, and the
replica of a master gone with its host promoted (TAKEOVER) when no majority is left to elect it."""

from __future__ import annotations

from functools import partial

from opsctl.base.errors import NodeRefused, OpsctlError, RefusedError, is_auth_failure
from opsctl.base.events import Log
from opsctl.base.poll import Pending, wait_for
from opsctl.net.connection import Connection
from opsctl.observe.cluster_state import voting_masters
from opsctl.observe.replies import CLUSTER_NODES, ROLE, ClusterNodeLine, info, myself
from opsctl.plan.facts import NodeFacts
from opsctl.plan.steps import ForgetNodes, PromoteReplica, RemoveNode, SentinelReset
from opsctl.runtime.execution import Execution
from opsctl.slots import ranges
from opsctl.spec.layout import Layout, Node, sentinel_master_name


def remove_replicated(run: Execution, step: RemoveNode) -> None:
    """Stop a retired server or sentinel, then purge it (its record stays as a tombstone). A server that is a master
    with replicas is refused: the plan fails it over first, and a failover since the plan was made would have
    moved the writes to it."""
    from opsctl.apply.slot_steps import retire, stop_leaving  # with the failover machinery: only when a node goes
    from opsctl.failover.actions import checkpoint

    rt = run.rt
    node = Layout(rt.loaded.layout.retired).find(step.node)
    if node is None:
        raise OpsctlError(f"cannot find the retired node {step.node}", hint="plan again")
    if not node.is_sentinel and rt.provider.process_state(node).running:
        _refuse_serving_master(rt.connections[node.name], node)
    stop_leaving(rt, node)
    checkpoint("remove-node-stopped")
    retire(rt, node)


def _refuse_serving_master(handle: Connection, node: Node) -> None:
    role = handle.read(ROLE)
    if role.kind == "master" and role.replicas:
        raise RefusedError(f"{node.name} is a master with {len(role.replicas)} replica(s) now",
                           "removing it would stop the shard's writes and drop what only it holds",
                           "apply again: the plan fails it over first")


def sentinel_reset(run: Execution, step: SentinelReset) -> None:
    """SENTINEL RESET on each running sentinel in turn, each waited for until it counts the running sentinels again
    (hellos, every 2 s) before the next one forgets, so a majority always knows its peers; then until every one
    counts the running replicas again (its next INFO to the master, every 10 s: waited for in parallel, not per
    sentinel)."""
    from opsctl.failover.actions import checkpoint

    rt = run.rt
    layout = rt.loaded.layout
    name = sentinel_master_name(rt.loaded.spec)
    running = [n for n in layout.nodes if rt.provider.process_state(n).running]
    replicas = sum(1 for n in running if n.name in layout.shards[0].replicas)
    sentinels = [n for n in running if n.is_sentinel]
    handles = [rt.connections[n.name] for n in sentinels]
    for node, handle in zip(sentinels, handles, strict=True):
        handle.call("SENTINEL", "RESET", name)
        wait_for(partial(_knows, [handle], None, len(sentinels)), run.wait_timeout,
                 f"{node.name} to count {len(sentinels)} sentinel(s) again after SENTINEL RESET", interval=0.1)
        checkpoint("sentinel-reset-one")
    wait_for(partial(_knows, handles, replicas, len(sentinels)), run.wait_timeout,
             f"the sentinels to count {replicas} replica(s) again after SENTINEL RESET", interval=0.1)


def _knows(handles: list[Connection], replicas: int | None, sentinels: int) -> bool | Pending:
    """Every handle's sentinel counts `sentinels` sentinels (itself included) and, unless None, `replicas`
    replicas."""
    for handle in handles:
        sentinel = handle.read(info("sentinel"))
        knows = NodeFacts("sentinel", True, info=sentinel).sentinel_knows
        if knows is None or knows[1] != sentinels or (replicas is not None and knows[0] != replicas):
            seen = f"{knows[0]} replica(s) and {knows[1]} sentinel(s)" if knows else "no master"
            return Pending(f"{handle.endpoint} counts {seen}")
    return True


def forget_nodes(run: Execution, step: ForgetNodes) -> None:
    """CLUSTER FORGET of the dead ids on every running node, side by side (a node that still knows one would gossip
    it back to the others once their 60 s ban ends), repeated until no running node knows any of them."""
    from opsctl.apply.slot_steps import _forget
    from opsctl.failover.actions import checkpoint
    from opsctl.slots.session import open_session

    dead = set(step.ids)
    with open_session(run.rt.connector) as session:
        def forgotten() -> bool | Pending:
            peers = list(session.peers.values())
            session.parallel(lambda p: _forget(p, dead), peers)
            checkpoint("forget-nodes-once")
            session.refresh()
            knowing = sorted(name for name, view in session.views().items() if dead & {line.id for line in view})
            return True if not knowing else Pending(f"{', '.join(knowing)} still know them")

        wait_for(forgotten, run.wait_timeout, f"every node to forget {len(dead)} dead node(s)", interval=0.2)


def _ask_failover(run: Execution, handle: Connection, step: PromoteReplica) -> None:
    """CLUSTER FAILOVER on the replica. One the cluster elected between the look and the ask (an earlier promotion
    gave it its majority back) refuses: "You should send CLUSTER FAILOVER to a replica". A master now, it is done."""
    try:
        handle.call("CLUSTER", "FAILOVER", step.mode.upper())
    except NodeRefused:
        view = handle.read(CLUSTER_NODES)
        now = myself(view)
        if now is None or not now.is_master:
            raise
        run.emit(Log(step.title(), f"{step.node} was elected by the cluster meanwhile, not promoted"))


def promote_replica(run: Execution, step: PromoteReplica) -> None:
    """CLUSTER FAILOVER TAKEOVER on the replica the plan chose, unless it is a master already (a run killed after it
    asked: never asked twice), then until it answers as a master and a majority of the slot-owning masters' views give
    it the dead master's slots. One that follows another master now is left alone: done when that master serves the
    gone one's slots (the cluster elected it once an earlier promotion gave it a majority), else refused (the roles
    changed since the plan)."""
    from opsctl.failover.actions import checkpoint
    from opsctl.slots.session import open_session

    handle = run.rt.connections[step.node]
    view = handle.read(CLUSTER_NODES)
    me = myself(view)
    wanted = set(ranges.expand(ranges.parse(step.slots)))
    elected = _elected_meanwhile(view, me, step, wanted)
    if me is None or (not me.is_master and me.master_id != step.dead and elected is None):
        raise RefusedError(f"{step.node} is no longer a replica of the gone master at {step.was}",
                           f"it is {'not in a cluster' if me is None else 'a replica of ' + str(me.master_id)} "
                           "now: the shard's roles changed since the plan was made",
                           "apply again: it plans from the roles now")
    if elected is not None:
        # an earlier promotion gave the cluster its majority back, and it elected this shard's master itself
        at = f"{elected.address}:{elected.port}"
        run.emit(Log(step.title(), f"shard {step.shard} got a master meanwhile ({at}, elected by the cluster), "
                     "not promoted"))
    elif not me.is_master:
        _refuse_live_master(run, handle, step)
        _ask_failover(run, handle, step)
        checkpoint("promote-replica-asked")
    node_id = me.id if elected is None else elected.id
    with open_session(run.rt.connector) as session:
        def promoted() -> bool | Pending:
            session.refresh()
            return _owns_in_majority(session.views(), node_id, wanted, step.node)

        wait_for(promoted, run.wait_timeout, f"{step.node} to serve shard {step.shard}'s slots as a master in a "
                 "majority of the masters' views", interval=0.05)


def _elected_meanwhile(view: list[ClusterNodeLine], me: ClusterNodeLine | None, step: PromoteReplica,
                       wanted: set[int]) -> ClusterNodeLine | None:
    """The master this replica follows now, when that is not the gone one and it claims the gone master's slots:
    the shard was healed by an election of its own (step 1 of 2 gave the masters their majority back)."""
    if me is None or me.is_master or me.master_id in (None, step.dead):
        return None
    master = next((line for line in view if line.id == me.master_id), None)
    owns = master is not None and master.is_master and wanted <= set(ranges.expand(master.slots))
    return master if owns else None


def _refuse_live_master(run: Execution, handle: Connection, step: PromoteReplica) -> None:
    """The master-down check again, just before the promotion (a saved plan, or a step after another one's wait:
    the plan's fingerprint leaves link states out): refused if the old master answers opsctl at its endpoint, or the
    replica heard it within its ping period."""
    from opsctl.cluster.deadnodes import master_ping_period
    from opsctl.failover.promotion import PING_GRACE_S
    from opsctl.runtime.gather import gone_probe

    loaded = run.rt.loaded
    period = master_ping_period(loaded, step.was, loaded.layout.shard_of(step.node)) + PING_GRACE_S
    replication = handle.read(info("replication"))
    last_io = replication.get("master_last_io_seconds_ago", "")
    heard = replication.get("master_link_status") == "up" and last_io.isdigit() and float(last_io) <= period
    probe = gone_probe(run.rt, step.was)
    if heard or probe.reachable or is_auth_failure(probe.error):
        how = f"{step.node} heard from it {last_io} s ago" if heard else f"it answers at {step.was}"
        raise RefusedError(f"{step.node} is not promoted: its master at {step.was} runs", f"{how} (the plan took it "
                           "for gone): a promotion beside it makes two masters taking writes",
                           "stop it, or give its host its address back in the spec; a master that has stopped is "
                           f"heard of no more within {period:g} s of its last word, then apply again")


def _owns_in_majority(views: dict[str, list[ClusterNodeLine]], node_id: str, wanted: set[int],
                      name: str) -> bool | Pending:
    """node_id is a master serving every wanted slot in its own view and in more than half of the views of the
    masters that serve slots (the voters of any later election; cluster_size counts each one once)."""
    answering, serving = voting_masters(views.values())
    voters = [view for view in views.values() if (me := myself(view)) is not None and me.id in answering]
    agree = [view for view in voters if any(
        line.id == node_id and line.is_master and wanted <= set(ranges.expand(line.slots)) for line in view)]
    if node_id in answering and len(agree) > len(serving) // 2:
        return True
    return Pending(f"{name} serves the slots in {len(agree)} of {len(serving)} slot-owning masters' views"
                   + ("" if node_id in answering else ", and not yet in its own"))
