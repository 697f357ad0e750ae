"""Slot sets as sorted, merged (start, end) ranges. Pure."""

from __future__ import annotations

from binascii import crc_hqx
from collections.abc import Iterable, Sequence
from typing import Literal

from opsctl.observe.replies import SLOTS

SlotRange = tuple[int, int]
Ranges = tuple[SlotRange, ...]
SlotVerb = Literal["ADDSLOTS", "DELSLOTS"]


def key_slot(key: bytes) -> int:
    """The cluster slot serving key: CRC16 (XMODEM: binascii.crc_hqx) of its hash tag, the bytes between its first
    `{` and the next `}` when there are any, else of the whole key (the cluster spec's HASH_SLOT)."""
    start = key.find(b"{")
    if start > -1:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            key = key[start + 1:end]
    return crc_hqx(key, 0) % SLOTS


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


def slot_command(verb: SlotVerb, ranges: Iterable[SlotRange], has_range: bool) -> tuple[str | int, ...]:
    """CLUSTER ADDSLOTS or DELSLOTS of ranges as one command: its RANGE form where the server has it (versions:
    slot_range_commands), else every slot listed. Every slot assignment opsctl sends is built here."""
    if has_range:
        return ("CLUSTER", f"{verb}RANGE", *(x for r in ranges for x in r))
    return ("CLUSTER", verb, *(s for start, end in ranges for s in range(start, end + 1)))
