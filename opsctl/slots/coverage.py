"""Which slots no master serves, which belong to masters that do not answer, and who gets the first (pure): one
decision for apply's assign-slots step and `cluster fix` (opsctl.slots.fix.cover)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from opsctl.frozen import Frozen, frozen
from opsctl.observe.cluster_state import uncovered
from opsctl.observe.parse import ClusterNodeLine
from opsctl.slots.ranges import expand


def unserved_slots(views: Iterable[Sequence[ClusterNodeLine]]) -> set[int]:
    """Slots that no view shows a master serving (a master's own view shows its slots, also while it fails): a
    creation killed before every master got its share leaves them. No view at all says nothing.
    Every view counts, not the most common one: nodes that have not met agree on nothing (each master's view shows
    its own slots only, and the most common view, shared by the nodes without slots, shows none served), and a
    stale view that misses an owner must not make its slots look free. A slot one view still shows served is
    left alone: never given to a second master while a node routes it to a first."""
    seen = [view for view in views if view]
    ranges = sorted({r for view in seen for line in view if line.is_master for r in line.slots})
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


OwnerOf = Callable[[int, Mapping[str, Sequence[int]]], str]  # (slot, what was given so far) -> its master


@frozen
class Cover(Frozen):
    """Who gets which of the slots that no master serves, and stranded: the masters holding keys in a slot that
    goes to another master (those keys would stay on a node that does not serve their slot)."""

    give: dict[str, list[int]]
    stranded: dict[str, list[int]]


def cover_plan(slots: Iterable[int], keys: Mapping[str, Mapping[int, int]], owner_of: OwnerOf,
               follow_keys: bool) -> Cover:
    """keys: each master's key count in the slots it holds keys in. A slot goes to owner_of's master, or, with
    follow_keys, to the master holding keys in it (the one holding most, if several)."""
    give: dict[str, list[int]] = {}
    stranded: dict[str, list[int]] = {}
    for slot in sorted(set(slots)):
        holders = {name: held[slot] for name, held in keys.items() if held.get(slot)}
        owner = max(sorted(holders), key=holders.__getitem__) if follow_keys and holders else owner_of(slot, give)
        give.setdefault(owner, []).append(slot)
        for name in holders.keys() - {owner}:
            stranded.setdefault(name, []).append(slot)
    return Cover(give, stranded)


def fewest_slots(owned: Mapping[str, int]) -> OwnerOf:
    """The master with the fewest slots, counting those given so far (on a tie, the first in owned)."""
    return lambda _slot, given: min(owned, key=lambda name: owned[name] + len(given.get(name, ())))
