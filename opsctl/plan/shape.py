"""What a plan says about the fleet's shape: each placed or retired node's reason, and the one-line count. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from opsctl.base.errors import RefusedError
from opsctl.plan.facts import Facts
from opsctl.plan.steps import Failover, RemoveNode, Replicate, StartNode, Step, WaitConverged, WriteConfig
from opsctl.spec.layout import Layout
from opsctl.spec.model import Spec
from opsctl.spec.placement import drained

NEW = "new node"


def with_placement_reasons(layout: Layout, steps: Sequence[Step]) -> list[Step]:
    """A new node's steps and a retired node's removal say why placement added or retired it (spec.placement),
    e.g. "topo-9 on h4: new replica of shard 2 (replicas_per_master 1 -> 2)"."""
    out: list[Step] = []
    for step in steps:
        why = layout.reason(step.node)
        new = isinstance(step, (StartNode, WriteConfig)) and step.reason == NEW
        if why and (new or isinstance(step, RemoveNode)):
            step = replace(step, reason=why if step.reason == NEW else f"{why}: {_how(layout, step)}")
        out.append(step)
    return out


def _how(layout: Layout, step: Step) -> str:
    """A removal's own reason; for a moved member without "not in the spec any more (N shards)": its shard is."""
    gone, _, how = step.reason.partition("): ")
    return how if step.node in layout.moved and gone.startswith("not in the spec any more (") and how else step.reason


def summary(layout: Layout, facts: Facts, steps: Sequence[Step]) -> str:
    """"N to move, N to add, N to fail over, N to retire, N to change, N unchanged" over the layout's nodes and the
    retired ones the plan removes (zero counts left out; a move also counts its replacement added and itself
    retired); "" for an empty plan."""
    if not steps:
        return ""
    touched = {s.node for s in steps if not isinstance(s, WaitConverged)}  # a wait changes nothing
    names = [n.name for n in layout.nodes]
    added = {n for n in names if n in touched and not facts[n].recorded_digest and not facts[n].running}
    failing = {s.node for s in steps if isinstance(s, Failover)}
    retiring = {s.node for s in steps if isinstance(s, RemoveNode)}
    changing = {n for n in names if n in touched} - added - failing
    moving = {s.node for s in steps if isinstance(s, (RemoveNode, Failover)) and s.node in layout.moved}
    counts = ((len(moving), "to move"), (len(added), "to add"), (len(failing), "to fail over"),
              (len(retiring), "to retire"), (len(changing), "to change"),
              (len(names) - len(touched & set(names)), "unchanged"))
    return ", ".join(f"{count} {what}" for count, what in counts if count)


DRAIN_FIRST = ("a master on a host removed from the spec (or moved to even out load) fails over first, to a synced "
               "member elsewhere (it stays a replica of its shard until its replacement synced); apply then observes "
               "again and plans the rest")


def drain_failovers(spec: Spec, layout: Layout, facts: Facts) -> list[Failover]:
    """A graceful failover away from each drained node (spec.placement.drained) that serves its shard's slots and
    has a linked replica the spec keeps: a retired master would otherwise be emptied by slot moves. Without such a
    replica (replicas_per_master 0) its slots move instead. Refused while a member the spec keeps serves the same
    slots (a failover under way, a run killed after asking it): the drained node's own view is stale, and its slots
    would be moved from a node that no longer holds them."""
    steps = []
    for node in drained(spec, layout):
        me = facts[node.name].myself if node.name in facts else None
        if me is None or not me.is_master or not me.slots:
            continue
        shard = next(s for s in layout.shards if s.index == node.shard)
        taking = [n for n in shard.members if n in facts and (m := facts[n].myself) and m.is_master and m.slots]
        if taking:
            raise RefusedError(f"{node.name} and {taking[0]} both say they serve shard {shard.index}'s slots",
                               "a failover of the shard is under way (a run stopped after asking it, or the cluster "
                               "itself): moving its slots or failing it over again now would act on a stale view",
                               "apply again in a few seconds, once `opsctl cluster check -f SPEC` shows one master")
        if any((m := facts[n].myself) and m.master_id == me.id for n in shard.members if n in facts):
            steps.append(Failover(node.name, f"{layout.reason(node.name) or node.name}: its shard's master now, "
                                             "failed over to a synced member elsewhere first", shard=shard.index))
    return steps


def synced_before_retiring(spec: Spec, layout: Layout, steps: Sequence[Step]) -> list[Step]:
    """A wait before the first removal of a drained node when the plan adds replicas: their replacements have
    synced before they go, so a shard never has fewer synced replicas than replicas_per_master during the move."""
    gone = {n.name for n in drained(spec, layout)}
    at = next((i for i, s in enumerate(steps) if isinstance(s, RemoveNode) and s.node in gone), None)
    moved = any(isinstance(s, RemoveNode) and s.node in layout.moved for s in steps)  # a resumed move's new one
    if at is None or not (moved or any(isinstance(s, Replicate) for s in steps[:at])):
        return list(steps)
    wait = WaitConverged(layout.nodes[0].name, "wait until the replacements synced, before the nodes they replace go")
    return [*steps[:at], wait, *steps[at:]]
