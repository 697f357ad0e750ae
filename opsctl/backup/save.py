"""`opsctl backup`: one node per shard sends a copy of its data (a replica when it has one), received with its
sha256 in one pass; its keys counted, the manifest written.

Written to `<to>/.<name>-<stamp>.partial/`, renamed without the dot once the manifest is in: a dotless folder is
complete. Every write acknowledged before the backup began is in it: a replica is asked for its copy only once its
offset reached its master's at the start, and the copy's own offset is checked against it. SIGTERM/SIGINT stop it
at the next received chunk or poll (opsctl.base.stop): the partial folder goes, nothing is kept.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import ClassVar

from opsctl.backup.manifest import (
    MANIFEST,
    Manifest,
    ShardFile,
    manifest_json,
    rdb_header,
    shard_file_name,
    utc_iso,
    utc_stamp,
)
from opsctl.backup.rdb import db0_counts
from opsctl.backup.savers import Member, Saver, choose_saver, host_waves, parse_keyspace, pick_scratch
from opsctl.backup.scratch import scratch_binaries, scratch_servers
from opsctl.base import stop
from opsctl.base.errors import NodeError, OpsctlError, RefusedError
from opsctl.base.events import Emit, Event, Redrawn, gauge, human_bytes, ignore
from opsctl.base.frozen import Frozen, frozen
from opsctl.base.poll import Pending, wait_for
from opsctl.net.connection import Connection, connection_to, said
from opsctl.net.connector import Connector
from opsctl.net.discover import LiveNode, discover, shards
from opsctl.net.fanout import Borrowed
from opsctl.net.observer import describe as describe_problems
from opsctl.net.observer import observe
from opsctl.observe.cluster_state import observed_problems
from opsctl.observe.replies import CLUSTER_NODES, info, myself
from opsctl.spec.layout import Node
from opsctl.spec.load import LoadedSpec
from opsctl.state.safefs import FileProblem, disk_full, open_dir, trusted_owners, write_private
from opsctl.stream.framing import Position
from opsctl.stream.reader import copy_snapshot


@frozen
class BackupStart(Frozen, Event):
    """savers: shard number -> the node that saves it."""

    kind: ClassVar[str] = "backup-start"
    shards: int
    dir: str
    savers: Mapping[int, str]

    def line(self) -> str:
        return f"backing up {self.shards} shards into {self.dir}"


@frozen
class ShardCopying(Frozen, Event):
    """A shard's copy arriving from its saver: bytes so far, of about estimate (its data in memory)."""

    kind: ClassVar[str] = "shard-copying"
    redrawn: ClassVar[Redrawn] = "bar"
    shard: int
    node: str
    bytes: int
    estimate: int

    def line(self) -> str:
        return f"shard {self.shard}: {human_bytes(self.bytes)} of about {human_bytes(self.estimate)} received from " \
               f"{self.node}"


@frozen
class ShardSaved(Frozen, Event):
    kind: ClassVar[str] = "shard-saved"
    redrawn: ClassVar[Redrawn] = "bar"
    shard: int
    node: str
    role: str
    bytes: int
    done: int
    total: int

    def line(self) -> str:
        return (f"{gauge(self.done, self.total, 20)} {self.done}/{self.total} shards saved, shard {self.shard} "
                f"{human_bytes(self.bytes)} from {self.node} ({self.role})")


@frozen
class BackupDone(Frozen, Event):
    kind: ClassVar[str] = "backup-done"
    dir: str
    keys: int
    bytes: int
    seconds: float

    def line(self) -> str:
        return f"saved {self.keys} keys ({human_bytes(self.bytes)}) in {self.seconds:.1f}s"


HEAD_BYTES = 1 << 20
WRITE_BLOCK = 1 << 20
POLL = 0.02
RECEIVE_TIMEOUT = 60.0  # s one receive may wait: a node preparing a copy sends a newline every second
COPY_TRIES = 3  # a copy that began before the backup's start (joined to another replica's save) is asked again
COPY_PROGRESS_EVERY = 1.0  # s between ShardCopying events: a bar's pace; off a terminal the printer thins them


@dataclass(frozen=True)
class BackupOptions:
    catch_up_timeout: float = 60.0
    save_timeout: float = 3600.0


def _info(node: Connection, section: str) -> dict[str, str]:
    return node.read(info(section))


def _group(loaded: LoadedSpec, live: list[LiveNode]) -> list[tuple[int, list[Member]]]:
    """(spec shard number, [master, replicas...]) from what the nodes say; a down master is an error."""
    down = [ln.node.name for ln in live if ln.role == "down"]
    out: list[tuple[int, list[Member]]] = []
    for members in shards(live).values():
        if members[0].role != "master":
            raise OpsctlError(f"shard of {members[0].node.name} has no reachable master",
                              f"down: {', '.join(down)}", "start it or fail over first (`opsctl status -f SPEC`)")
        shard = loaded.layout.shard_of(members[0].node.name)
        number = shard.index if shard else len(out) + 1
        out.append((number, [Member(m.node.name, m.node.host, m.role, m.linked) for m in members]))
    if not out:
        raise OpsctlError("no node of the spec answers", f"down: {', '.join(down)}", "`opsctl status -f SPEC`")
    return sorted(out)


def _slots(loaded: LoadedSpec, node: Connection) -> tuple[tuple[int, int], ...]:
    if loaded.spec.topology != "cluster":
        return ()
    view = node.read(CLUSTER_NODES)
    me = myself(view)
    return tuple(me.slots) if me else ()


def _wait_caught_up(node: Connection, target: int, timeout: float) -> int:
    def offset() -> int | Pending:
        stop.check()
        at = int(_info(node, "replication").get("master_repl_offset", "0"))
        return at if at >= target else Pending(f"offset {at}, master at {target}")

    return wait_for(offset, timeout, f"{node.name} to catch up", POLL, on_timeout=lambda reason: OpsctlError(
        f"replica {node.name} did not catch up with its master in {timeout:.0f}s", reason,
        "look at `opsctl status -f SPEC` (lag)"))


def _copies_diskless(node: Connection) -> bool:
    """Whether the node sends a copy straight from its fork: diskless sync with no delay. Where it delays diskless
    copies to wait for more replicas (repl-diskless-sync-delay), the file form is served at once instead."""
    config = node.config_get("repl-diskless-sync*")
    return config.get("repl-diskless-sync") == "yes" and config.get("repl-diskless-sync-delay", "0") == "0"


class _Copy:
    """A copy's bytes into a new 0600 file (never through a link), hashed and its head kept as they arrive: the
    file is read once. A full disk on this side is named as such, with the space needed (estimate: the shard's data
    in memory; its RDB is usually smaller), never as the node's failure."""

    def __init__(self, node: Node, dest: Path, estimate: int) -> None:
        self.node, self.dest, self.estimate = node, dest, estimate
        self.digest = hashlib.sha256()
        self.head = b""
        self.size = 0
        try:
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise self.full(exc) from None
        # a diskless copy arrives in pieces of 16 KiB: written in big blocks, not a system call each
        self.out = os.fdopen(fd, "wb", buffering=WRITE_BLOCK)

    def write(self, data: bytes, /) -> None:
        self.digest.update(data)
        if len(self.head) < HEAD_BYTES:
            self.head += data[:HEAD_BYTES - len(self.head)]
        try:
            self.out.write(data)
        except OSError as exc:
            raise self.full(exc) from None
        self.size += len(data)

    def close(self) -> None:
        """Flushed and on disk before the manifest can name it."""
        try:
            with self.out:
                self.out.flush()
                os.fsync(self.out.fileno())
        except OSError as exc:
            raise self.full(exc) from None

    def abandon(self) -> None:
        """Closed as it is: a copy cut short goes with the partial folder."""
        with suppress(OSError):
            self.out.close()

    def full(self, exc: OSError) -> BaseException:
        problem = disk_full(self.dest, exc, max(self.estimate, self.size),
                            f" ({human_bytes(self.size)} of {self.node.name}'s RDB copied)", about=True)
        return problem or FileProblem(self.dest, f"cannot be written: {exc.strerror}", "check the backup folder (--to)")


def _receive(connector: Connector, node: Node, dest: Path, estimate: int, diskless: bool, target: int,
             timeout: float, progress: Callable[[int], None]) -> tuple[_Copy, Position]:
    """node's copy in dest, with its position: at or after target (a copy joined to a save that began earlier is
    asked for again), within timeout in all; progress(bytes received) about once a second meanwhile."""
    deadline = time.monotonic() + timeout
    said = [time.monotonic()]

    def tick() -> None:
        stop.check()  # a safe point: the partial folder goes anyway
        if time.monotonic() > deadline:
            raise OpsctlError(f"{node.name} did not send its copy in {timeout:.0f}s",
                              hint="see the node's log; --save-timeout gives a big dataset more time")
        if time.monotonic() - said[0] >= COPY_PROGRESS_EVERY:  # a big copy says how far it got
            said[0] = time.monotonic()
            progress(copy.size)

    for _ in range(COPY_TRIES):
        copy = _Copy(node, dest, estimate)
        try:
            position = copy_snapshot(connector, node, copy, diskless=diskless, timeout=RECEIVE_TIMEOUT, tick=tick)
        except BaseException:
            copy.abandon()
            raise
        copy.close()
        if position.offset >= target:
            return copy, position
        dest.unlink()
    raise OpsctlError(f"{node.name} sent copies older than the backup's start (offset {position.offset}, the "
                      f"master was at {target})", hint="run the backup again once its other copies are done")


def save_shard(connector: Connector, saver: Saver, master_offset: int, slots: tuple[tuple[int, int], ...],
               folder: Path, options: BackupOptions, emit: Emit = ignore) -> tuple[ShardFile, bytes]:
    """The shard's file and its head (the first HEAD_BYTES, for the counts and the format); ShardCopying events
    while it arrives."""
    node = connector.loaded.layout.node(saver.node)
    with connection_to(connector, node, timeout=30.0) as handle:
        _wait_caught_up(handle, master_offset, options.catch_up_timeout)
        at_save = {db: keys for db, (keys, _) in parse_keyspace(_info(handle, "keyspace")).items()}
        dataset = int(_info(handle, "memory").get("used_memory_dataset", "0"))
        diskless = _copies_diskless(handle)
    name = shard_file_name(saver.shard)
    copy, position = _receive(connector, node, folder / name, dataset, diskless, master_offset, options.save_timeout,
                              lambda size: emit(ShardCopying(saver.shard, saver.node, size, dataset)))
    shard = ShardFile(saver.shard, saver.node, saver.role, slots, name, copy.size, copy.digest.hexdigest(), {}, {},
                      at_save, position.offset, utc_iso(datetime.now(timezone.utc)), dataset)
    return shard, copy.head


def _free_folder(to: Path, name: str) -> tuple[Path, Path]:
    """(the backup's folder, its .partial twin): `<name>`, or `<name>-2`, `-3` ... when a backup of the same
    second is there already (the topology lock keeps two backups of one topology from racing for a name)."""
    for attempt in range(1, 100):
        final = to / (name if attempt == 1 else f"{name}-{attempt}")
        partial = to / f".{final.name}.partial"
        if not final.exists() and not partial.exists():
            return final, partial
    raise OpsctlError(f"{to / name} and 98 more folders of that second exist already", hint="clean up --to")


def refuse_open_slots(connector: Connector) -> None:
    """A slot that is moving has keys on two masters: their files would overlap. Refused before any save."""
    if connector.loaded.spec.topology != "cluster":
        return
    seen = observe(connector, connector.loaded.layout.servers)
    problems = [p for p in observed_problems(seen) if " is open: " in p.what]
    if problems:
        raise RefusedError("the cluster has slots in motion: a backup now would hold some keys twice",
                           describe_problems(problems), "wait for the reshard to finish, or close the slots with "
                           "`opsctl cluster fix -f SPEC`, then back up")


def _plan(connector: Connector) -> list[tuple[Saver, int, tuple[tuple[int, int], ...]]]:
    """Per shard: who saves, the master's offset now (the replica must reach it first), its slots."""
    loaded = connector.loaded
    refuse_open_slots(connector)
    out: list[tuple[Saver, int, tuple[tuple[int, int], ...]]] = []
    for number, members in _group(loaded, discover(connector)):
        saver = choose_saver(number, members)
        with connection_to(connector, loaded.layout.node(saver.master)) as master:
            offset = int(_info(master, "replication").get("master_repl_offset", "0"))
            out.append((saver, offset, _slots(loaded, master)))
    return out


def header_counts(shard: ShardFile, head: bytes) -> ShardFile | None:
    """The shard with its keys counted from its file's head (exact at the fork), when the node held db 0 only."""
    if set(shard.keys_at_save) - {0}:
        return None
    counts = db0_counts(head)
    return None if counts is None else replace(shard, keys={0: counts[0]}, expires={0: counts[1]})


def count_keys(manifest: Manifest, folder: Path, heads: dict[int, bytes]) -> Manifest:
    """Every file's exact keys and keys with a TTL per db: from its head (heads: by shard) when it holds db 0 only,
    else by loading it into a scratch server."""
    counted = [header_counts(shard, heads[shard.shard]) for shard in manifest.shards]
    if all(counted):
        return replace(manifest, shards=tuple(s for s in counted if s))
    binaries = scratch_binaries()
    binary = binaries[pick_scratch(list(binaries), manifest.rdb_version, None, str(folder))]
    databases = max(db for s in manifest.shards for db in s.keys_at_save.keys() | {0}) + 1
    with scratch_servers(binary, [folder / s.file for s in manifest.shards], databases) as servers:
        spaces = [scratch.keyspace() for scratch in servers]
    shards = [replace(shard, keys={db: k for db, (k, _) in space.items()},
                      expires={db: e for db, (_, e) in space.items()})
              for shard, space in zip(manifest.shards, spaces, strict=True)]
    return replace(manifest, shards=tuple(shards))


def _rdb_version(folder: Path, files: list[ShardFile], heads: dict[int, bytes]) -> int:
    versions = set()
    for shard in files:
        header = rdb_header(heads[shard.shard][:9])
        if header is None:
            raise OpsctlError(f"{folder / shard.file} is not an RDB file",
                              hint=f"{shard.node} sent something else as its copy: see its log")
        versions.add(header[1])
    return max(versions)


def run_backup(connector: Connector, to: Path, emit: Emit,
               options: BackupOptions | None = None) -> tuple[Path, Manifest]:
    loaded = connector.loaded
    options = options or BackupOptions()
    started = datetime.now(timezone.utc)
    final, partial = _free_folder(to, f"{loaded.spec.name}-{utc_stamp(started)}")
    planned = _plan(connector)
    emit(BackupStart(len(planned), str(final), {s.shard: s.node for s, _, _ in planned}))
    with _claimed(to, partial, loaded.spec.name):
        try:
            with stop.finishing("the backup"):  # savers poll stop.check(); the region's end is the last safe point
                files, heads = _save_all(connector, planned, partial, emit, options)
                manifest = Manifest(loaded.spec.name, loaded.spec.topology, loaded.spec.server.flavor,
                                    loaded.spec.server.version, _rdb_version(partial, files, heads),
                                    utc_iso(started), tuple(sorted(files, key=lambda f: f.shard)))
                manifest = count_keys(manifest, partial, heads)
                write_private(partial / MANIFEST, manifest_json(manifest))
        except stop.Stopped as exc:
            shutil.rmtree(partial, ignore_errors=True)
            raise stop.Stopped(exc.signum, f"nothing was kept: {partial} is removed (a copy a node was still "
                               "forking for ends on its own, which is harmless)",
                               "run the same `opsctl backup` again: it starts afresh") from None
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        _publish(partial, final)
    emit(BackupDone(str(final), manifest.total_keys, sum(s.bytes for s in manifest.shards),
                    round(time.time() - started.timestamp(), 3)))
    return final, manifest


def _publish(partial: Path, final: Path) -> None:
    """The complete folder under its final name, the rename on disk (the files and manifest are already)."""
    os.rename(partial, final)
    with open_dir(final.parent) as folder:
        os.fsync(folder)


@contextmanager
def _claimed(to: Path, partial: Path, name: str) -> Iterator[None]:
    """The partial folder made and held (flock on the folder itself) until the block ends; first the partial
    folders of this topology's killed runs are removed: a lock nobody holds means its run is gone."""
    _make_folders(to, partial)
    _sweep_partials(to, name, partial)
    fd = os.open(partial, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _sweep_partials(to: Path, name: str, mine: Path) -> None:
    for folder in to.glob(f".{name}-*.partial"):
        if folder == mine:
            continue
        try:
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # a link or not a folder: not ours to remove
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # a run still writing it
        else:
            shutil.rmtree(folder, ignore_errors=True)
        finally:
            os.close(fd)


def _make_folders(to: Path, partial: Path) -> None:
    """--to (created when missing) and the partial folder in it; a --to that is a file, or a folder opsctl may
    not write, is named (before any BGSAVE)."""
    try:
        to.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open_dir(to.resolve(), trusted_owners()):  # a folder another user controls: they could swap the backup
            pass
        partial.mkdir(mode=0o700)
    except OSError as exc:
        raise FileProblem(exc.filename or to, f"cannot be made a backup folder: {exc.strerror}",
                          "give --to a folder opsctl may write (it is created when missing)") from None


def _save_all(connector: Connector, planned: list[tuple[Saver, int, tuple[tuple[int, int], ...]]], folder: Path,
              emit: Emit, options: BackupOptions) -> tuple[list[ShardFile], dict[int, bytes]]:
    """Wave by wave (one fork per host at a time), the shards of a wave in parallel; each file with its head."""
    by_saver = {id(s): (o, slots) for s, o, slots in planned}
    files: list[ShardFile] = []
    heads: dict[int, bytes] = {}
    lock = threading.Lock()

    def one(saver: Saver) -> None:
        offset, slots = by_saver[id(saver)]
        try:
            shard, head = save_shard(connector, saver, offset, slots, folder, options, emit)
        except (NodeError, OSError) as exc:
            why = said(exc) if isinstance(exc, NodeError) else f"{type(exc).__name__}: {exc}"
            raise OpsctlError(f"saving shard {saver.shard} on {saver.node} failed: {why}",
                              hint="nothing was kept; run the backup again (`opsctl status -f SPEC` shows the "
                                   "nodes)") from None
        with lock:
            files.append(shard)
            heads[shard.shard] = head
            saved = ShardSaved(shard.shard, shard.node, shard.role, shard.bytes, len(files), len(planned))
        emit(saved)

    for wave in host_waves([s for s, _, _ in planned]):
        stop.check()
        with Borrowed() as pool:  # the whole wave at once (one saver per host), not fan_out's WIDTH
            for future in [pool.submit(one, saver) for saver in wave]:
                future.result()
    return files, heads
