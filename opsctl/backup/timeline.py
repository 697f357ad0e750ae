"""A location's bases over time, and the decisions on them: the base a restore to a time starts from, what
retention drops. Pure; the object layout is in docs/internals.md ("The continuous archive").

`opsctl backup list` and `backup prune` on a location: its bases, what each shard's archive covers, and
retention (opsctl.backup.timeline decides; this reads and deletes).

Prune records what it dropped (`retention/<spec>.json`) before deleting, manifest first: a base half deleted by a
killed prune reads as unfinished (never restored from), and the next prune finishes it."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

from opsctl.backup.manifest import MANIFEST
from opsctl.backup.segment import SegmentProblem, chain, decode_segment, parse_name
from opsctl.backup.store import Store
from opsctl.base.errors import OpsctlError, RefusedError, echo
from opsctl.base.record import FLOOR, ascii_decimal, stored_time
from opsctl.stream.framing import Position, position_from

ARCHIVE = "archive.json"
CHANGED = "changed.json"  # in a base whose topology's shards changed while it was archived: what it serves until
STREAM = "stream"
_BASE = re.compile(r"^(?P<spec>.+)-(?P<stamp>[0-9]{8}T[0-9]{6}Z)(?:-[0-9]{1,2})?$")
DAY = 86400.0
MAX_SHARDS = 1 << 16  # the shard numbers a manifest takes
TO_TIME_AHEAD = 60.0  # s a --to-time may lie ahead of this clock (typed "now" on a host whose clock runs ahead)


@dataclass(frozen=True)
class Base:
    """A backup in a location. taken: from when it serves a restore (an archive's every RDB was saved by then;
    a plain backup's name time); positions: per shard, where its stream continues (archive bases only)."""

    name: str
    spec: str
    taken: float
    complete: bool
    positions: dict[int, Position] = field(default_factory=dict)
    objects: tuple[str, ...] = ()

    @property
    def archived(self) -> bool:
        return bool(self.positions)


def segment_prefix(base: str, shard: int) -> str:
    """Where a shard's segments after a base live: `<base>/stream/shard-<n>/`."""
    return f"{base}/{STREAM}/shard-{shard}/"


def stamp_time(stamp: str) -> float | None:
    """A base name's UTC stamp as a unix time; None for one that is no date (20261399T...)."""
    try:
        return datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None


def iso(moment: float) -> str:
    """`2026-11-27T14:01:00.250Z`: milliseconds, UTC."""
    return datetime.fromtimestamp(moment, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_time(text: str, now: float | None = None) -> float:
    """An ISO 8601 time with a zone (`2026-11-27T14:01:00Z`, `...+01:00`) as a unix time; a time without a zone is
    refused (a restore to the wrong hour would look fine), and so is one after now (no archive reaches it yet: the
    report would name a point that was never archived) or before 1970."""
    now = time.time() if now is None else now
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise OpsctlError(f"--to-time {echo(text, 40)} is not an ISO 8601 time",
                          hint="write e.g. 2026-11-27T14:01:00Z") from None
    if moment.tzinfo is None:
        raise OpsctlError(f"--to-time {echo(text, 40)} has no time zone",
                          hint="add Z for UTC: e.g. 2026-11-27T14:01:00Z")
    try:
        until = moment.timestamp()
    except (OverflowError, OSError, ValueError):
        until = math.inf
    if not (math.isfinite(until) and FLOOR <= until <= now + TO_TIME_AHEAD):
        raise OpsctlError(f"--to-time {echo(text, 40)} is {'before 1970' if until < FLOOR else 'in the future'}",
                          hint=f"give a time from the archive's past, at most now ({iso(now)})")
    return until


def group(names: Sequence[str]) -> dict[str, list[str]]:
    """A location's objects by their first path part (a base's name), base-shaped names with a real date only."""
    out: dict[str, list[str]] = {}
    for name in names:
        top = name.split("/", 1)[0]
        match = _BASE.match(top)
        if match and "/" in name and stamp_time(match.group("stamp")) is not None:
            out.setdefault(top, []).append(name)
    return out


def archive_json(taken: float, positions: dict[int, Position]) -> str:
    return json.dumps({"format": 1, "taken": taken,
                       "shards": {str(n): p.to_json() for n, p in sorted(positions.items())}}, indent=2) + "\n"


def parse_archive(text: str, where: str, now: float | None = None) -> tuple[float, dict[int, Position]]:
    """archive.json: its format, the time it serves from (a real time, not NaN or 9999), each shard's number
    (1..16384) and position; anything else is refused by the file's name."""
    problem = OpsctlError(f"{where}: not an archive description opsctl wrote",
                          hint="the archive is damaged: restore from another base")
    try:
        data = json.loads(text)
        taken = stored_time(data["taken"], time.time() if now is None else now)
        shards = data["shards"]
        if data["format"] != 1 or taken is None or not isinstance(shards, dict) or not shards or \
                not all(ascii_decimal(n, 0, MAX_SHARDS) is not None for n in shards):
            raise problem
        positions = {int(n): position_from(p, f"{where} shard {n}") for n, p in shards.items()}
    except (ValueError, KeyError, TypeError):
        raise problem from None
    return taken, positions


@dataclass(frozen=True)
class Changed:
    """The topology's shards (or a cluster's slots) changed under a running archive: its base serves a restore only
    up to `until` (the last look that still found the base's shards and slots; a new shard may hold writes from any
    moment after), seen then. was == now: the same shards, slots moved between them."""

    until: float
    seen: float
    was: tuple[int, ...]
    now: tuple[int, ...]

    def text(self) -> str:
        if self.was == self.now:
            return f"slots moved between shards {_numbers(self.now)}"
        return f"shards {_numbers(self.was)} became {_numbers(self.now)}"


def _numbers(shards: Sequence[int]) -> str:
    return ", ".join(map(str, shards)) or "none"


def changed_json(change: Changed) -> str:
    return json.dumps({"format": 1, "until": change.until, "seen": change.seen, "was": list(change.was),
                       "now": list(change.now)}, indent=2) + "\n"


def parse_changed(text: str, where: str, now: float | None = None) -> Changed:
    """changed.json: its format, two real times in order, the shard numbers (1..MAX_SHARDS) before and after;
    anything else is refused by the file's name."""
    problem = OpsctlError(f"{where}: not a topology change record opsctl wrote",
                          hint="the archive is damaged: restore to a time another base serves")
    clock = time.time() if now is None else now
    try:
        data = json.loads(text)
        until, seen = stored_time(data["until"], clock), stored_time(data["seen"], clock)
        shards = [data["was"], data["now"]]
        if data["format"] != 1 or until is None or seen is None or until > seen or not all(
                isinstance(s, list) and len(s) <= MAX_SHARDS and all(
                    type(n) is int and 1 <= n <= MAX_SHARDS for n in s) for s in shards):
            raise problem
    except (ValueError, KeyError, TypeError):
        raise problem from None
    return Changed(until, seen, tuple(shards[0]), tuple(shards[1]))


def base_of(name: str, objects: list[str], archive: tuple[float, dict[int, Position]] | None) -> Base:
    match = _BASE.match(name)
    assert match is not None
    complete = f"{name}/{MANIFEST}" in objects
    stamped = stamp_time(match.group("stamp"))
    assert stamped is not None  # group() keeps only names with a real date
    taken, positions = archive if archive and complete else (stamped, {})
    return Base(name, match.group("spec"), taken, complete, positions, tuple(objects))


def base_for(bases: Sequence[Base], until: float, spec: str, dropped_before: float | None) -> Base:
    """The newest complete archive base of spec that serves a restore to `until`; a time before every base is
    refused, by retention's name when `backup prune` dropped it."""
    mine = sorted((b for b in bases if b.spec == spec and b.archived and b.complete), key=lambda b: b.taken)
    before = [b for b in mine if b.taken <= until]
    if before:
        return before[-1]
    if dropped_before is not None and until < dropped_before:
        raise RefusedError(f"{iso(until)} was dropped by retention: `backup prune` removed the bases and segments "
                           f"before {iso(dropped_before)} (nothing was written)",
                           hint="pick a later time (`opsctl backup list --from URL` shows what is kept)")
    first = f"the first archive base serves from {iso(mine[0].taken)}" if mine else "it holds no archive base"
    raise RefusedError(f"no archive of {spec} reaches back to {iso(until)}: {first} (nothing was written)",
                       hint="`opsctl backup list --from URL` shows what the location holds")


def to_prune(bases: Sequence[Base], now: float, keep_days: float) -> list[Base]:
    """The bases (with their segments) a retention of keep_days drops: everything older than the cutoff except the
    newest archive base before it (a restore to the cutoff starts there) and the newest complete base of each spec
    (never an empty location). Unfinished bases older than the cutoff go too."""
    cutoff = now - keep_days * DAY
    keep: set[str] = set()
    for spec in {b.spec for b in bases}:
        mine = sorted((b for b in bases if b.spec == spec), key=lambda b: b.taken)
        complete = [b for b in mine if b.complete]
        if complete:
            keep.add(complete[-1].name)
        older = [b for b in complete if b.archived and b.taken < cutoff]
        if older:
            keep.add(older[-1].name)
    return [b for b in bases if b.taken < cutoff and b.name not in keep]


def earliest_kept(bases: Sequence[Base], spec: str) -> float | None:
    kept = [b.taken for b in bases if b.spec == spec and b.archived and b.complete]
    return min(kept) if kept else None


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
