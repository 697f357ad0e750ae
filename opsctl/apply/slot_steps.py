"""What the executor runs for AssignSlots, MoveSlots, CloseSlots and RemoveNode steps (the engines live beside)."""

from __future__ import annotations

from collections.abc import Iterable

from opsctl.base.errors import OpsctlError, RefusedError
from opsctl.base.events import Emit, Log
from opsctl.failover.actions import checkpoint
from opsctl.net.topolock import stopping, topology_lock
from opsctl.plan.steps import AssignSlots, CloseSlots, MoveSlots, RemoveNode
from opsctl.runtime.opening import Runtime
from opsctl.slots.balance import Move
from opsctl.slots.fix import close_in_session, cover
from opsctl.slots.journal import Journal
from opsctl.slots.members import find_node
from opsctl.slots.progress import SlotsClosed, SlotsSkip
from opsctl.slots.ranges import expand, parse, to_ranges
from opsctl.slots.reshard import MoveOptions, resolve, run_moves
from opsctl.slots.session import Peer, ReplyError, Session, open_session, pipe
from opsctl.spec.deployed import DeployedAs, NodeRecord
from opsctl.spec.layout import Node


def move_slots(rt: Runtime, step: MoveSlots, emit: Emit) -> None:
    """Move what the source still owns of the step's slots; slots already at the target are done (idempotent).
    Source and target are their shards' masters when the step runs (slots.reshard.resolve): an earlier failover in the
    plan may have moved them. A move that fills a shard (a scale-out) is journaled as a fill first; apply marks it
    filled when it finished (Journal.filled)."""
    with topology_lock(rt.connector), open_session(rt.connector) as session:
        notes: list[str] = []
        source, target = resolve(session, step.node, notes), resolve(session, step.target, notes)
        for note in notes:
            emit(Log(step.title(), note))
        owned = set(session.owned().get(source, ()))
        wanted = [s for a, b in parse(step.slots) for s in range(a, b + 1)]
        left = [s for s in wanted if s in owned]
        if not left:
            emit(SlotsSkip(step.title(), "already moved"))
            return
        journal = Journal(rt.state_dir)
        if step.fills:
            journal.fill(step.fills, target)
        run_moves(session, [Move(source, target, to_ranges(left))], journal, emit, MoveOptions())


def assign_slots(rt: Runtime, step: AssignSlots, emit: Emit) -> None:
    """The step's slots that no view shows served yet go to the step's master (fix.cover: ADDSLOTS, then
    BUMPEPOCH). Refused when another master holds keys in one of them (`cluster fix` gives such a slot to the
    node holding its keys)."""
    with topology_lock(rt.connector), open_session(rt.connector) as session:
        if not cover(session, expand(parse(step.slots)), lambda free: dict.fromkeys(free, step.node),
                     follow_keys=False):
            emit(SlotsSkip(step.title(), "already served"))


def close_slots(rt: Runtime, step: CloseSlots, emit: Emit) -> None:
    with topology_lock(rt.connector), open_session(rt.connector) as session:
        for line in close_in_session(session, Journal(rt.state_dir), emit):
            emit(SlotsClosed(line))


def remove_node(rt: Runtime, step: RemoveNode, emit: Emit) -> None:
    """Stop the node, then FORGET every id its endpoint has on every other node. Stopped first, so a run killed
    in between leaves a stopped node the cluster still knows (the next plan removes it again), never a running
    server that no node knows any more (nothing would find it to stop it)."""
    node = find_node(rt.loaded, step.node)
    if node is None:
        raise OpsctlError(f"cannot find node {step.node}", hint="plan again")
    with open_session(rt.connector) as session:
        ids = _ids_of(session, node)
        stop_leaving(rt, node)
        checkpoint("remove-node-stopped")
        others = [p for p in session.peers.values() if p.name != node.name]
        session.parallel(lambda p: _forget(p, ids), others)
    checkpoint("remove-node-forgotten")
    if step.purge:
        retire(rt, node)


def stop_leaving(rt: Runtime, node: Node) -> None:
    """Stop a node that leaves the fleet (retired, or parked by cluster.masters down), and its redis_exporter with
    it: nothing later stops an exporter beside a node that is no layout node any more, and it would keep its port
    (the next deploy at it fails) and report the node down."""
    from opsctl.metrics.exporter_steps import remove_exporter  # the exporter machinery: only when a node goes

    stopping(rt.connector, [node.name])  # it leaves the lock's count as it stops
    rt.provider.stop(node)
    remove_exporter(rt, node)


def retire(rt: Runtime, node: Node) -> None:
    """Turn a stopped, forgotten node's record into a tombstone (what it was deployed as, retired: true), written
    and flushed before its folder is purged down to that record: placement never gives a tombstone's name again, so
    a run killed at any point never lets the name be reused. The tombstone says `purging` until the purge is done;
    placement retires such a node again, so the next plan finishes the purge."""
    deployed = rt.provider.load_record(node).deployed or DeployedAs.of(node)
    rt.provider.save_record(node, NodeRecord(deployed=deployed, retired=True, purging=True))
    rt.provider.flush()
    checkpoint("remove-node-tombstoned")
    rt.provider.purge(node, keep_record=True)
    checkpoint("remove-node-purged")
    rt.provider.save_record(node, NodeRecord(deployed=deployed, retired=True))
    rt.provider.flush()


def _ids_of(session: Session, node: Node) -> set[str]:
    """The ids node's endpoint has in every view (its own included); refused while any view says it serves slots."""
    lines = [line for view in session.views().values() for line in view if line.endpoint == node.endpoint]
    serving = max((line.slot_count for line in lines), default=0)
    if serving:
        raise RefusedError(f"{node.name} still serves slots ({serving} in the cluster's view)",
                           "removing it would lose them",
                           "apply again: the plan drains it first (a node that is down cannot be drained: start it "
                           "with the spec that still has it, then apply this spec again)")
    return {line.id for line in lines}


def _forget(peer: Peer, node_ids: Iterable[str]) -> None:
    """CLUSTER FORGET of each id on peer; an unknown id is forgotten already."""
    ids = list(node_ids)
    for node_id, reply in zip(ids, pipe(peer, [("CLUSTER", "FORGET", i) for i in ids]), strict=True):
        if isinstance(reply, ReplyError) and "Unknown node" not in str(reply):
            raise OpsctlError(f"CLUSTER FORGET {node_id} failed on {peer.name} ({peer.node.endpoint})", str(reply),
                              "the node's log says more; `opsctl cluster check -f SPEC` shows the state")
