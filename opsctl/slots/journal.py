"""The slot journal (JSON lines in the state dir): every slot a run opens is written down (fsync) before it is opened,
and marked closed once its owner changed everywhere; the next `apply` or `cluster fix` closes exactly the open
entries a killed run left. A scale-out's fills are journaled too (fill, filled). The replay decisions are pure. See
docs/slots.md."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, ClassVar

from opsctl.base.errors import OpsctlError
from opsctl.base.frozen import frozen
from opsctl.base.record import DataMismatch, Range, Versioned
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


SlotNumber = Annotated[int, Range(0, SLOTS - 1, "a slot")]
Shard = Annotated[int, Range(1, SLOTS, "a shard number")]
SLOT_RULE = f"slots must be a list of [start, end] pairs within 0..{SLOTS - 1}"


class _Line(Versioned):
    """One journal line: its op (OP, written first) and its fields; t: when it was written (unix seconds; 0: a line
    written by hand). RULES: what each field must hold, in the words of the error that names it."""

    OP: ClassVar[str] = ""
    RULES: ClassVar[Mapping[str, str]] = {}
    NAMES: ClassVar[tuple[str, ...]] = ()  # the fields that name a node: never empty

    def problems(self) -> Iterator[tuple[str, str]]:
        for name in self.NAMES:
            if getattr(self, name) == "":
                yield name, "is empty"

    def to_json(self) -> dict[str, object]:
        return {"op": self.OP, **super().to_json()}


@frozen
class OpenLine(_Line):
    source: str
    source_id: str
    target: str
    target_id: str
    slots: tuple[tuple[SlotNumber, SlotNumber], ...]
    mode: str = "keys"
    t: float = 0.0

    OP = "open"
    NAMES = ("source", "source_id", "target", "target_id")
    RULES: ClassVar[Mapping[str, str]] = {
        **{name: f"an open entry needs a non-empty string {name!r}" for name in NAMES},
        "slots": SLOT_RULE, "mode": "unknown mode: an open entry's mode is keys or atomic"}

    def problems(self) -> Iterator[tuple[str, str]]:
        yield from super().problems()
        yield from _backwards(self.slots)
        if self.mode not in MODES:
            yield "mode", f"is {self.mode[:40]!r}"


@frozen
class CloseLine(_Line):
    slots: tuple[tuple[SlotNumber, SlotNumber], ...]
    t: float = 0.0

    OP = "close"
    RULES: ClassVar[Mapping[str, str]] = {"slots": SLOT_RULE}

    def problems(self) -> Iterator[tuple[str, str]]:
        return _backwards(self.slots)


@frozen
class FillLine(_Line):
    shard: Shard
    master: str
    t: float = 0.0

    OP = "fill"
    NAMES = ("master",)
    RULES: ClassVar[Mapping[str, str]] = dict.fromkeys(
        ("shard", "master"), "a fill entry needs a shard number (1 or more) and a non-empty string 'master'")


@frozen
class FilledLine(_Line):
    shards: tuple[Shard, ...]
    t: float = 0.0

    OP = "filled"
    RULES: ClassVar[Mapping[str, str]] = {
        "shards": "a filled entry needs 'shards', a list of shard numbers (1 or more)"}


def _backwards(slots: Sequence[tuple[int, int]]) -> Iterator[tuple[str, str]]:
    if any(start > end for start, end in slots):
        yield "slots", "holds a range whose start is after its end"


Entry = OpenLine | CloseLine | FillLine | FilledLine
LINES: dict[str, type[Entry]] = {kind.OP: kind for kind in (OpenLine, CloseLine, FillLine, FilledLine)}


def read_entry(data: object) -> Entry:
    """One journal line's entry, read field by field (base/record); ValueError naming the field and its rule. Pure."""
    if not isinstance(data, dict):
        raise ValueError("a line is not a JSON object")
    kind = LINES.get(data["op"]) if type(data.get("op")) is str else None
    if kind is None:
        raise ValueError(f"unknown op {str(data.get('op'))[:40]!r} (expected open, close, fill or filled)")
    try:
        return kind.from_json({k: v for k, v in data.items() if k != "op"})
    except DataMismatch as exc:
        name = re.split(r"[.\[:]", str(exc), maxsplit=1)[0]  # the field the error names first
        rule = kind.RULES.get(name, f"a{'n' if kind.OP == 'open' else ''} {kind.OP} entry holds only "
                                    + ", ".join(["op", *(f.name for f in fields(kind))]))
        raise ValueError(f"{exc} ({rule})") from None


def parse_lines(lines: Sequence[str], where: str) -> list[Entry]:
    """The journal's entries, checked. Only the last line may be torn (a kill mid-write: never acted on);
    anything else malformed is an OpsctlError naming the file, line and field. Pure."""
    out: list[Entry] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except (ValueError, RecursionError):
            if number == len(lines):
                continue
            problem = "a line is not JSON"
        else:
            try:
                out.append(read_entry(data))
                continue
            except ValueError as exc:
                problem = str(exc)
        raise OpsctlError(f"{where}:{number}: the slot journal is damaged: {problem}",
                          hint="restore the file, or move it away and run `opsctl cluster fix -f SPEC` "
                               "(it closes open slots from the nodes' own MIGRATING/IMPORTING state)")
    return out


def pending(entries: Iterable[Entry]) -> list[OpenSlots]:
    """Replay the journal: what is still open, grouped by (source, target, mode). Pure."""
    open_: dict[int, tuple[str, str, str, str, str]] = {}
    for entry in entries:
        if isinstance(entry, OpenLine):
            key = (entry.source, entry.source_id, entry.target, entry.target_id, entry.mode)
            open_.update(dict.fromkeys(expand(entry.slots), key))
        elif isinstance(entry, CloseLine):
            for slot in expand(entry.slots):
                open_.pop(slot, None)
    groups: dict[tuple[str, str, str, str, str], list[int]] = {}
    for slot, key in open_.items():
        groups.setdefault(key, []).append(slot)
    return [OpenSlots(k[0], k[1], k[2], k[3], to_ranges(v), k[4]) for k, v in sorted(groups.items())]


def filling(entries: Iterable[Entry]) -> list[int]:
    """Replay the journal: the shards a scale-out was filling and no apply finished. Pure."""
    open_: set[int] = set()
    for entry in entries:
        if isinstance(entry, FillLine):
            open_.add(entry.shard)
        elif isinstance(entry, FilledLine):
            open_ -= set(entry.shards)
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

    def entries(self) -> list[Entry]:
        return parse_lines(self._read().splitlines(), str(self.path))

    def _read(self) -> str:
        hint = "move the file away; `opsctl cluster fix -f SPEC` closes open slots from the nodes' own state"
        return read_bounded(self.path, hint, MAX_JOURNAL_BYTES) or ""

    def pending(self) -> list[OpenSlots]:
        return pending(self.entries())

    def filling(self) -> list[int]:
        return filling(self.entries())

    def _append(self, entry: Entry) -> None:
        make_dir(self.path.parent, 0o700, trusted_owners(), enforce=False)  # the provider may have opened it to 0711
        line = json.dumps(entry.to_json()) + "\n"
        append_private(self.path, line.encode(), "it must be a regular file in the state dir: move it away, then "
                       "`opsctl cluster fix -f SPEC` closes what this run opened")

    def opened(self, source: str, source_id: str, target: str, target_id: str, slots: Sequence[int],
               mode: str = "keys") -> None:
        self._append(OpenLine(source, source_id, target, target_id, to_ranges(slots), mode, _now()))

    def closed(self, slots: Sequence[int]) -> None:
        self._append(CloseLine(to_ranges(slots), _now()))

    def fill(self, shard: int, master: str) -> None:
        """Before a scale-out's move into shard's master: until apply finishes, the shard is still to fill."""
        self._append(FillLine(shard, master, _now()))

    def filled(self) -> None:
        """An apply finished: the shards it was filling hold their share (its plan moved them there last)."""
        shards = self.filling()
        if shards:
            self._append(FilledLine(tuple(shards), _now()))
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


def _now() -> float:
    """A line's t: unix seconds to the millisecond."""
    return round(time.time(), 3)
