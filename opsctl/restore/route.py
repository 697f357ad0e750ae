"""The pure parts of a restore: slot routing, DUMP payloads, counts, the resume journal, refusals.

A key is copied with DUMP on a source (a scratch server holding a backup's RDB, or a live node) and RESTORE on the
master that owns its slot. Resuming re-reads every unfinished source; a key already there (BUSYKEY) counts as
restored when its value equals the source's."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Annotated, TypeVar

from opsctl.backup.rdb import KeyRecord
from opsctl.base.errors import OpsctlError
from opsctl.base.frozen import frozen
from opsctl.base.record import DataMismatch, Range, Versioned, ascii_decimal
from opsctl.observe.replies import SLOTS, Arg, ClusterNodeLine
from opsctl.slots.ranges import key_slot

T = TypeVar("T")

MODES = ("fail-if-exists", "replace", "skip-existing")
TRAILER = 10  # a DUMP payload ends with the RDB version (2 bytes) and a CRC64 (8 bytes)
ROOM_MARGIN = 1.2
JOURNAL = "restore-journal.json"


class Router:
    """Which target (index) owns a key: one table of 16384 slots, or everything to target 0 (no table)."""

    def __init__(self, table: Sequence[int] | None = None) -> None:
        self.table = list(table) if table is not None else None

    def target(self, key: bytes) -> int:
        return 0 if self.table is None else self.table[key_slot(key)]

    def split(self, items: Sequence[T], key: Callable[[T], bytes], targets: int) -> list[list[T]]:
        """items grouped by the target that owns each one's key, in order (a copy routes a million keys: the table
        is read here directly, not through target() per key)."""
        routed: list[list[T]] = [[] for _ in range(targets)]
        table = self.table
        if table is None:
            routed[0].extend(items)
            return routed
        for item in items:
            routed[table[key_slot(key(item))]].append(item)
        return routed


def cluster_router(masters: Sequence[ClusterNodeLine], endpoints: Sequence[str]) -> Router:
    """A router over endpoints (target index = position) from the masters' slot ranges."""
    table = [-1] * SLOTS
    for line in masters:
        index = endpoints.index(f"{line.address}:{line.port}")
        for start, end in line.slots:
            table[start:end + 1] = [index] * (end - start + 1)
    return Router(table)


def restore_command(restore: bytes, key: bytes, expires_at: int, payload: bytes, replace: bool) -> list[Arg]:
    """RESTORE with an absolute expiry in the target's clock (0: none): time the command waits in a queue
    behind a big key does not stretch the TTL."""
    args: list[Arg] = [restore, key, max(0, expires_at), payload]
    if replace:
        args.append(b"REPLACE")
    if expires_at:
        args.append(b"ABSTTL")
    return args


def restore_bytes(restore: bytes, key: bytes, expires_at: int, payload: bytes, replace: bool) -> bytes:
    """restore_command packed as RESP (the same bytes encode() makes), formatted in one step: a copy packs one per
    key."""
    ttl = b"%d" % max(0, expires_at)
    tail = (b"$7\r\nREPLACE\r\n" if replace else b"") + (b"$6\r\nABSTTL\r\n" if expires_at else b"")
    return b"*%d\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n%s" % (
        4 + replace + bool(expires_at), len(restore), restore, len(key), key, len(ttl), ttl, len(payload), payload,
        tail)


def restore_batch(restore: bytes, records: Sequence[KeyRecord], offset_ms: float, replace: bool) -> bytes:
    """restore_bytes of each record, joined: the same bytes, each expiry moved into the target's clock (offset_ms:
    its clock minus ours; a key about to expire keeps 1 ms, not 0, which is none). What does not depend on the key
    is formatted once, and records are unpacked, not read by name: a copy packs a million of them."""
    tail = b"$7\r\nREPLACE\r\n" if replace else b""
    plain = b"*%d\r\n$%d\r\n%s\r\n$" % (4 + replace, len(restore), restore)
    never = b"\r\n$1\r\n0\r\n$"
    return b"".join(
        b"%s%d\r\n%s%s%d\r\n%s\r\n%s" % (plain, len(key), key, never, len(payload), payload, tail)
        if not expires else restore_bytes(restore, key, max(1, int(expires + offset_ms)), payload, replace)
        for _db, key, payload, expires in records)


def expiry_of(reply: object, absolute: bool, offset_ms: float, now_ms: float) -> float | None:
    """A key's expiry in our clock (unix ms; 0: none; None: the key is gone) from PEXPIRETIME (absolute, in the
    source's clock, offset_ms ahead of ours) or, where the source lacks it, PTTL read at now_ms."""
    if not isinstance(reply, int) or reply == -2:
        return None
    if reply == -1:
        return 0.0
    return reply - offset_ms if absolute else now_ms + reply


def same_payload(a: bytes, b: bytes) -> bool:
    """Two DUMP payloads serialize the same value the same way (the trailer names the writer's version)."""
    return len(a) > TRAILER and a[:-TRAILER] == b[:-TRAILER]


@dataclass
class Counts:
    """One source's keys: read from it, written, found already equal, skipped as existing, in conflict; and how
    many of those read carry a TTL (they may expire on the target before the end)."""

    scanned: dict[int, int] = field(default_factory=dict)
    restored: int = 0
    existing: int = 0
    skipped: int = 0
    conflicts: int = 0
    conflict_keys: list[str] = field(default_factory=list)
    volatile: int = 0
    libraries: int = 0  # function libraries the source holds, carried onto every target master

    @property
    def total(self) -> int:
        return sum(self.scanned.values())

    def add(self, other: Counts) -> None:
        for db, n in other.scanned.items():
            self.scanned[db] = self.scanned.get(db, 0) + n
        self.restored += other.restored
        self.existing += other.existing
        self.skipped += other.skipped
        self.conflicts += other.conflicts
        self.volatile += other.volatile
        self.libraries = max(self.libraries, other.libraries)  # each source shard holds its own copy
        self.conflict_keys = (self.conflict_keys + other.conflict_keys)[:5]

    def balance_problem(self) -> str | None:
        accounted = self.restored + self.existing + self.skipped + self.conflicts
        if accounted != self.total:
            return f"{self.total} keys read but {accounted} accounted for"
        return None


def shown_key(key: bytes) -> str:
    return key.decode("utf-8", "backslashreplace")[:120]


# --- refusals --------------------------------------------------------------------------------------------------


def landed_problem(before: int, after: int, counts: Counts) -> str | None:
    """A target that held `before` keys (none of them a source key) holds `after` now: every key restored must be
    there, except keys with a TTL that may have expired meanwhile. Fewer means the target lost keys (evicted
    under maxmemory, deleted)."""
    least = before + counts.restored - counts.volatile
    if after < least:
        return (f"the target holds {after} keys, at least {least} expected ({before} before + {counts.restored} "
                f"restored, {counts.volatile} of them with a TTL): keys were evicted (maxmemory-policy) or deleted")
    return None


def room_problems(dataset: int, targets: Sequence[tuple[str, int, int, float]]) -> list[str]:
    """targets: (name, used_memory, maxmemory, share of the keys it receives). A target with maxmemory 0 has
    no limit. Needs used + share * dataset * margin <= maxmemory."""
    problems = []
    for name, used, maxmemory, share in targets:
        need = used + int(share * dataset * ROOM_MARGIN)
        if maxmemory and need > maxmemory:
            problems.append(f"{name}: needs about {need >> 20} MiB ({used >> 20} MiB used + {share:.0%} of "
                            f"{dataset >> 20} MiB with a {ROOM_MARGIN - 1:.0%} margin), maxmemory is "
                            f"{maxmemory >> 20} MiB")
    return problems


# --- the resume journal -----------------------------------------------------------------------------------------


@dataclass
class Journal:
    """What a restore did: its source, mode, and the sources it finished (with their counts). finished: every
    check passed; kept so that a run killed after that, in its last steps, is not refused when run again."""

    source: str
    mode: str
    done: dict[str, Counts] = field(default_factory=dict)
    finished: bool = False


def journal_json(journal: Journal) -> str:
    data = {"source": journal.source, "mode": journal.mode, "finished": journal.finished,
            "done": {k: {**asdict(c), "scanned": {str(db): n for db, n in c.scanned.items()}}
                     for k, c in journal.done.items()}}
    return json.dumps(data, indent=2) + "\n"


Count = Annotated[int, Range(0, 1 << 62, "a key count")]  # a whole number (not a bool) from 0 to 2**62


@frozen
class SavedCounts(Versioned):
    """A finished source's Counts as the journal holds them (journal_json): databases as text keys."""

    scanned: dict[str, Count]
    restored: Count
    existing: Count
    skipped: Count
    conflicts: Count
    conflict_keys: tuple[str, ...]
    volatile: Count = 0
    libraries: Count = 0

    def problems(self) -> Iterator[tuple[str, str]]:
        if any(ascii_decimal(db, 0, 99999) is None for db in self.scanned):
            yield "scanned", "names a database that is not a number from 0 to 99999"

    def counts(self) -> Counts:
        return Counts({int(db): n for db, n in self.scanned.items()}, self.restored, self.existing, self.skipped,
                      self.conflicts, list(self.conflict_keys[:5]), self.volatile, self.libraries)


@frozen
class SavedJournal(Versioned):
    """The resume journal's file (journal_json), read back field by field by its types."""

    source: str
    mode: str
    done: dict[str, SavedCounts]
    finished: bool = False

    def problems(self) -> Iterator[tuple[str, str]]:
        if self.mode not in MODES:
            yield "mode", f"is not one of {', '.join(MODES)}"


def _bad(where: str, what: str, detail: str = "") -> OpsctlError:
    return OpsctlError(f"{where}: {what}", detail, "the journal of an unfinished restore is damaged: remove it and "
                       "run the restore again with --mode replace (keys it already wrote are then overwritten)")


def parse_journal(text: str, where: str) -> Journal:
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        raise _bad(where, "not valid JSON") from None
    try:
        saved = SavedJournal.from_json(data)
    except DataMismatch as exc:
        what = "a finished source's counts are malformed" if str(exc).startswith("done.") else \
            "needs source (text), mode (one of " + ", ".join(MODES) + "), done (object) and finished (true or false)"
        raise _bad(where, what, str(exc)) from None
    return Journal(saved.source, saved.mode, {k: c.counts() for k, c in saved.done.items()}, saved.finished)
