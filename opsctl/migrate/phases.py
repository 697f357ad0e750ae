"""A migration's journal in the target's state dir: per source shard its phase and the stream position applied.

Written whole through opsctl.state.safefs after every applied batch (a temp file renamed over it), so a killed
migrate finds the last position every target shard had taken. The target holds a marker per source shard and
target master that is written in the same script as the batch: a resumed run skips what a marker says is in.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from opsctl.base.errors import OpsctlError, RefusedError
from opsctl.state.safefs import read_bounded, write_private
from opsctl.stream.framing import Position, position_from

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


def journal_json(journal: Journal) -> str:
    return json.dumps({"id": journal.id, "source": journal.source, "finished": journal.finished,
                       "shards": {k: {"phase": s.phase, **s.position.to_json(), **({"at": s.at} if s.at else {})}
                                  for k, s in journal.shards.items()},
                       "source_ref": journal.source_ref, "fence": journal.fence}, indent=1)


def parse_journal(text: str, where: str) -> Journal:
    try:
        data = json.loads(text)
        shards = {k: ShardState(_phase(v["phase"]), position_from(v, f"{where}: shards.{k}"), _time(v.get("at", 0)))
                  for k, v in data["shards"].items()}
        ref = {str(k): str(v) for k, v in dict(data.get("source_ref") or {}).items()}
        if not set(ref) <= REF_OPTIONS:  # a re-run takes these as its options: no other option comes from a file
            raise ValueError(sorted(set(ref) - REF_OPTIONS))
        fence = data.get("fence")
        fenced = None if fence is None else {str(e): {str(k): str(v) for k, v in dict(values).items()}
                                             for e, values in dict(fence).items()}
        return Journal(str(data["id"]), str(data["source"]), shards, bool(data.get("finished")), ref, fenced)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise OpsctlError(f"{where}: not a migration journal ({type(exc).__name__})", hint=HINT) from None


def _time(value: object) -> float:
    """A journaled time: epoch seconds, not before 0 and not NaN (a file read back is checked)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e11:
        raise ValueError(value)
    return float(value)


def _phase(value: object) -> str:
    if value not in PHASES:
        raise ValueError(value)
    return str(value)


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
