"""`opsctl backup list` and `backup prune` on a location: its bases, what each shard's archive covers, and
retention (opsctl.backup.timeline decides; this reads and deletes).

Prune records what it dropped (`retention/<spec>.json`) before deleting, manifest first: a base half deleted by a
killed prune reads as unfinished (never restored from), and the next prune finishes it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from opsctl.backup.manifest import MANIFEST
from opsctl.backup.segment import SegmentProblem, chain, decode_segment, parse_name
from opsctl.backup.store import Store
from opsctl.backup.timeline import (
    ARCHIVE,
    Base,
    base_of,
    earliest_kept,
    group,
    parse_archive,
    segment_prefix,
    to_prune,
)
from opsctl.base.errors import OpsctlError
from opsctl.base.record import stored_time

RETENTION = "retention"


@dataclass(frozen=True)
class ShardSpan:
    """What one shard's archive after a base holds: segments, the offset it reaches, and until when it is known
    complete (its last segment's close), or the problem that stops it."""

    shard: int
    segments: int
    offset: int
    until: float | None
    problem: str = ""


@dataclass(frozen=True)
class Listed:
    base: Base
    spans: tuple[ShardSpan, ...]


def read_bases(store: Store) -> list[Base]:
    """Every base in the location, with its archive description when it has one."""
    out = []
    for name, objects in sorted(group(store.names()).items()):
        archive = None
        if f"{name}/{ARCHIVE}" in objects:
            data = store.get_bytes(f"{name}/{ARCHIVE}") or b""
            archive = parse_archive(data.decode("utf-8", "replace"), store.where(f"{name}/{ARCHIVE}"))
        out.append(base_of(name, objects, archive))
    return out


def span(store: Store, base: Base, shard: int) -> ShardSpan:
    prefix = segment_prefix(base.name, shard)
    start = base.positions[shard].offset
    names = [n for o in base.objects if o.startswith(prefix) and (n := parse_name(o))]
    try:
        segments = chain(start, names, store.where(prefix))
        if not segments:
            return ShardSpan(shard, 0, start, None)
        last = segments[-1]
        header, _ = decode_segment(last, store.get_bytes(prefix + last.text) or b"", store.where(prefix + last.text))
    except SegmentProblem as exc:
        return ShardSpan(shard, len(names), start, None, exc.summary)
    return ShardSpan(shard, len(segments), last.end, header.closed)


def catalog(store: Store) -> list[Listed]:
    return [Listed(b, tuple(span(store, b, n) for n in sorted(b.positions))) for b in read_bases(store)]


def dropped_before(store: Store, spec: str) -> float | None:
    """Before when retention dropped spec's archive, as `backup prune` recorded it; None when it never did."""
    data = store.get_bytes(f"{RETENTION}/{spec}.json")
    if data is None:
        return None
    try:
        value = json.loads(data)["dropped_before"]
        if value is None:
            return None
        moment = stored_time(value, time.time())  # not NaN, not 1e308, not a string: a time from 1970 to now
        if moment is None:
            raise ValueError(value)
        return moment
    except (ValueError, KeyError, TypeError, RecursionError):
        raise OpsctlError(f"{store.where(f'{RETENTION}/{spec}.json')} is not a retention record opsctl wrote",
                          hint="remove it: `backup prune` writes it again") from None


def prune(store: Store, keep_days: float, now: float | None = None) -> list[str]:
    """The bases (and their segments) retention drops, deleted; their names."""
    now = time.time() if now is None else now
    bases = read_bases(store)
    dropped = to_prune(bases, now, keep_days)
    names = {b.name for b in dropped}
    for spec in sorted({b.spec for b in dropped if b.archived}):
        kept = [b for b in bases if b.name not in names]
        before = max(filter(None, [earliest_kept(kept, spec), dropped_before(store, spec)]), default=None)
        record = {"spec": spec, "dropped_before": before, "keep_days": keep_days, "pruned_at": now}
        store.put_bytes(f"{RETENTION}/{spec}.json", (json.dumps(record, indent=2) + "\n").encode())
    for base in dropped:
        first = [o for o in base.objects if o == f"{base.name}/{MANIFEST}"]
        store.delete(first + [o for o in base.objects if o not in first])
    return sorted(names)
