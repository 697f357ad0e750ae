"""Which slots move where: weighted balance with minimal movement, reshard picks, drains. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from opsctl.base.frozen import Frozen, frozen
from opsctl.observe.replies import SLOTS
from opsctl.slots.ranges import Ranges, count, to_ranges


@frozen
class Move(Frozen):
    source: str
    target: str
    slots: Ranges

    @property
    def slot_count(self) -> int:
        return count(self.slots)


def targets(weights: Mapping[str, float], total: int = SLOTS) -> dict[str, int]:
    """Slot counts proportional to weights, summing to total (largest remainder; ties by name)."""
    weight_sum = sum(w for w in weights.values() if w > 0)
    if weight_sum <= 0:
        raise ValueError("at least one master needs a positive weight")
    exact = {n: total * max(w, 0.0) / weight_sum for n, w in weights.items()}
    out = {n: int(v) for n, v in exact.items()}
    left = total - sum(out.values())
    for name in sorted(exact, key=lambda n: (-(exact[n] - out[n]), n))[:left]:
        out[name] += 1
    return out


def balance_moves(owned: Mapping[str, Sequence[int]], weights: Mapping[str, float],
                  threshold_pct: float = 0.0) -> list[Move]:
    """Moves that bring every master to its weighted share, moving no slot twice and as few as possible.

    owned: master -> slots it serves (masters missing from weights get weight 0: drained). Returns no moves
    when every master is within threshold_pct of its share (drains and empty weighted masters always move).
    """
    all_names = sorted(set(owned) | set(weights))
    total = sum(len(owned.get(n, ())) for n in all_names)
    want = targets({n: weights.get(n, 0.0) for n in all_names}, total)
    have = {n: len(owned.get(n, ())) for n in all_names}
    if not _needs_moves(have, want, threshold_pct):
        return []
    give = {n: list(sorted(owned.get(n, ())))[want[n]:] for n in all_names if have[n] > want[n]}
    need = {n: want[n] - have[n] for n in all_names if want[n] > have[n]}
    return _pair(give, need)


def _needs_moves(have: Mapping[str, int], want: Mapping[str, int], threshold_pct: float) -> bool:
    for name, target in want.items():
        if (target == 0 and have[name] > 0) or (target > 0 and have[name] == 0):
            return True
        off = abs(have[name] - target)
        if target > 0 and off > 1 and off * 100.0 / target > threshold_pct:
            return True
    return False


def _pair(give: dict[str, list[int]], need: dict[str, int]) -> list[Move]:
    """Hand surplus slots (biggest giver first) to needers (biggest need first): few, large moves."""
    moves: list[Move] = []
    givers = sorted(give, key=lambda n: (-len(give[n]), n))
    needers = sorted(need, key=lambda n: (-need[n], n))
    for giver in givers:
        pool = give[giver]
        for needer in needers:
            take = min(need[needer], len(pool))
            if take <= 0:
                continue
            chunk, pool = pool[-take:], pool[:-take]
            need[needer] -= take
            moves.append(Move(giver, needer, to_ranges(chunk)))
    return moves


def pick_slots(owned: Sequence[int], how_many: int) -> Ranges:
    """The slots a reshard takes from a source: its highest ones, so both sides keep contiguous ranges."""
    if how_many > len(owned):
        raise ValueError(f"the source serves {len(owned)} slots, cannot move {how_many}")
    return to_ranges(sorted(owned)[len(owned) - how_many:])


def split_for_parallel(moves: Sequence[Move]) -> list[list[Move]]:
    """Rounds of moves whose (source, target) pairs are disjoint, so each round can run all at once."""
    rounds: list[list[Move]] = []
    for move in moves:
        for group in rounds:
            busy = {n for m in group for n in (m.source, m.target)}
            if move.source not in busy and move.target not in busy:
                group.append(move)
                break
        else:
            rounds.append([move])
    return rounds


def estimate(keys: int, size_bytes: int, source_slots: int, moved: int) -> tuple[int, int]:
    """Estimated keys and bytes a move carries, assuming keys spread evenly over the source's slots."""
    if source_slots <= 0:
        return 0, 0
    return keys * moved // source_slots, size_bytes * moved // source_slots
