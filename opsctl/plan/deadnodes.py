"""Dead cluster nodes (issue 22, item 4): ids the running nodes flag as failed at an endpoint no node of the spec
has (a host replaced: its old address is gone with its nodes), or at a spec node's endpoint whose identity went with
its folder (a new machine at a dead host's address), are forgotten everywhere; a shard whose slots only such a
failed node holds lost every member and is refused with the way on. Pure."""

from __future__ import annotations

from collections.abc import Callable

from opsctl.base.errors import RefusedError
from opsctl.observe.parse import ClusterNodeLine
from opsctl.plan.facts import Facts
from opsctl.plan.steps import ForgetNodes
from opsctl.spec.layout import Layout


def dead_nodes(layout: Layout, facts: Facts) -> dict[str, str]:
    """id -> endpoint of every node that serves no slot, is gone (_gone: no node of the spec, nothing to wait for)
    and that a running server flags fail or fail? (not yet agreed), or, at an address no node of the spec or retired
    one has, has no link to: the members of a killed host go failing one by one (each after node_timeout without a
    PONG), and one not flagged yet when apply looks would be left known everywhere."""
    gone, down = _gone(layout, facts), _down(layout)
    found: dict[str, str] = {}
    for f in facts.values():
        for line in f.cluster_nodes or ():
            if down(line) and not line.slots and gone(line.endpoint, line.id):
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


def refuse_lost_shards(layout: Layout, facts: Facts) -> None:
    """Slots that only a failed node at an endpoint the spec no longer has serves: that shard's data is gone from the
    fleet (a replica would have been promoted by now); a replacement would start empty."""
    gone, down = _gone(layout, facts), _down(layout)  # the others come back from their nodes.conf
    lost: dict[str, str] = {}
    for f in facts.values():
        for line in f.cluster_nodes or ():
            if down(line) and line.is_master and line.slots and gone(line.endpoint, line.id):
                lost[line.id] = line.endpoint
    if lost:
        where = ", ".join(sorted(set(lost.values())))
        raise RefusedError(f"slots are served only by failed node(s) at {where}: their shard lost every member, or "
                           "its replica is not promoted yet",
                           "starting a replacement there would serve those slots empty",
                           "wait for the cluster to promote a replica (cluster.node_timeout_ms) and apply again; "
                           "if the shard lost every member, restore that shard from a backup (opsctl restore, "
                           "docs/backup.md), then apply again")
