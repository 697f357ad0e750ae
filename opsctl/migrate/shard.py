"""One source shard's migration: attach to a member as a replica, copy the snapshot into the target by slot while
the link stays attached and its stream goes to a spool (opsctl.migrate.spool), apply the spool, then follow the
stream until told to stop. A lost link (a failover, a restart) re-attaches to whichever member
serves the shard now and continues from the journaled position (a promoted replica keeps the history); a target
master that failed over is found again the same way (the target is read afresh on every attach)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from opsctl.backup.manifest import rdb_header
from opsctl.backup.rdb import KeyRecord, Unsplittable
from opsctl.backup.savers import Server, pick_scratch, rdb_written_by
from opsctl.backup.scratch import scratch_binaries, scratch_server
from opsctl.base.errors import OpsctlError, RefusedError
from opsctl.migrate.phases import JournalFile, ShardState
from opsctl.migrate.replay import Applier, EdgeRefused, TargetChanged
from opsctl.migrate.spool import Spool, SpoolWriter
from opsctl.net.connection import Connection, connection_to
from opsctl.net.connector import Connector
from opsctl.net.discover import live_node
from opsctl.net.rawpipe import PIPE_ERRORS
from opsctl.observe.replies import info, parse_info, server_of
from opsctl.restore.engine import Side, Source, Targets, copy_snapshot_file, copy_source
from opsctl.restore.route import Counts
from opsctl.restore.target import PIPE_TIMEOUT
from opsctl.server.versions import reads_rdb
from opsctl.spec.layout import Node
from opsctl.stream.framing import Entry, Position, StreamProtocolError
from opsctl.stream.reader import Stream, StreamGap, open_stream

CAUGHT_UP = 2000  # a spool read with fewer commands than this: the writer is stopped and the rest taken
REATTACH_TIMEOUT = 60.0  # how long a shard without a member to attach to is waited for before the run stops
LINK_TIMEOUT = 30.0


class NoMemberAnswers(OpsctlError):
    """No member of a source shard answers now: while streaming, a failover in progress is waited out."""


class MustStartOver(RefusedError):
    """The source no longer holds the journaled position (its backlog was overrun, or its history changed): only a
    copy from scratch goes on. A standby (opsctl.standby.link) empties itself and does it."""


@dataclass
class ShardRun:
    """A source shard's worker and what the progress display reads (offsets, lag)."""

    key: str
    members: list[Node]
    source: Connector
    targets: Callable[[], Targets]
    journal: JournalFile
    state_dir: Path
    shift_ms: int
    source_ms: float
    stop: threading.Event = field(default_factory=threading.Event)
    check_locks: Callable[[], None] = field(default=lambda: None)  # a lost topology lock raises: no further writes
    node: Node | None = None
    position: Position | None = None
    lag_seconds: float = 0.0
    applied_at: float = 0.0  # when the newest applied command was read from the source (epoch seconds; 0: none yet)
    applied: int = 0
    copied: int = 0
    streaming: bool = False
    followed: bool = False  # its copy is done and its stream was followed (this run, or the run it resumes)

    @property
    def phase(self) -> str:
        """What a progress report says it does: snapshot (copying), stream (applying the live stream) or attach
        (its link lost, a failover or a restart, and being opened again from the journaled position: no copy)."""
        if self.streaming:
            return "stream"
        return "attach" if self.followed else "snapshot"

    @property
    def rdb(self) -> Path:
        return self.state_dir / f"migrate-{self.key}.rdb"

    @property
    def spool_path(self) -> Path:
        return self.state_dir / f"migrate-{self.key}.spool"

    def run(self) -> None:
        state = self.journal.position(self.key)
        self.followed = state is not None and state.phase == "stream"  # resumed mid-stream: attaching, no copy
        writer: SpoolWriter | None = None
        if state is None or (state.phase == "snapshot" and not self.rdb.exists()):
            state, writer = self._take_snapshot()
        if state.phase == "snapshot":
            writer = writer or self._spool_again(state.position)
            try:
                self._copy_snapshot()
            except BaseException:
                if writer is not None:
                    writer.abandon()
                raise
            state = ShardState("stream", state.position)
            self.journal.save(self.key, state)
            self.rdb.unlink(missing_ok=True)
        self.applied_at = state.at  # resumed: the journal's read time until the next write is applied
        self._follow(state.position, writer)

    # -- attach ----------------------------------------------------------------------------------------------------

    def attach_node(self) -> Node:
        """A linked replica of the shard, else its master (what answers now, not what the spec says)."""
        live = [live_node(self.source, n) for n in self.members]
        replica = next((ln.node for ln in live if ln.role == "replica" and ln.linked), None)
        master = next((ln.node for ln in live if ln.role == "master"), None)
        node = replica or master
        if node is None:
            raise NoMemberAnswers(f"source {self.key}: no member answers", "; ".join(ln.error for ln in live),
                              "start them (`opsctl status -f SOURCE_SPEC`), then re-run: it resumes")
        return node

    def _take_snapshot(self) -> tuple[ShardState, SpoolWriter]:
        """The snapshot into the rdb file; the link stays attached and its stream goes to the spool meanwhile."""
        node = self.attach_node()
        stream = open_stream(self.source, node, since=None, rdb_to=self.rdb, timeout=LINK_TIMEOUT)
        try:
            state = ShardState("snapshot", stream.start)
            spool = Spool(self.spool_path, stream.start)
            fd = spool.create()
            self.journal.save(self.key, state)
        except BaseException:
            stream.close()
            raise
        self.node = node
        return state, SpoolWriter(stream, spool, fd).start()

    def _spool_again(self, start: Position) -> SpoolWriter | None:
        """A run resumed during the copy: attached again after what the spool holds, spooling on; None when no
        member answers now (the stream is then read from the backlog after the copy)."""
        spool = Spool(self.spool_path, start)
        fd, since = spool.reopen() if spool.exists() else (spool.create(), start.offset)
        try:
            node = self.attach_node()
            stream = open_stream(self.source, node, since=Position(start.replid, since), rdb_to=self.rdb,
                                 timeout=LINK_TIMEOUT)
        except StreamGap as gap:
            os.close(fd)
            raise self._start_over(gap) from None
        except (*PIPE_ERRORS, StreamProtocolError, NoMemberAnswers):
            os.close(fd)
            return None
        self.node = node
        return SpoolWriter(stream, spool, fd).start()

    def _start_over(self, gap: StreamGap) -> MustStartOver:
        return MustStartOver(f"source {self.key}: must start over: {gap.reason}", f"{gap.summary}\n{gap.detail}",
                            f"remove the journal ({self.journal.path}), empty the target and run again; a larger "
                            "repl-backlog-size on the source keeps more history")

    # -- the copy ----------------------------------------------------------------------------------------------------

    def _copy_snapshot(self) -> None:
        """Every key of the snapshot written into the target by slot (the restore engine; replace: the target held
        none of these): cut from the file where the target reads the source's payloads and the file holds nothing
        the splitter does not know; else loaded into a scratch server of the source's own server (or one the target
        can read) and read from it."""
        targets = self.targets()
        with open(self.rdb, "rb") as handle:
            header = rdb_header(handle.read(9))
        if header is None:
            raise OpsctlError(f"{self.rdb}: the snapshot is not an RDB", hint="remove it and re-run")
        target_server = _target_server(targets)
        if target_server is not None and reads_rdb(target_server[0], target_server[1], header[1]):
            try:
                counts = self._copy_split(targets, header[1])
            except Unsplittable:  # the keys written so far are written again, with the same values
                self.copied = 0
                counts = self._copy_scratch(targets, header[1], target_server)
        else:
            counts = self._copy_scratch(targets, header[1], target_server)
        if counts.conflicts:
            raise OpsctlError(f"source {self.key}: {counts.conflicts} keys could not be written to the target")

    def _copy_split(self, targets: Targets, version: int) -> Counts:
        """The snapshot's payloads cut from the file (no server loads it); a cluster target refuses any db but 0."""
        def one_db(read: Iterable[list[KeyRecord]]) -> Iterator[list[KeyRecord]]:
            for page in read:
                if targets.cluster and page[0].db:
                    raise self._not_db0([page[0].db], "the keys of database 0 were copied")
                yield page

        source = Source(self.key, f"snapshot of {self.key}", None, [], 1 << 62)
        side = Side(source.open, targets.open)  # replace: no key is found busy, so none is read back
        try:
            return copy_snapshot_file(self.rdb, version, self.source_ms, source, targets, "replace", self._copied,
                                      side, one_db)
        finally:
            side.close()

    def _copy_scratch(self, targets: Targets, version: int, target_server: Server | None) -> Counts:
        binaries = scratch_binaries()
        server = self._source_server()
        if server not in binaries or not _readable(server, target_server):
            server = pick_scratch(list(binaries), version, target_server, f"the snapshot of source {self.key}")
        with scratch_server(binaries[server], self.rdb, f"the snapshot of source {self.key}") as scratch:
            keyspace = scratch.keyspace()
            dbs = sorted(db for db, (keys, _) in keyspace.items() if keys)
            if targets.cluster and set(dbs) - {0}:
                raise self._not_db0(sorted(set(dbs) - {0}), "nothing was written")
            snapshot = Connection.on_unix(scratch.socket, f"snapshot of {self.key}", PIPE_TIMEOUT)
            source = Source(self.key, f"snapshot of {self.key}", snapshot, dbs, 1 << 62,
                            unexpiring=frozenset(db for db, (_, expires) in keyspace.items() if not expires))
            side = Side(source.open, targets.open)
            try:
                return copy_source(source, targets, "replace", self._copied, side)
            finally:
                side.close()

    def _not_db0(self, dbs: list[int], written: str) -> EdgeRefused:
        """A cluster target refuses a source's keys outside db 0; written: what the copy did before it saw them."""
        return EdgeRefused(f"source {self.key} holds keys in databases {dbs}; a cluster has only database 0 "
                           f"({written})", hint="move the keys to db 0 first, or migrate into a standalone topology")

    def _copied(self, keys: int) -> None:
        self.copied += keys
        self.check_locks()  # after each batch the snapshot copy wrote: a lost lock writes no further batch

    def _source_server(self) -> tuple[str, tuple[int, int]] | None:
        node = self.attach_node()
        with connection_to(self.source, node, 10.0) as handle:
            said = handle.read(info("server"))
        return server_of(said)

    # -- the stream --------------------------------------------------------------------------------------------------

    def _follow(self, position: Position, writer: SpoolWriter | None = None) -> None:
        """Apply the spool, then the stream, from position until stop; re-attach after a lost link, within
        REATTACH_TIMEOUT."""
        last_good = time.monotonic()
        self.position = position
        while not self.stop.is_set():
            applier: Applier | None = None
            try:
                applier = Applier(self.targets(), self.journal.journal.id, self.key, self.shift_ms, self.source_ms)
                applier.restart(self.position.offset)
                spooling, writer = writer, None  # a failed drain is read again from the spool's file
                stream = self._drain_spool(applier, spooling)
                if stream is None:
                    self.node = self.attach_node()
                    stream = open_stream(self.source, self.node, since=self.position, rdb_to=self.rdb,
                                         timeout=LINK_TIMEOUT)
                    applier.restart(self.position.offset)  # a new link: an open transaction comes again whole
                with stream:
                    self.streaming = self.followed = True
                    self._apply(stream, applier)
                    last_good = time.monotonic()
            except StreamGap as gap:
                raise self._start_over(gap) from None
            except (*PIPE_ERRORS, StreamProtocolError, TargetChanged) as exc:
                if time.monotonic() - last_good > REATTACH_TIMEOUT:
                    raise OpsctlError(f"source {self.key}: the replication link stayed lost",
                                      f"{type(exc).__name__}: {exc}", "re-run the same command: it resumes") from None
                self.streaming = False
                time.sleep(0.2)
            except NoMemberAnswers:
                if time.monotonic() - last_good > REATTACH_TIMEOUT:
                    raise
                self.streaming = False
                time.sleep(0.2)
            finally:
                if applier is not None:
                    applier.close()

    def _drain_spool(self, applier: Applier, writer: SpoolWriter | None) -> Stream | None:
        """What the spool holds after self.position applied in order through applier, the writer stopped once it
        is nearly caught up; then the spool is gone. Returns the writer's stream when it is still attached right
        after the spool's last command: the same applier goes on with it (a transaction the spool ends inside is
        completed from the stream). Else None: re-attach from self.position (before any open transaction)."""
        spool = writer.spool if writer is not None else Spool(self.spool_path, None)
        if writer is None and not spool.exists():
            return None
        live = False
        try:
            if writer is not None:
                while len(entries := spool.read()) >= CAUGHT_UP:
                    self._settle_spooled(applier, entries)
                self._settle_spooled(applier, entries)
                live = writer.stop()
            self._settle_spooled(applier, spool.read())
        except BaseException:
            if writer is not None:
                writer.abandon()
            raise
        spool.remove()
        if writer is None:
            return None
        if not live:
            writer.stream.close()
        return writer.stream if live else None

    def _settle_spooled(self, applier: Applier, entries: list[Entry]) -> None:
        assert self.position is not None
        entries = [e for e in entries if e.end > self.position.offset]
        if entries:
            self._settle(applier, entries, self.position.replid)

    def _apply(self, stream: Stream, applier: Applier) -> None:
        while not self.stop.is_set():
            if self._settle(applier, stream.read(0.05), stream.position.replid):
                assert self.position is not None
                stream.ack(self.position.offset)

    def _settle(self, applier: Applier, entries: list[Entry], replid: str) -> bool:
        """entries applied and the position journaled; whether it moved. An edge is journaled at the offset
        before it (the applier applied everything before it) and raised."""
        assert self.position is not None
        if entries:
            self.check_locks()
        try:
            applier.feed(entries)
        except EdgeRefused:
            self._journal(applier.flush(), replid)
            raise
        settled = applier.flush()
        self.lag_seconds, self.applied = applier.lag, self.applied + applier.applied
        applier.applied = 0
        return self._journal(settled, replid, max((e.arrived for e in entries), default=0.0))

    def _journal(self, settled: int, replid: str, read_at: float = 0.0) -> bool:
        """read_at: when the newest of the settled entries was read (a standby's recovery point's time)."""
        assert self.position is not None
        if settled <= self.position.offset and replid == self.position.replid:
            return False
        self.position = Position(replid, max(settled, self.position.offset))
        self.applied_at = max(self.applied_at, read_at)
        self.journal.save(self.key, ShardState("stream", self.position, read_at))
        return True


def _target_server(targets: Targets) -> tuple[str, tuple[int, int]] | None:
    pipe = targets.open(0)
    try:
        reply = pipe.call("INFO", "server")
    finally:
        pipe.close()
    return server_of(parse_info(reply.decode() if isinstance(reply, bytes) else ""))


def _readable(server: tuple[str, tuple[int, int]] | None, target: tuple[str, tuple[int, int]] | None) -> bool:
    """Whether target can RESTORE what server DUMPs."""
    if server is None or target is None:
        return False
    written = rdb_written_by(server)
    return written is not None and reads_rdb(target[0], target[1], written)
