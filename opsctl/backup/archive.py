"""`opsctl backup --continuous`: a base backup, then every shard's replication stream in segments, until stopped.

Segments are acknowledged to the master once durable; a kill resumes after the last one; a StreamGap starts a new
base, said as such; SIGTERM/SIGINT close every open segment first (docs/internals.md, "The continuous archive").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

from opsctl.backup.follow import RETRY_BASE, ArchiveProgress, Fleet, Placer, SegmentArchived
from opsctl.backup.lease import Lease, archive_lease
from opsctl.backup.manifest import MANIFEST, Manifest
from opsctl.backup.offsite import staged_backup
from opsctl.backup.rdb import repl_position
from opsctl.backup.save import BackupOptions
from opsctl.backup.segment import chain, decode_segment, encode_segment, parse_name
from opsctl.backup.store import Store
from opsctl.backup.timeline import ARCHIVE, Base, archive_json, base_of, group, parse_archive, segment_prefix
from opsctl.base import stop
from opsctl.base.errors import OpsctlError, RefusedError
from opsctl.base.events import Emit, Note
from opsctl.base.poll import Pending, wait_for
from opsctl.net.connector import Connector
from opsctl.net.discover import discover
from opsctl.net.fanout import Borrowed, fan_out, shared_pool
from opsctl.net.rawpipe import PIPE_ERRORS
from opsctl.spec.layout import Node
from opsctl.stream import Stream, StreamGap, open_stream
from opsctl.stream.framing import Entry, Position

HEAD_BYTES = 1 << 20
HAND_OVER = 0.5  # s an old stream may take to deliver one more command before it is closed
RETRY_ATTACH = 0.5  # s between tries to find a shard's master and attach to it
BACKOFF_FIRST, BACKOFF_MOST = 0.5, 10.0  # s between tries of a store that failed: doubling, capped
OUTAGE_LIMIT = 86400.0  # s to keep trying a failed store (the masters' backlogs run out long before)
PROGRESS_EVERY = 1.0  # s between heartbeats (ArchiveProgress): a bar's pace; the printer thins them off a terminal


class StoreDown(OpsctlError):
    """A segment could not be written to the store; the caller closes the streams and waits for the store."""
RESUME_HINT = "run the same command again: it resumes after the last archived segment"


@dataclass(frozen=True)
class ArchiveOptions:
    segment_seconds: float = 1.0
    segment_bytes: int = 8 << 20
    reconnect_timeout: float = 120.0
    base_every: float | None = None  # seconds between bases taken while the streams keep being archived
    backup: BackupOptions = field(default_factory=BackupOptions)


@dataclass
class ShardStream:
    """One shard's stream: archived up to `position`; `pending` read but not yet archived."""

    shard: int
    base: str
    position: Position
    stream: Stream | None = None
    pending: list[Entry] = field(default_factory=list)
    pending_bytes: int = 0
    resumed: bool = True  # the next segment is the first since this link (re)attached
    segments: int = 0  # stored by this link, and their bytes: the heartbeat's counts
    stored_bytes: int = 0
    trying: Future[Stream | str] | None = None  # an attach under way in the background (a reason: it failed)
    waiting: float | None = None  # since when (monotonic) the link waits for its shard's master
    retry_at: float = 0.0
    why: str = ""  # why it waits, said once

    def prefix(self) -> str:
        return segment_prefix(self.base, self.shard)


# --- bases ---------------------------------------------------------------------------------------------------------


def take_base(connector: Connector, store: Store, state_dir: Path, emit: Emit, options: BackupOptions) -> Base:
    """A backup into the store, then archive.json: each shard's position read from its RDB's head (the exact
    point its file holds), and the time from which the base serves a restore (every fork is behind it)."""
    with staged_backup(connector, store, state_dir, emit, options) as (folder, manifest):
        taken = time.time()
        positions = {shard.shard: _position_in(folder, shard.file) for shard in manifest.shards}
        store.put_bytes(f"{folder.name}/{ARCHIVE}", archive_json(taken, positions).encode())
    names = [f"{folder.name}/{MANIFEST}", f"{folder.name}/{ARCHIVE}"]
    emit(Note(f"base {store.where(folder.name)}: {_shards_text(manifest)}"))
    return base_of(folder.name, names, (taken, positions))


def _shards_text(manifest: Manifest) -> str:
    return f"{len(manifest.shards)} shard(s), {manifest.total_keys} keys; archiving each shard's stream from here"


def _position_in(folder: Path, file: str) -> Position:
    with open(folder / file, "rb") as handle:
        found = repl_position(handle.read(HEAD_BYTES))
    if found is None:
        raise OpsctlError(f"{file} carries no replication position (repl-id, repl-offset)",
                          hint="a continuous archive needs each shard saved by a replica or by a master with a "
                               "replication backlog; give every shard a replica")
    return Position(*found)


def latest_base(store: Store, spec: str) -> Base | None:
    """The newest complete archive base of spec in the store, with its objects; None when there is none."""
    grouped = group(store.names(f"{spec}-"))
    for name in sorted(grouped, reverse=True):
        objects = grouped[name]
        if f"{name}/{ARCHIVE}" in objects and f"{name}/{MANIFEST}" in objects:
            data = store.get_bytes(f"{name}/{ARCHIVE}") or b""
            base = base_of(name, objects, parse_archive(data.decode("utf-8", "replace"), store.where(name)))
            if base.spec == spec:
                return base
    return None


def resume_position(store: Store, base: Base, shard: int) -> Position:
    """Where a shard's archive ends: after its last segment (checked), else at its base."""
    start = base.positions[shard]
    names = [n for o in base.objects if o.startswith(segment_prefix(base.name, shard)) and (n := parse_name(o))]
    segments = chain(start.offset, names, store.where(segment_prefix(base.name, shard)))
    if not segments:
        return start
    last = segments[-1]
    where = store.where(segment_prefix(base.name, shard) + last.text)
    header, _ = decode_segment(last, store.get_bytes(segment_prefix(base.name, shard) + last.text) or b"", where)
    return Position(header.replid, last.end)


# --- the streams ---------------------------------------------------------------------------------------------------


def shard_masters(connector: Connector) -> dict[int, Node]:
    """Each shard's master now (after a failover, the promoted replica), by the spec's shard number."""
    out: dict[int, Node] = {}
    for live in discover(connector):
        shard = connector.loaded.layout.shard_of(live.node.name) if live.role == "master" else None
        if shard is not None:
            out[shard.index] = live.node
    return out


def _attach_once(connector: Connector, shard: int, since: Position, state_dir: Path) -> Stream | str:
    """One try (in the background) at the shard's master as placed now: the stream, else why not. StreamGap
    passes through: the history is gone."""
    try:
        node = shard_masters(connector).get(shard)
        if node is None:
            return f"shard {shard} has no master"
        return open_stream(connector, node, since=since, rdb_to=state_dir / "unused.rdb", timeout=10.0)
    except StreamGap:
        raise
    except (OpsctlError, *PIPE_ERRORS) as exc:
        return f"{type(exc).__name__}: {exc}"


def attach(connector: Connector, link: ShardStream, state_dir: Path, emit: Emit, timeout: float) -> None:
    """One step of attaching the link, never waiting: a try started in the background (every RETRY_ATTACH s), or
    its outcome taken. A shard without a master waits so without holding up the others (each link its own; the
    heartbeat goes on), said once; for `timeout` at most while the fleet still places that shard (one a scale-in
    removed waits for the new base that drops it). A stop asked for meanwhile leaves the link detached."""
    now = time.monotonic()
    if link.trying is None:
        if now >= link.retry_at:
            link.waiting = link.waiting or now
            link.trying = shared_pool().submit(_attach_once, connector, link.shard, link.position, state_dir)
        return
    if not link.trying.done():
        return
    found, link.trying = link.trying.result(), None
    if isinstance(found, Stream):
        if link.why:
            emit(Note(f"shard {link.shard}: attached to {found.label} after {now - (link.waiting or now):.1f}s"))
        link.stream, link.resumed, link.waiting, link.why = found, True, None, ""
        return
    if not link.why:
        emit(Note(f"shard {link.shard}: waiting for its master ({found}); the other shards are read meanwhile"))
    link.why, link.retry_at = found, now + RETRY_ATTACH
    placed = any(shard.index == link.shard for shard in connector.loaded.layout.shards)
    if placed and now - (link.waiting or now) >= timeout:
        raise OpsctlError(f"cannot attach to shard {link.shard}'s master for {timeout:.0f}s", found, RESUME_HINT)


def flush(store: Store, link: ShardStream, emit: Emit) -> None:
    """The pending commands as one segment, durable in the store, then acknowledged to the master."""
    if not link.pending:
        return
    assert link.stream is not None
    name, data = encode_segment(link.shard, link.stream.position.replid, link.position.offset, link.pending,
                                time.time(), link.resumed)
    try:
        store.put_bytes(link.prefix() + name.text, data)
    except stop.Stopped:
        raise  # a stop request is no store failure: the caller ends normally (the segment stays in the backlog)
    except (OpsctlError, OSError) as exc:
        raise StoreDown(f"shard {link.shard}'s segment {name.text} could not be stored: "
                        f"{getattr(exc, 'summary', exc)}", hint=RESUME_HINT) from None
    durable = time.time()
    link.stream.ack(name.end)
    emit(SegmentArchived(link.shard, name.text, name.start, name.end, len(link.pending), len(data),
                         link.pending[0].arrived, link.pending[-1].arrived, durable))
    link.position = Position(link.stream.position.replid, name.end)
    link.pending, link.pending_bytes, link.resumed = [], 0, False
    link.segments, link.stored_bytes = link.segments + 1, link.stored_bytes + len(data)


def progress(links: list[ShardStream]) -> ArchiveProgress:
    """The heartbeat: what the links stored since the base, and where each shard is archived up to."""
    offsets = {link.shard: link.position.offset for link in links}
    return ArchiveProgress(links[0].base if links else "", sum(link.segments for link in links),
                           sum(link.stored_bytes for link in links), offsets)


def _due(link: ShardStream, options: ArchiveOptions, now: float) -> bool:
    return bool(link.pending) and (now - link.pending[0].arrived >= options.segment_seconds
                                   or link.pending_bytes >= options.segment_bytes)


def pump(connector: Connector, store: Store, links: list[ShardStream], state_dir: Path, emit: Emit,
         options: ArchiveOptions, next_base: Callable[[bool], Future[Base] | None], lease: Lease,
         fleet: Fleet) -> Base:
    """Read every shard's stream round the clock, closing segments when due, until a stop is asked for (every
    open segment closed first: Stopped), a shard's history is gone (StreamGap, segments closed first) or a base
    next_base() started in the background is there (returned, the old segments closed: the chains overlap); one
    at once (next_base(True)) when the fleet's shards changed. The lease lost to another archiver stops it before
    another segment is written (LeaseLost). Runs inside the caller's stop.finishing() region (a signal is polled)."""
    wait = min(0.05, options.segment_seconds / 10)
    future: Future[Base] | None = None
    beat = time.monotonic()
    while True:
        if time.monotonic() - beat >= PROGRESS_EVERY:  # also with no write coming: alive, and how far
            beat = time.monotonic()
            emit(progress(links))
        lease.check()
        if any(link.stream is None for link in links):
            fleet.hurry()  # the master it waits for may be on a node placed since the last look
        fleet.look()
        changed = fleet.changed(store)  # recorded in the base at once, also while a periodic base runs
        future = future or (None if stop.requested() else next_base(changed))  # no new base once stopping
        if future is not None and future.done() and stop.requested() is None:  # a stop: this chain ends here
            if (new := _finished(future, emit)) is not None:
                return new  # the old links stay open: hand_over ends them once the new ones read
            future = None
        try:
            for link in links:
                _read(connector, store, link, state_dir, emit, options, wait, flush_when_due=False)
            flush_due(store, links, options, emit)
            if all(link.stream is None for link in links):
                time.sleep(wait)  # every shard waits for its master: no read paces the loop
        except StreamGap:
            for link in links:
                flush(store, link, emit)  # the other shards' commands read so far: archived, then a new base
            raise
        except StoreDown as down:
            ride_out(store, links, emit, lease, down)
            continue
        if stop.requested() is not None:
            try:
                for link in links:
                    flush(store, link, emit)
            except StoreDown as down:
                stop.check(f"{down.summary}: what was read and not stored is still in the masters' backlogs",
                           RESUME_HINT)
            stop.check(f"every segment read is archived: {_archived(links)}", RESUME_HINT)


def ride_out(store: Store, links: list[ShardStream], emit: Emit, lease: Lease, down: StoreDown) -> None:
    """A store that failed a write: every stream closed and what was read since each shard's last stored segment
    let go (the masters' backlogs hold it), the store tried again with a doubling pause (a renewal of the lease:
    a write) until it answers, then each shard's position taken from what the store holds (a segment stored
    although its write was reported failed is kept, not written twice). The links attach again on the next read:
    from the backlog when it still holds the position, else StreamGap, a new base, said."""
    started = time.monotonic()
    emit(Note(f"the store failed ({down.summary}); the streams are closed and read again from the last stored "
              "segment once the store answers (trying again with backoff)"))
    close_all(links)
    for link in links:
        link.pending, link.pending_bytes = [], 0
    pause = [BACKOFF_FIRST]

    def answers() -> bool | Pending:
        stop.check("nothing read is lost: the masters' backlogs hold what was not stored", RESUME_HINT)
        try:
            lease.renew()
        except stop.Stopped:
            raise
        except (OpsctlError, OSError) as exc:
            return Pending(f"{getattr(exc, 'summary', exc)}")
        lease.check()
        return True

    def backoff() -> float:
        now = pause[0]
        pause[0] = min(now * 2, BACKOFF_MOST)
        return now

    wait_for(answers, OUTAGE_LIMIT, "the store", backoff)
    for link in links:
        link.position = stored_position(store, link)
    emit(Note(f"the store answers again after {time.monotonic() - started:.1f}s; reading each shard again from its "
              "last stored segment: " + ", ".join(f"shard {k.shard} after offset {k.position.offset}"
                                                   for k in links)))


def stored_position(store: Store, link: ShardStream) -> Position:
    """Where the store says a link's archive ends: after the segment that begins at its position when one is
    there (written, its acknowledgement lost), else its position."""
    stored = [n for o in store.names(link.prefix()) if (n := parse_name(o)) and n.start == link.position.offset]
    if not stored:
        return link.position
    last = max(stored, key=lambda n: n.end)
    where = store.where(link.prefix() + last.text)
    header, _ = decode_segment(last, store.get_bytes(link.prefix() + last.text) or b"", where)
    return Position(header.replid, last.end)


def _finished(future: Future[Base], emit: Emit) -> Base | None:
    """The base a background run took; None (said) when it failed: the archive goes on with the old one."""
    try:
        return future.result()
    except stop.Stopped:
        raise
    except OpsctlError as exc:
        emit(Note(f"a new base failed ({exc.summary}); archiving on from the current base"))
        return None


def flush_due(store: Store, links: list[ShardStream], options: ArchiveOptions, emit: Emit) -> None:
    """Every shard's due segment stored side by side: one store round trip for all shards, not one after another
    (a failure is raised once the others ended; those stored count)."""
    now = time.time()
    fan_out(lambda link: flush(store, link, emit), [link for link in links if _due(link, options, now)])


def _read(connector: Connector, store: Store, link: ShardStream, state_dir: Path, emit: Emit, options: ArchiveOptions,
          wait: float, flush_when_due: bool = True) -> None:
    if link.stream is None:
        flush(store, link, emit)
        attach(connector, link, state_dir, emit, options.reconnect_timeout)
    if link.stream is None:
        return  # its master is still being looked for: the other links are read meanwhile
    try:
        entries = link.stream.read(wait)
    except stop.Stopped:
        raise  # a second signal: stop at once
    except (OpsctlError, *PIPE_ERRORS) as exc:
        emit(Note(f"shard {link.shard}: the stream broke ({type(exc).__name__}: {exc}); attaching again"))
        flush(store, link, emit)  # what was read is archived before the link goes
        link.stream.close()
        link.stream = None
        return
    link.pending += entries
    link.pending_bytes += sum(sum(len(a) for a in e.args) + 16 for e in entries)
    if flush_when_due and _due(link, options, time.time()):
        flush(store, link, emit)


def close_all(links: list[ShardStream]) -> None:
    for link in links:
        if link.stream is not None:
            link.stream.close()
            link.stream = None
        if link.trying is not None:  # an attach still under way: its stream closed once there
            link.trying.add_done_callback(_close_found)
            link.trying = None


def _close_found(future: Future[Stream | str]) -> None:
    found = None if future.cancelled() or future.exception() is not None else future.result()
    if isinstance(found, Stream):
        found.close()


def run_archive(connector: Connector, store: Store, state_dir: Path, emit: Emit, options: ArchiveOptions,
                locked: Callable[[], AbstractContextManager[object]], place: Placer | None = None) -> None:
    """Base, streams, until stopped; a gap is reported and answered with a new base; with base_every a new base
    is taken in the background as often. Never returns normally. locked(): the topology's lock, held while a base
    is taken (not while streams are read: other runs go on). place: the fleet placed again as it is now (every
    few seconds: follow.Fleet); a change of its shards takes a new base."""
    spec = connector.loaded.spec.name
    with archive_lease(store, spec, emit) as lease:
        _archive(connector, store, state_dir, emit, options, locked, lease, Fleet(connector, place, emit))


def _archive(connector: Connector, store: Store, state_dir: Path, emit: Emit, options: ArchiveOptions,
             locked: Callable[[], AbstractContextManager[object]], lease: Lease, fleet: Fleet) -> None:
    spec = connector.loaded.spec.name
    base = latest_base(store, spec)
    fleet.look(now=True)
    if base is not None and (unlike := fleet.differs(base, store, lambda: frozenset(shard_masters(connector)))):
        emit(Note(f"the newest base {base.name} {unlike}: taking a new base"))
        base = None

    def based() -> Base:
        with locked():
            return take_base(connector, store, state_dir, emit, options.backup)

    def based_when_free() -> Base:
        """The base the archive cannot go on without (the first, or after a gap), a service's way: while another
        run holds the topology (an apply, a reshard) it is said and tried again RETRY_BASE later, never an exit
        (a gap answered during an apply that replaces a host ended the archive, exit 3); a stop ends the wait."""
        while True:
            try:
                return based()
            except RefusedError as refused:
                emit(Note(f"a base waits: {refused.summary}; trying again in {RETRY_BASE:.0f}s"))
                until = time.monotonic() + RETRY_BASE
                while time.monotonic() < until:
                    stop.check("no base was being taken: the archive goes on from the store when run again")
                    time.sleep(0.1)

    links: list[ShardStream] = []
    new: list[ShardStream] = []
    with Borrowed() as pool:
        fresh = base is None
        try:
            while True:
                base = base or based_when_free()
                fleet.follow(base, store)
                new = [ShardStream(n, base.name, p if fresh else resume_position(store, base, n))
                       for n, p in sorted(base.positions.items())]
                if not fresh:
                    emit(Note(f"resuming the archive of base {base.name}: " + ", ".join(
                        f"shard {k.shard} after offset {k.position.offset}" for k in new)))
                every = options.base_every
                due = [time.time() + every if every else float("inf"), 0.0]  # the next periodic base, the soonest

                def next_base(now: bool, due: list[float] = due, every: float = every or 0.0) -> Future[Base] | None:
                    """A base in the background once due, or at once when the fleet changed (again RETRY_BASE
                    after a try); the next periodic one (or a retry after a failure) a period later."""
                    clock = time.time()
                    if not (now and clock >= due[1]) and clock < due[0]:
                        return None
                    due[0] = clock + every if every else float("inf")
                    due[1] = clock + RETRY_BASE
                    return pool.submit(based)

                try:
                    with stop.finishing("the continuous archive"):  # a stop in the hand-over ends as pump's does
                        links = hand_over(connector, store, links, new, state_dir, emit, options)
                        base, fresh = pump(connector, store, links, state_dir, emit, options, next_base, lease,
                                           fleet), True
                except StreamGap as gap:
                    emit(Note(f"gap: {gap.summary} ({gap.reason}); the archive of base {base.name} ends there, "
                              "taking a new base"))
                    base, fresh = None, True
                    for link in links + new:
                        flush(store, link, emit)  # what was read is archived before the streams go
                    close_all(links + new)
                    links = []
        except stop.Stopped as stopped:
            raise _said(stopped, links) from None
        finally:
            close_all(links + new)


def _archived(links: list[ShardStream]) -> str:
    return ", ".join(f"shard {link.shard} up to offset {link.position.offset}" for link in links)


def _said(stopped: stop.Stopped, links: list[ShardStream]) -> stop.Stopped:
    """A stop at once (outside the finishing region: a base taken, a gap answered) says what was stored."""
    said = f"archived: {_archived(links)}; what was read and not stored is still in the masters' backlogs"
    return stopped if stopped.detail or not links else stop.Stopped(stopped.signum, said, stopped.hint)


def hand_over(connector: Connector, store: Store, old: list[ShardStream], new: list[ShardStream], state_dir: Path,
              emit: Emit, options: ArchiveOptions) -> list[ShardStream]:
    """The new base's streams attached and read once before the old ones are read a last time and closed: the
    old chains end after the new ones began, so every moment is covered by one chain whose commands carry the time
    they were read as they were written. While a new shard's master is looked for, the old streams are read on
    (and the heartbeat said) so nothing waits in their backlogs; a stop asked for meanwhile ends the wait."""
    wait = min(0.05, options.segment_seconds / 10)
    beat = time.monotonic()
    for link in new:
        _read(connector, store, link, state_dir, emit, options, wait)
    while any(link.stream is None for link in new) and stop.requested() is None:
        for link in new + old:
            _read(connector, store, link, state_dir, emit, options, wait)
        if time.monotonic() - beat >= PROGRESS_EVERY:
            beat = time.monotonic()
            emit(progress(old or new))
        if all(link.stream is None for link in new + old):
            time.sleep(wait)
    until = time.monotonic() + HAND_OVER
    for link in old:  # a command read now closes the old chain after the new began (an idle shard: up to 0.5 s)
        read_from = len(link.pending)
        while link.stream is not None and len(link.pending) == read_from and time.monotonic() < until:
            _read(connector, store, link, state_dir, emit, options, wait)
            read_from = min(read_from, len(link.pending))
        flush(store, link, emit)
    close_all(old)
    return new
