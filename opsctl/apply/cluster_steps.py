"""The cluster steps of a plan: form a new cluster, join a node to it, the slot steps (their engines are in
slot_steps, loaded only when a plan moves slots), and the wait every topology's plan ends with."""

from __future__ import annotations

from opsctl.base.errors import NodeError
from opsctl.base.events import Log
from opsctl.base.frozen import Frozen, frozen
from opsctl.cluster.ops import form_cluster, meet, reset_stale_identity
from opsctl.net.connection import connection_to
from opsctl.net.observer import observe, wait_cluster_converged
from opsctl.observe.replies import CLUSTER_NODES, ClusterNodeLine
from opsctl.plan.steps import (
    AssignSlots,
    CloseSlots,
    FormCluster,
    JoinCluster,
    MoveSlots,
    RemoveNode,
    WaitConverged,
)
from opsctl.runtime.execution import Execution
from opsctl.runtime.opening import Runtime
from opsctl.spec.layout import Node
from opsctl.status.looks import wait_replication, wait_sentinels


def form(run: Execution, step: FormCluster) -> None:
    """Form the cluster. The replicas' writes and starts of the wave before run as their own steps beside it
    (Execution.replicas_starting), while the masters are set up and meet; the first of them that fails fails
    this step too."""
    replicas, run.replicas_starting = run.replicas_starting, None
    form_cluster(run.rt.connector, run.rt.loaded.layout,
                 replicas_started=replicas.result if replicas is not None else None)


def join_cluster(run: Execution, step: JoinCluster) -> None:
    node, via = run.node(step), run.rt.node(step.via)
    handle = run.rt.connections[node.name]
    via_view = run.rt.connections[via.name].read(CLUSTER_NODES)
    live = _known_by_its_peers(run, node, handle.read(CLUSTER_NODES), via_view)
    old_id = None if node.endpoint in live.handshaking else reset_stale_identity(handle, node, live.ids)
    if old_id is not None:
        run.emit(Log(step.title(), f"{node.name} came back as {old_id[:8]}, a node the cluster forgot: "
                                   "reset it to a new empty node (CLUSTER RESET HARD)"))
    meet(handle, via)


@frozen
class KnownBack(Frozen):
    """What the cluster's nodes know of a joining node: every id they know, and the endpoints they are still
    shaking hands with (a MEET under way: the met side knows the meeter only by a random id until its PING)."""

    ids: frozenset[str]
    handshaking: frozenset[str]


def _known_by_its_peers(run: Execution, node: Node, view: list[ClusterNodeLine],
                        via_view: list[ClusterNodeLine]) -> KnownBack:
    """What via and the spec's nodes that node itself knows know of the cluster (they answer, else they count for
    nothing). A node met by some of the cluster and not yet by via (a creation killed after a replica met only
    its master), or whose MEETs were under way (killed while the masters met), is known back: not a forgotten
    identity to reset."""
    views = [via_view]
    by_endpoint = {n.endpoint: n for n in run.rt.loaded.layout.servers if n.name != node.name}
    for peer in (by_endpoint[line.endpoint] for line in view if line.endpoint in by_endpoint):
        try:
            with connection_to(run.rt.connector, peer, timeout=2.0) as peer_handle:  # a silent peer counts for nothing
                views.append(peer_handle.read(CLUSTER_NODES))
        except NodeError:
            continue
    lines = [line for v in views for line in v]
    return KnownBack(frozenset(line.id for line in lines),
                     frozenset(line.endpoint for line in lines if "handshake" in line.flags))




def wait_converged(run: Execution, step: WaitConverged) -> None:
    loaded = run.rt.loaded
    topology = loaded.spec.topology
    if topology == "cluster":
        # as long as nodes still settle; 60 s with none newly settled is stuck (capped at 10 min in all)
        wait_cluster_converged(run.rt.connector, _cluster_now(run.rt), timeout=600.0, stall=60.0)
    elif topology in ("replication", "sentinel"):
        wait_replication(run.rt, timeout=60.0)
    if topology == "sentinel":
        wait_sentinels(run.rt, timeout=60.0)


def _cluster_now(rt: Runtime) -> list[Node]:
    """The cluster as it is (slots.members.cluster_members, as a slot session and the failover checks take
    it): a scale-in killed before its drain and removal, which the same apply's next plan does, leaves retired
    nodes known, and the cluster as it is agrees or not."""
    from opsctl.slots.members import cluster_members

    views = [o.cluster_nodes for o in observe(rt.connector, rt.loaded.layout.servers).values() if o.cluster_nodes]
    return cluster_members(rt.loaded, views)


def move_slots(run: Execution, step: MoveSlots) -> None:
    import opsctl.apply.slot_steps as handlers

    handlers.move_slots(run.rt, step, run.emit)


def assign_slots(run: Execution, step: AssignSlots) -> None:
    import opsctl.apply.slot_steps as handlers

    handlers.assign_slots(run.rt, step, run.emit)


def close_slots(run: Execution, step: CloseSlots) -> None:
    import opsctl.apply.slot_steps as handlers

    handlers.close_slots(run.rt, step, run.emit)


def remove_node(run: Execution, step: RemoveNode) -> None:
    import opsctl.apply.slot_steps as handlers

    if run.rt.loaded.spec.topology != "cluster":
        from opsctl.apply.shape_steps import remove_replicated

        remove_replicated(run, step)
        return
    handlers.remove_node(run.rt, step, run.emit)

