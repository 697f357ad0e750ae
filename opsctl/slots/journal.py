"""The slot journal: every slot a run opens is written down (fsync) before it is opened, and marked closed
after its owner changed everywhere. A killed run leaves open entries; the next `apply` or `cluster fix`
closes exactly those. The file is JSON lines in the state dir; the replay decisions are pure.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opsctl.slots.ranges import Ranges, expand, to_ranges

JOURNAL = "slots-journal.jsonl"


@dataclass(frozen=True)
class OpenSlots:
    """Slots a run opened from source to target and did not close (names and ids as when opened)."""

    source: str
    source_id: str
    target: str
    target_id: str
    slots: Ranges
    mode: str = "keys"


def pending(entries: Iterable[dict[str, Any]]) -> list[OpenSlots]:
    """Replay the journal: what is still open, grouped by (source, target, mode). Pure."""
    open_: dict[int, tuple[str, str, str, str, str]] = {}
    for entry in entries:
        slots = expand(entry.get("slots", ()))
        if entry.get("op") == "open":
            key = (entry["source"], entry["source_id"], entry["target"], entry["target_id"], entry.get("mode", "keys"))
            open_.update(dict.fromkeys(slots, key))
        elif entry.get("op") == "close":
            for slot in slots:
                open_.pop(slot, None)
    groups: dict[tuple[str, str, str, str, str], list[int]] = {}
    for slot, key in open_.items():
        groups.setdefault(key, []).append(slot)
    return [OpenSlots(k[0], k[1], k[2], k[3], to_ranges(v), k[4]) for k, v in sorted(groups.items())]


@dataclass(frozen=True)
class SlotState:
    """One slot as the live nodes see it now."""

    source_owns: bool
    target_owns: bool
    migrating: bool
    importing: bool
    source_keys: int
    target_keys: int


def decide(state: SlotState) -> str:
    """How to close a journaled slot. Pure.

    finish: move what is left and give the slot to the target (keys may sit on both sides: never go back);
    assign: the target already owns it, tell the others; cancel: nothing moved yet, clear the flags;
    none: nothing is open.
    """
    if state.target_owns:
        return "finish" if state.source_keys else ("assign" if state.migrating or state.source_owns else "none")
    if state.migrating or state.target_keys:
        return "finish"
    if state.importing:
        return "cancel"
    return "none"


class Journal:
    """Append-only JSON lines with fsync; removed when every entry is closed."""

    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / JOURNAL

    def entries(self) -> list[dict[str, Any]]:
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            return []
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # a line torn by a kill mid-write: it was never acted on
        return out

    def pending(self) -> list[OpenSlots]:
        return pending(self.entries())

    def _append(self, entry: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (json.dumps({**entry, "t": round(time.time(), 3)}) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def opened(self, source: str, source_id: str, target: str, target_id: str, slots: Sequence[int],
               mode: str = "keys") -> None:
        self._append({"op": "open", "source": source, "source_id": source_id, "target": target,
                      "target_id": target_id, "slots": [list(r) for r in to_ranges(slots)], "mode": mode})

    def closed(self, slots: Sequence[int]) -> None:
        self._append({"op": "close", "slots": [list(r) for r in to_ranges(slots)]})

    def compact(self) -> None:
        """Drop the file once nothing is open (keeps it small; the history is in the events)."""
        if self.path.exists() and not self.pending():
            self.path.unlink()
