"""Which slots no master serves, which belong to masters that do not answer, and who gets the first (pure): one
decision for apply's assign-slots step and `cluster fix` (opsctl.slots.fix.cover). Not through the planner's
modules: the slot commands do not load them (test_slot_commands_load_no_client_library_nor_the_planner)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence

from opsctl.base.errors import OpsctlError
from opsctl.base.frozen import Frozen, frozen
from opsctl.observe.cluster_state import even_slot_ranges, uncovered
from opsctl.observe.replies import ClusterNodeLine, distinct_lines
from opsctl.slots.ranges import Ranges, SlotRange, expand, text, to_ranges
from opsctl.spec.layout import Layout, Shard


def unserved_slots(views: Iterable[Sequence[ClusterNodeLine]]) -> set[int]:
    """Slots that no view shows a master serving (a master's view shows its own slots, even failing); no views: none.
    Every view counts, not the most common one: a slot any view still shows served is left alone, never given to a
    second master while a node routes it to a first."""
    seen = [view for view in views if view]
    ranges = sorted({r for line in distinct_lines(seen) if line.is_master for r in line.slots})  # a set: any order
    return set(expand(uncovered(tuple((start, end, "") for start, end in ranges)))) if seen else set()


def unreachable_owners(views: Iterable[Sequence[ClusterNodeLine]]) -> dict[str, list[int]]:
    """Slots some view shows served by a master whose own view is not among views (it does not answer), and that
    no view shows served by a master that answers: by that owner's id. Every view counts, as in unserved_slots:
    a view that misses a slot's new owner (a promoted replica) does not make the slot lost."""
    seen = [view for view in views if view]
    answering = {line.id for view in seen for line in view if line.is_myself}
    claims = {(line.id, start, end) for view in seen for line in view if line.is_master for start, end in line.slots}
    live = set(expand((start, end) for owner, start, end in claims if owner in answering))
    lost: dict[str, set[int]] = {}
    for owner, start, end in claims:
        if owner not in answering:
            lost.setdefault(owner, set()).update(s for s in range(start, end + 1) if s not in live)
    return {owner: sorted(slots) for owner, slots in sorted(lost.items()) if slots}


Owners = Callable[[Sequence[int]], Mapping[int, str]]  # slots to give (no keys decide them) -> each one's master


@frozen
class Cover(Frozen):
    """Who gets which of the slots that no master serves, and stranded: the masters holding keys in a slot that
    goes to another master (those keys would stay on a node that does not serve their slot)."""

    give: dict[str, list[int]]
    stranded: dict[str, list[int]]


def cover_plan(slots: Iterable[int], keys: Mapping[str, Mapping[int, int]], owners: Owners,
               follow_keys: bool) -> Cover:
    """keys: each master's key count in the slots it holds keys in. A slot goes to the master owners gives it,
    or, with follow_keys, to the master holding keys in it (the one holding most, if several)."""
    holders = {slot: {name: held[slot] for name, held in keys.items() if held.get(slot)} for slot in sorted(set(slots))}
    decided = owners([slot for slot, held in holders.items() if not (follow_keys and held)])
    give: dict[str, list[int]] = {}
    stranded: dict[str, list[int]] = {}
    for slot, held in holders.items():
        owner = max(sorted(held), key=held.__getitem__) if follow_keys and held else decided[slot]
        give.setdefault(owner, []).append(slot)
        for name in held.keys() - {owner}:
            stranded.setdefault(name, []).append(slot)
    return Cover(give, stranded)


def shares(layout: Layout) -> list[tuple[Shard, SlotRange]]:
    """Each shard's share of the spec's layout of slots: one even, contiguous range each, in shard order."""
    return list(zip(layout.shards, even_slot_ranges(len(layout.shards)), strict=True))


def by_share(layout: Layout, slots: Iterable[int]) -> list[tuple[Shard, Ranges]]:
    """slots by the shard whose share holds them, in shard order: a slot no master serves goes to that shard's
    master now (planning.assign_steps; cover_owners for `cluster fix`)."""
    wanted = set(slots)
    grouped = [(shard, to_ranges(s for s in range(start, end + 1) if s in wanted))
               for shard, (start, end) in shares(layout)]
    return [(shard, mine) for shard, mine in grouped if mine]


def cover_owners(layout: Layout, masters: Sequence[str | None], owned: Mapping[str, int]) -> Owners:
    """Who `cluster fix` gives the slots no master serves (those without keys to follow), as apply's assign-slots: the
    master of the shard whose share holds them.
    masters: each shard's master now, in shard order (None: none answers or apply cannot tell); owned: their slot
    counts. A masterless share goes, range by range, to the shard master with the fewest slots, counting those given
    (the first on a tie)."""
    master_of = {shard.index: master for shard, master in zip(layout.shards, masters, strict=True)}
    serving = [m for m in masters if m is not None]

    def owners(slots: Sequence[int]) -> dict[int, str]:
        given: dict[int, str] = {}
        left: list[SlotRange] = []
        for shard, mine in by_share(layout, slots):
            master = master_of[shard.index]
            if master is None:
                left += mine
            else:
                given |= dict.fromkeys(expand(mine), master)
        if left and not serving:
            raise OpsctlError(f"slots {text(left)} need a master, and no shard's master answers",
                              "only a shard's master may serve them", "start the masters, then run this again")
        counts = Counter({m: owned.get(m, 0) for m in serving}) + Counter(given.values())
        for start, end in left:
            target = min(serving, key=lambda m: counts[m])
            given |= dict.fromkeys(range(start, end + 1), target)
            counts[target] += end - start + 1
        return given

    return owners
