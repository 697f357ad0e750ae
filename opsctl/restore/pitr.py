"""Restore to a time: the newest archive base serving it, each shard's archived commands up to it replayed into
its scratch server, then the usual copy into any shape. Every segment is checked before a scratch server starts;
a time no archiver covered is refused (docs/internals.md, "The continuous archive")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from opsctl.backup.segment import SegmentProblem, applied, chain, cut, decode_segment, parse_name
from opsctl.backup.store import Store
from opsctl.backup.timeline import (
    CHANGED,
    Base,
    base_for,
    dropped_before,
    iso,
    parse_changed,
    read_bases,
    segment_prefix,
)
from opsctl.base.errors import OpsctlError, RefusedError
from opsctl.net.connection import Connection
from opsctl.net.resp import encode
from opsctl.observe.replies import RespError
from opsctl.stream.framing import Entry, Position

SEGMENT_LIMIT = 1 << 30
BATCH = 1000


@dataclass(frozen=True)
class ShardPoint:
    """The exact point a shard is restored to: its stream position, and when its last replayed command was read
    (None: the base itself)."""

    shard: int
    position: Position
    last_read: float | None
    commands: int

    def text(self) -> str:
        when = f"last command read {iso(self.last_read)}" if self.last_read else "the base itself"
        return (f"shard-{self.shard} at {self.position.replid}:{self.position.offset} ({when}, "
                f"{self.commands} commands replayed)")


@dataclass
class TimePlan:
    base: Base
    until: float
    replays: dict[int, list[tuple[bytes, ...]]]
    points: dict[int, ShardPoint]

    def text(self) -> str:
        return f" replayed to {iso(self.until)}: " + "; ".join(p.text() for _, p in sorted(self.points.items()))


def plan_to_time(store: Store, until: float) -> TimePlan:
    """The base and each shard's commands up to `until`, every segment checked. RefusedError (nothing written)
    for a time no archive serves, SegmentProblem naming a damaged or missing segment."""
    bases = read_bases(store)
    specs = sorted({b.spec for b in bases if b.archived})
    if len(specs) > 1:
        raise RefusedError(f"{store.location.text} holds the archives of {', '.join(specs)}",
                           hint="archive each topology under its own prefix (--to s3://BUCKET/PREFIX/NAME)")
    if not specs:  # no topology's name to say: the location's instead
        plain = sorted(b.name for b in bases if b.complete)
        raise RefusedError(f"no archive in {store.location.text} reaches back to {iso(until)}: it holds no archive "
                           "base (`backup --continuous` writes them; nothing was written)",
                           hint=f"restore a backup it holds without --to-time: opsctl restore -f SPEC --from "
                                f"{store.where(plain[-1])}" if plain else
                           "`opsctl backup list --from URL` shows what the location holds")
    spec = specs[0]
    newest = base_for(bases, until, spec, dropped_before(store, spec))
    older = sorted((b for b in bases if b.spec == spec and b.archived and b.complete and b.taken < newest.taken),
                   key=lambda b: b.taken, reverse=True)
    first: RefusedError | None = None
    for base in [newest, *older]:  # a newer base's first moments are covered by the older chain it overlaps
        try:
            return _plan(store, base, until)
        except RefusedError as exc:
            first = first or exc
    assert first is not None
    raise first


def _plan(store: Store, base: Base, until: float) -> TimePlan:
    refuse_changed(store, base, until)
    replays, points = {}, {}
    for shard, start in sorted(base.positions.items()):
        entries, replids = shard_entries(store, base, shard, until)
        keep = cut(entries, until)
        replays[shard] = applied(entries[:keep])
        position = Position(replids[keep - 1], entries[keep - 1].end) if keep else start
        points[shard] = ShardPoint(shard, position, entries[keep - 1].arrived if keep else None,
                                   len(replays[shard]))
    return TimePlan(base, until, replays, points)


def refuse_changed(store: Store, base: Base, until: float) -> None:
    """A base whose topology's shards or slots changed while it was archived serves only up to the change: a new
    shard's writes are in no chain of it, a removed one's chain ends, a moved key is in two chains read apart
    (RefusedError after that, naming the window)."""
    name = f"{base.name}/{CHANGED}"
    if name not in base.objects:
        return
    change = parse_changed((store.get_bytes(name) or b"").decode("utf-8", "replace"), store.where(name))
    if until > change.until:
        raise RefusedError(f"{iso(until)} is after the topology changed under base {base.name} "
                           f"({change.text()}, between {iso(change.until)} and {iso(change.seen)}): its archive "
                           "does not hold every shard's writes from then on (nothing was written)",
                           hint=f"restore to {iso(change.until)} or earlier, or to a time the next base serves "
                                "(`opsctl backup list --from URL` shows what each base covers)")


def shard_entries(store: Store, base: Base, shard: int, until: float) -> tuple[list[Entry], list[str]]:
    """The shard's commands from its base up to the first segment read after `until` (and each one's replication
    id), the chain and coverage of `until` checked."""
    prefix = segment_prefix(base.name, shard)
    where = store.where(prefix)
    names = chain(base.positions[shard].offset,
                  [n for o in base.objects if o.startswith(prefix) and (n := parse_name(o))], where)
    entries: list[Entry] = []
    replids: list[str] = []
    known_until = base.taken  # nothing read by then is missing
    for name in names:
        data = store.get_bytes(prefix + name.text, SEGMENT_LIMIT)
        if data is None:
            raise SegmentProblem(store.where(prefix + name.text), "is missing")
        header, found = decode_segment(name, data, store.where(prefix + name.text))
        if header.resumed and known_until < until < header.first:
            raise RefusedError(f"{iso(until)} falls where no archiver read shard {shard}'s stream (from "
                               f"{iso(known_until)} to {iso(header.first)}): the commands of that window carry the "
                               "time they were read, not written (nothing was written)",
                               hint=f"restore to {iso(known_until)} or to {iso(header.first)} or later")
        if header.first > until:
            return entries, replids
        entries += found
        replids += [header.replid] * len(found)
        known_until = header.closed
    if known_until < until:
        raise RefusedError(f"shard {shard}'s archive is complete only until {iso(known_until)}, before "
                           f"{iso(until)} (the archiver stopped or has not closed that segment yet; nothing was "
                           "written)", hint=f"restore to {iso(known_until)} or earlier, or wait for the archiver")
    return entries, replids


def replay(socket_path: str, label: str, commands: Sequence[tuple[bytes, ...]]) -> None:
    """The commands run in order on a scratch server, pipelined; a refused one is named (the archive holds what
    the master ran, so this is a scratch server that cannot, e.g. an older version)."""
    with Connection.on_unix(socket_path, label, 120.0).dedicated(120.0) as pipe:
        for at in range(0, len(commands), BATCH):
            batch = commands[at:at + BATCH]
            pipe.send(b"".join(encode(list(c)) for c in batch))
            for i, reply in enumerate(pipe.read(len(batch))):
                if isinstance(reply, RespError):
                    args = " ".join(a[:40].decode("utf-8", "replace") for a in batch[i][:3])
                    raise OpsctlError(f"replaying {label}: command {at + i + 1} ({args}) was refused: {reply}",
                                      hint="restore with the server version the archive was taken from")
