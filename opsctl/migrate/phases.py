"""A migration's journal in the target's state dir: per source shard its phase and the stream position applied.

Written whole through opsctl.state.safefs after every applied batch (a temp file renamed over it), so a killed
migrate finds the last position every target shard had taken. The target holds a marker per source shard and
target master that is written in the same script as the batch: a resumed run skips what a marker says is in.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from opsctl.base.errors import OpsctlError, RefusedError
from opsctl.base.frozen import frozen
from opsctl.base.record import DataMismatch, Range, Versioned
from opsctl.state.safefs import read_bounded, write_private
from opsctl.stream.framing import MAX_OFFSET, REPLID_LENGTH, Position

JOURNAL = "migrate-journal.json"
REQUEST = "migrate-cutover.request"
RESULT = "migrate-cutover.json"
PHASES = ("snapshot", "stream")
REF_OPTIONS = {"from_spec", "from_endpoints", "from_password_file", "from_password_env", "from_user", "from_tls_ca",
               "from_tls_cert", "from_tls_key"}  # the options ForeignSource.ref() and a spec's path record
HINT = "remove it to start the migration over (the target must be emptied first)"


@dataclass
class ShardState:
    phase: str  # snapshot (the copy is under way from position) | stream (position applied)
    position: Position
    at: float = 0.0  # stream: when the link read the stream up to position (epoch seconds; 0: not known)


@dataclass
class Journal:
    """source: what the source is (a spec's name and endpoints); source_ref: how a later run reaches it again (the
    command's --from* options, references to secrets, never a secret); fence: each fenced source master's
    min-replicas-* values from before the cutover fenced it (by endpoint), kept from before the first fence until
    the fence is lifted: a cutover killed mid-way leaves the source fenced and a re-run must know what to restore."""

    id: str
    source: str
    shards: dict[str, ShardState] = field(default_factory=dict)
    finished: bool = False
    source_ref: dict[str, str] = field(default_factory=dict)
    fence: dict[str, dict[str, str]] | None = None


class JournalFile:
    """The journal and its lock: shard threads save their own shard's position, one write at a time."""

    def __init__(self, state_dir: Path, journal: Journal) -> None:
        self.path = state_dir / JOURNAL
        self.journal = journal
        self._lock = threading.Lock()

    def save(self, shard: str | None = None, state: ShardState | None = None) -> None:
        with self._lock:
            if shard is not None and state is not None:
                self.journal.shards[shard] = state
            write_private(self.path, journal_json(self.journal))

    def position(self, shard: str) -> ShardState | None:
        with self._lock:
            return self.journal.shards.get(shard)


Offset = Annotated[int, Range(0, MAX_OFFSET, "a replication offset")]


@frozen
class SavedShard(Versioned):
    """A source shard's ShardState as the journal file holds it: its phase, its position's fields, at when known."""

    phase: str
    replid: str
    offset: Offset
    at: float = 0.0

    SPARSE = True  # at 0 (not known) is left out, as before

    def problems(self) -> Iterator[tuple[str, str]]:
        if self.phase not in PHASES:
            yield "phase", f"is not one of {', '.join(PHASES)}"
        if not (len(self.replid) == REPLID_LENGTH and self.replid.isascii() and self.replid.isalnum()):
            yield "replid", f"is not a replication id ({REPLID_LENGTH} letters and digits)"
        if not 0 <= self.at < 1e11:
            yield "at", "is not a time in epoch seconds from 0 to 1e11"


@frozen
class SavedJournal(Versioned):
    """The journal's file (journal_json), read back field by field by its types. A journal written before
    finished, source_ref and fence has none of them: they read as not finished, no options, no fence."""

    id: str
    source: str
    finished: bool
    shards: dict[str, SavedShard]
    source_ref: dict[str, str] = field(default_factory=dict)
    fence: dict[str, dict[str, str]] | None = None

    @classmethod
    def upgraded(cls, data: dict[str, object], written: int) -> dict[str, object]:
        return {"finished": False, **data}

    def problems(self) -> Iterator[tuple[str, str]]:
        if not set(self.source_ref) <= REF_OPTIONS:  # a re-run takes these as its options: no other comes from a file
            yield "source_ref", f"names an option that is not one of {', '.join(sorted(REF_OPTIONS))}"

    @classmethod
    def of(cls, journal: Journal) -> SavedJournal:
        shards = {k: SavedShard(s.phase, s.position.replid, s.position.offset, s.at) for k, s in journal.shards.items()}
        return cls(journal.id, journal.source, journal.finished, shards, journal.source_ref, journal.fence)

    def journal(self) -> Journal:
        shards = {k: ShardState(s.phase, Position(s.replid, s.offset), s.at) for k, s in self.shards.items()}
        return Journal(self.id, self.source, shards, self.finished, dict(self.source_ref), self.fence)


def journal_json(journal: Journal) -> str:
    return json.dumps(SavedJournal.of(journal).to_json(), indent=1)


def parse_journal(text: str, where: str) -> Journal:
    """The journal in text (file where), or an OpsctlError naming the file and the field that is wrong."""
    try:
        return SavedJournal.from_json(json.loads(text)).journal()
    except DataMismatch as exc:
        raise OpsctlError(f"{where}: not a migration journal ({exc})", hint=HINT) from None
    except (ValueError, RecursionError):
        raise OpsctlError(f"{where}: not a migration journal (not JSON)", hint=HINT) from None


def read_journal(state_dir: Path) -> Journal | None:
    """The journal in state_dir, finished or not (None: none)."""
    path = state_dir / JOURNAL
    text = read_bounded(path, HINT)
    return None if text is None else parse_journal(text, str(path))


def load_journal(state_dir: Path, source: str) -> Journal | None:
    """This migration's journal (None: none yet, or a finished one); another source's unfinished one refuses."""
    journal = read_journal(state_dir)
    if journal is None or journal.finished:
        return None
    if journal.source != source:
        raise RefusedError("an unfinished migration from another source is recorded for this target",
                           f"{state_dir / JOURNAL}: source {journal.source}", "finish it (re-run it), or " + HINT)
    return journal


def new_journal(source: str, source_ref: dict[str, str]) -> Journal:
    return Journal(os.urandom(4).hex(), source, source_ref=source_ref)


def marker_name(migration: str, shard: str, tag: str) -> bytes:
    """The target key that says how far a source shard's stream is applied on one target master; tag hashes
    to a slot that master owns."""
    return f"opsctl-migrate:{{{tag}}}:{migration}:{shard}".encode()
