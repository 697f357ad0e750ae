"""The slot journal (JSON lines in the state dir): every slot a run opens is written down (fsync) before it is opened,
and marked closed once its owner changed everywhere; the next `apply` or `cluster fix` closes exactly the open
entries a killed run left. A scale-out's fills are journaled too (fill, filled). The replay decisions are pure. See
docs/slots.md."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opsctl.base.errors import OpsctlError
from opsctl.observe.replies import SLOTS
from opsctl.slots.ranges import Ranges, expand, to_ranges
from opsctl.state.safefs import append_private, make_dir, read_bounded, trusted_owners

JOURNAL = "slots-journal.jsonl"
MODES = ("keys", "atomic")
MAX_JOURNAL_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class OpenSlots:
    """Slots a run opened from source to target and did not close (names and ids as when opened)."""

    source: str
    source_id: str
    target: str
    target_id: str
    slots: Ranges
    mode: str = "keys"


def entry_problem(entry: object) -> str | None:
    """What is wrong with one journal line's shape, or None. Pure."""
    if not isinstance(entry, dict):
        return "a line is not a JSON object"
    op = entry.get("op")
    if op == "fill":
        return None if _is_shard(entry.get("shard")) and isinstance(entry.get("master"), str) and entry["master"] \
            else "a fill entry needs a shard number (1 or more) and a non-empty string 'master'"
    if op == "filled":
        shards = entry.get("shards")
        return None if isinstance(shards, list) and all(map(_is_shard, shards)) \
            else "a filled entry needs 'shards', a list of shard numbers (1 or more)"
    if op not in ("open", "close"):
        return f"unknown op {str(op)[:40]!r} (expected open, close, fill or filled)"
    slots = entry.get("slots")
    if not isinstance(slots, list) or not all(_is_range(r) for r in slots):
        return f"slots must be a list of [start, end] pairs within 0..{SLOTS - 1}"
    if op == "open":
        for name in ("source", "source_id", "target", "target_id"):
            if not isinstance(entry.get(name), str) or not entry[name]:
                return f"an open entry needs a non-empty string {name!r}"
        if entry.get("mode", "keys") not in MODES:
            return f"unknown mode {str(entry.get('mode'))[:40]!r} (expected keys or atomic)"
    return None


def _is_shard(value: object) -> bool:
    return type(value) is int and value >= 1


def _is_range(value: object) -> bool:
    return (isinstance(value, list) and len(value) == 2 and all(type(v) is int for v in value)
            and 0 <= value[0] <= value[1] < SLOTS)


def parse_lines(lines: Sequence[str], where: str) -> list[dict[str, Any]]:
    """The journal's entries, checked. Only the last line may be torn (a kill mid-write: never acted on);
    anything else malformed is an OpsctlError naming the file and line. Pure."""
    out: list[dict[str, Any]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except (ValueError, RecursionError):
            if number == len(lines):
                continue
            entry = None
            problem: str | None = "a line is not JSON"
        else:
            problem = entry_problem(entry)
        if problem:
            raise OpsctlError(f"{where}:{number}: the slot journal is damaged: {problem}",
                              hint="restore the file, or move it away and run `opsctl cluster fix -f SPEC` "
                                   "(it closes open slots from the nodes' own MIGRATING/IMPORTING state)")
        out.append(entry)
    return out


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


def filling(entries: Iterable[dict[str, Any]]) -> list[int]:
    """Replay the journal: the shards a scale-out was filling and no apply finished. Pure."""
    open_: set[int] = set()
    for entry in entries:
        if entry.get("op") == "fill":
            open_.add(entry["shard"])
        elif entry.get("op") == "filled":
            open_ -= set(entry["shards"])
    return sorted(open_)


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

    finish: move what is left, give the slot to the target (never go back); assign: the target owns it already, tell
    the others (a promoted replica's leftover copies are `cluster fix`'s strays); cancel: nothing moved, clear the
    flags; none: nothing is open."""
    if state.target_owns:
        if state.source_keys and (state.source_owns or state.migrating):
            return "finish"
        return "assign" if state.migrating or state.source_owns or state.source_keys else "none"
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
        return parse_lines(self._read().splitlines(), str(self.path))

    def _read(self) -> str:
        hint = "move the file away; `opsctl cluster fix -f SPEC` closes open slots from the nodes' own state"
        return read_bounded(self.path, hint, MAX_JOURNAL_BYTES) or ""

    def pending(self) -> list[OpenSlots]:
        return pending(self.entries())

    def filling(self) -> list[int]:
        return filling(self.entries())

    def _append(self, entry: dict[str, Any]) -> None:
        make_dir(self.path.parent, 0o700, trusted_owners(), enforce=False)  # the provider may have opened it to 0711
        line = json.dumps({**entry, "t": round(time.time(), 3)}) + "\n"
        append_private(self.path, line.encode(), "it must be a regular file in the state dir: move it away, then "
                       "`opsctl cluster fix -f SPEC` closes what this run opened")

    def opened(self, source: str, source_id: str, target: str, target_id: str, slots: Sequence[int],
               mode: str = "keys") -> None:
        self._append({"op": "open", "source": source, "source_id": source_id, "target": target,
                      "target_id": target_id, "slots": [list(r) for r in to_ranges(slots)], "mode": mode})

    def closed(self, slots: Sequence[int]) -> None:
        self._append({"op": "close", "slots": [list(r) for r in to_ranges(slots)]})

    def fill(self, shard: int, master: str) -> None:
        """Before a scale-out's move into shard's master: until apply finishes, the shard is still to fill."""
        self._append({"op": "fill", "shard": shard, "master": master})

    def filled(self) -> None:
        """An apply finished: the shards it was filling hold their share (its plan moved them there last)."""
        shards = self.filling()
        if shards:
            self._append({"op": "filled", "shards": shards})
        self.compact()

    def discard(self) -> None:
        """Drop the file whatever it holds: its cluster was purged (destroy --purge), and a fresh deploy must not read
        its entries as its own (an open one would be closed on nodes that never opened it). A link goes itself."""
        if self.path.is_symlink() or self.path.is_file():
            self.path.unlink()

    def compact(self) -> None:
        """Drop the file once nothing is open (keeps it small; the history is in the events)."""
        if self.path.exists() and not pending(entries := self.entries()) and not filling(entries):
            self.path.unlink()
