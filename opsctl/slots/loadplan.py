"""Which slots move where to even out measured load (CPU, network, memory, keys): a greedy over slots by cost per
key moved. Pure: costs in, moves out.

What it optimises: the busiest master's load, down to within the tolerance of the mean, moving as few keys as it
can. Each step takes the busiest master over the limit and moves, to the least loaded master that can take one, the
slot of it with the highest cost per key moved (the slot's own move counting as one key) that leaves the receiver
within the limit or no higher than the giver (every move lowers the pair's peak). No slot moves twice in one
plan; a slot that alone costs more than a master's fair share (the mean) is named and never moved: moving it only
moves the bottleneck, and only the key design can split it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from opsctl.base.frozen import Frozen, frozen
from opsctl.slots.balance import Move
from opsctl.slots.ranges import to_ranges


@frozen
class SlotMove(Frozen):
    """One slot the plan moves: from, to, its cost (in the measure's unit) and its keys."""

    slot: int
    source: str
    target: str
    cost: float
    keys: int


@frozen
class HotSlot(Frozen):
    """A slot that alone costs more than a master's fair share: left where it is."""

    slot: int
    master: str
    cost: float
    share: float  # of the cluster's whole load


@frozen
class LoadPlan(Frozen):
    total: float
    share_now: dict[str, float]  # master -> share of the total load now
    share_after: dict[str, float]  # and once the moves are made (the costs measured staying where the slots go)
    slot_moves: tuple[SlotMove, ...]
    hot: tuple[HotSlot, ...]
    reached: bool  # whether the busiest master ends within the tolerance of the mean (hot slots allowing)

    @property
    def keys_moved(self) -> int:
        return sum(m.keys for m in self.slot_moves)

    def moves(self) -> list[Move]:
        """The slot moves grouped into one Move per (source, target), for the slot engines."""
        grouped: dict[tuple[str, str], list[int]] = {}
        for m in self.slot_moves:
            grouped.setdefault((m.source, m.target), []).append(m.slot)
        return [Move(s, t, to_ranges(sorted(slots))) for (s, t), slots in sorted(grouped.items())]


def spread(loads: Mapping[str, float]) -> float:
    """The busiest master's load over the mean (1.0: even); 1.0 for no load at all."""
    mean = sum(loads.values()) / len(loads) if loads else 0.0
    return max(loads.values()) / mean if mean > 0 else 1.0


def plan_by_load(owned: Mapping[str, Sequence[int]], cost: Mapping[int, float], keys: Mapping[int, int],
                 tolerance: float = 1.1) -> LoadPlan:
    """Moves that bring every master's load within tolerance x the mean (tolerance >= 1), fewest keys first.

    owned: master -> its slots (a master with none takes load too); cost: slot -> load measured (missing: 0);
    keys: slot -> keys it holds (missing: 0).
    """
    if tolerance < 1.0:
        raise ValueError("the tolerance is a ratio to the mean: 1.0 or more")
    load = {m: sum(cost.get(s, 0.0) for s in slots) for m, slots in owned.items()}
    total = sum(load.values())
    now = _shares(load, total)
    if not owned or total <= 0:
        return LoadPlan(total, now, dict(now), (), (), True)
    mean = total / len(owned)
    limit = mean * tolerance
    hot = tuple(HotSlot(s, m, cost[s], cost[s] / total) for m in sorted(owned) for s in sorted(owned[m])
                if cost.get(s, 0.0) > mean)
    hot_slots = {h.slot for h in hot}
    # each master's movable slots, best first: highest cost per key moved
    queues = {m: sorted((s for s in slots if cost.get(s, 0.0) > 0 and s not in hot_slots),
                        key=lambda s: (-_per_key(cost[s], keys.get(s, 0)), s))
              for m, slots in owned.items()}
    moved: list[SlotMove] = []
    while True:
        step = _next_move(load, queues, cost, keys, limit)
        if step is None:
            break
        moved.append(step)
        load[step.source] -= step.cost
        load[step.target] += step.cost
    floor = max((h.cost for h in hot), default=0.0)  # no master goes below its hot slot
    reached = max(load.values()) <= max(limit, floor) + 1e-9 * total
    return LoadPlan(total, now, _shares(load, total), tuple(moved), hot, reached)


def _per_key(slot_cost: float, slot_keys: int) -> float:
    """Cost per key moved, a slot's own move counting as one key: among slots with no keys (reads of missing
    keys), the costly ones first, not a crowd of near-idle ones."""
    return slot_cost / (slot_keys + 1)


def _next_move(load: dict[str, float], queues: dict[str, list[int]], cost: Mapping[int, float],
               keys: Mapping[int, int], limit: float) -> SlotMove | None:
    """The busiest master over the limit that can give a slot, and that slot: the first of its queue (best cost
    per key) that a receiver (the least loaded first) can take ending within the limit or no higher than the giver
    ends, so every move lowers the pair's peak."""
    for source in sorted(load, key=lambda m: (-load[m], m)):
        if load[source] <= limit:
            return None  # masters are in load order: no one further is over the limit
        queue = queues[source]
        for target in sorted((m for m in load if m != source), key=lambda m: (load[m], m)):
            for i, slot in enumerate(queue):
                c = cost[slot]
                if load[target] + c <= max(limit, load[source] - c) and load[target] + c < load[source]:
                    del queue[i]  # never a slot twice in one plan
                    return SlotMove(slot, source, target, c, keys.get(slot, 0))
    return None


def _shares(load: Mapping[str, float], total: float) -> dict[str, float]:
    return {m: (v / total if total > 0 else 0.0) for m, v in sorted(load.items())}
