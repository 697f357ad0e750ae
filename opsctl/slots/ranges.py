"""Slot sets as sorted, merged (start, end) ranges. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

SlotRange = tuple[int, int]
Ranges = tuple[SlotRange, ...]


def to_ranges(slots: Iterable[int]) -> Ranges:
    """Sorted, merged inclusive ranges of the given slots."""
    out: list[SlotRange] = []
    for slot in sorted(set(slots)):
        if out and out[-1][1] + 1 == slot:
            out[-1] = (out[-1][0], slot)
        else:
            out.append((slot, slot))
    return tuple(out)


def expand(ranges: Iterable[Sequence[int]]) -> list[int]:
    return [s for r in ranges for s in range(int(r[0]), int(r[1]) + 1)]


def count(ranges: Iterable[Sequence[int]]) -> int:
    return sum(int(r[1]) - int(r[0]) + 1 for r in ranges)


def text(ranges: Iterable[Sequence[int]]) -> str:
    parts = [str(r[0]) if r[0] == r[1] else f"{r[0]}-{r[1]}" for r in ranges]
    return ",".join(parts) or "none"


def parse(spec: str) -> Ranges:
    """'0-99,200' -> ((0, 99), (200, 200))."""
    slots: list[int] = []
    for part in spec.split(","):
        start, _, end = part.strip().partition("-")
        slots += range(int(start), int(end or start) + 1)
    return to_ranges(slots)
