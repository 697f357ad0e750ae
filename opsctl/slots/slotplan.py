"""The slot part of a plan (pure): assign what a killed creation left unassigned, close what a killed run left open,
balance slots into new shards (and into those a scale-out was filling when its run stopped), drain and remove nodes
the spec no longer has. Every step says why, with estimated keys and bytes per move."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from opsctl.plan.facts import Facts, NodeFacts
from opsctl.plan.steps import AssignSlots, CloseSlots, MoveSlots, RemoveNode, Step
from opsctl.slots.balance import balance_moves, estimate
from opsctl.slots.coverage import by_share, shares, unserved_slots
from opsctl.slots.ranges import SlotRange, count, expand, parse, text, to_ranges
from opsctl.spec.layout import Layout
from opsctl.spec.placement import surplus_members


def slot_plan(layout: Layout) -> dict[str, list[SlotRange]]:
    """The spec's layout of slots: each shard's declared master gets its share (coverage.shares)."""
    return {shard.master: [share] for shard, share in shares(layout)}


def assign_steps(layout: Layout, facts: Facts, masters: Sequence[str]) -> list[AssignSlots]:
    """Unserved slots go to the master of the shard whose share of the spec's layout holds them: as a creation
    gives them, not through moves from masters that may not even be in one cluster yet."""
    unserved = unserved_slots(f.cluster_nodes or () for f in facts.values())
    master_of = {shard.index: master for shard, master in zip(layout.shards, masters, strict=True)}
    steps = []
    for shard, mine in by_share(layout, unserved):
        master = master_of[shard.index]
        why = (f"no master serves slots {text(mine)} (left unassigned, as by a cluster creation that stopped "
               f"part way): shard {shard.index}'s share of the spec's layout, to its master {master}")
        steps.append(AssignSlots(master, why, text(mine), count(mine)))
    return steps


def open_slots(facts: Facts) -> list[int]:
    return sorted({s for f in facts.values() if (me := f.myself) for s in (*me.migrating, *me.importing)})


def owned_slots(names: Sequence[str], facts: Facts) -> dict[str, list[int]]:
    return {n: expand(me.slots) if (me := facts[n].myself) and me.is_master else [] for n in names if n in facts}


def retired(layout: Layout, facts: Facts) -> list[str]:
    """Nodes observed that the layout does not have: replicas first (they go before their masters)."""
    names = [n for n in facts if layout.find(n) is None]
    return sorted(names, key=lambda n: (bool((me := facts[n].myself) and me.is_master), n))


def slot_steps(layout: Layout, facts: Facts, masters: Sequence[str], filling: Collection[int] = ()) -> list[Step]:
    """masters: each shard's current master. Retired nodes are the facts' names outside the layout. filling: the
    shards a scale-out was filling when its run stopped (the slot journal's fill entries)."""
    first = masters[0]
    assigned = assign_steps(layout, facts, masters)
    stale = open_slots(facts)
    if stale:
        return [*assigned, CloseSlots(first, f"slots {text(to_ranges(stale))} are open (a slot move was "
                                             "interrupted): finish them, journaled ones exactly as the journal says",
                                      text(to_ranges(stale)))]
    gone = retired(layout, facts)
    draining = [n for n in gone if _is_master(facts[n])]
    to_fill = [m for shard, m in zip(layout.shards, masters, strict=True) if shard.index in filling]
    steps: list[Step] = [*assigned, *move_steps(facts, masters, draining, assigned, to_fill)]
    surplus = {n.name for n in surplus_members(layout)}
    for name in gone:  # a stopped one too: the cluster still knows it (a run was killed before it forgot it)
        steps.append(RemoveNode(name, f"not in the spec any more ({len(masters)} shards): stop it, then forget "
                                      f"it on every node{PURGED if name in surplus else KEPT}", name in surplus))
    for name in sorted(surplus - set(gone)):  # forgotten, but a run stopped before its purge
        steps.append(RemoveNode(name, f"retired, and no node of the cluster knows it any more: stop it if it "
                                      f"runs{PURGED}", True))
    return steps


KEPT = " (its data folder is kept)"
PURGED = ", then purge its folder (its record stays as a tombstone: the name is never given again)"


def _is_master(f: NodeFacts) -> bool:
    me = f.myself
    return me is not None and me.is_master


def move_steps(facts: Facts, masters: Sequence[str], draining: Sequence[str],
               assigned: Sequence[AssignSlots] = (), filling: Collection[str] = ()) -> list[MoveSlots]:
    """masters: each shard's master, in shard order. assigned: the plan's assign-slots steps, which run before the
    moves. Slots move when a master has none (a new shard), a drained node has some, or a master a scale-out was
    filling (filling) is not at its share yet: never to undo a reshard done by hand."""
    owned = owned_slots([*masters, *draining], facts)
    for m in masters:
        owned.setdefault(m, [])
    for step in assigned:
        owned[step.node] = sorted([*owned[step.node], *expand(parse(step.slots))])
    if not any(owned.values()):
        return []
    empty = [m for m in masters if not owned[m]]
    loaded = [d for d in draining if owned.get(d)]
    if not empty and not loaded and not filling:
        return []
    moves = balance_moves(owned, dict.fromkeys(masters, 1.0))
    steps = []
    for move in moves:
        source = facts[move.source]
        keys, size = estimate(source.keys, int(source.info.get("used_memory_dataset", 0) or 0),
                              len(owned[move.source]), move.slot_count)
        why = (f"{move.target} is a new, empty shard master" if move.target in empty
               else f"{move.target}'s shard is not at its share yet (a scale-out's run stopped part way)"
               if move.target in filling
               else f"{move.source} leaves the cluster" if move.source in draining else "balance")
        fills = masters.index(move.target) + 1 if move.target in (*empty, *filling) else 0
        steps.append(MoveSlots(move.source, f"{why}: {move.slot_count} slots, ~{keys} keys, ~{size} bytes",
                               move.target, text(move.slots), count(move.slots), keys, size, fills))
    return steps
