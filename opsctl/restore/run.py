"""`opsctl restore`: refuse what cannot work before writing anything, copy every source in parallel, resume
from the journal after a kill, then check counts and values.

Sources are a backup directory (each RDB loaded into a scratch server whose DUMP payloads the target can
RESTORE) or a running topology (a linked replica per shard, else its master). The journal in the target's
state dir names the source and the sources already finished; a re-run of the same command skips those and
re-reads the rest, counting keys it finds already equal as restored.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import redis
from redis.crc import key_slot

from opsctl.backup.manifest import ShardFile, count_problem, describe
from opsctl.backup.plan import Server, parse_keyspace, pick_scratch, rdb_written_by
from opsctl.backup.scratch import scratch_binaries, scratch_servers
from opsctl.backup.verify import check_files, read_manifest
from opsctl.base.errors import OpsctlError, RefusedError
from opsctl.base.events import Emit, RestoreDone, RestoreProgress
from opsctl.net.connector import Connector, unix_socket
from opsctl.net.observer import describe as describe_problems
from opsctl.net.observer import observe, observed_problems
from opsctl.net.rawpipe import PIPE_ERRORS, RawPipe
from opsctl.net.resp import encode
from opsctl.net.topolock import check_held
from opsctl.observe.parse import parse_info, server_of
from opsctl.restore.engine import (
    Side,
    Source,
    TargetPipes,
    Targets,
    compare_page,
    copy_source,
    first_entries,
    pages,
)
from opsctl.restore.route import (
    JOURNAL,
    Counts,
    Journal,
    Router,
    cluster_router,
    journal_json,
    landed_problem,
    parse_journal,
    room_problems,
    shown_key,
)
from opsctl.server.versions import reads_rdb, server_text
from opsctl.spec.layout import Node
from opsctl.spec.load import LoadedSpec
from opsctl.state.safefs import read_bounded, write_private

MAX_PROBLEMS = 20


@dataclass(frozen=True)
class RestoreOptions:
    mode: str = "fail-if-exists"
    dry_run: bool = False
    verify: str = "sample"
    sample: int = 1000


@dataclass
class Target:
    connector: Connector
    masters: list[Node]
    router: Router
    cluster: bool
    server: Server
    keys: int
    room: list[tuple[str, int, int, float]]

    @property
    def loaded(self) -> LoadedSpec:
        return self.connector.loaded

    def targets(self) -> Targets:
        def open_pipe(index: int) -> RawPipe:
            return RawPipe(self.connector, self.masters[index], 120.0)
        return Targets([m.name for m in self.masters], open_pipe, self.router, self.cluster)


@dataclass
class Prepared:
    id: str
    text: str
    sources: list[Source]
    dataset: int
    expected: dict[str, ShardFile] = field(default_factory=dict)


@dataclass
class RestoreReport:
    source: str
    target: str
    mode: str
    dry_run: bool
    resumed: bool
    sources: dict[str, Counts]
    rechecked: bool = False  # finished before: checked again, nothing copied
    seconds: float = 0.0
    verified: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def total(self) -> Counts:
        total = Counts()
        for counts in self.sources.values():
            total.add(counts)
        return total

    def done(self, kind: type[RestoreDone] = RestoreDone) -> RestoreDone:
        """The report as the run's last event (RestoreDone, or RestoreDryRun)."""
        total = self.total
        return kind(self.source, self.target, self.mode, self.dry_run, self.resumed, not self.problems, total.total,
                    total.restored, total.existing, total.skipped, total.conflicts, round(self.seconds, 3),
                    round(total.total / self.seconds) if self.seconds > 0 else None, self.verified,
                    tuple(self.problems),
                    {k: {"keys": c.total, "restored": c.restored, "existing": c.existing, "skipped": c.skipped,
                         "conflicts": c.conflicts} for k, c in self.sources.items()}, self.rechecked)


# --- the target ------------------------------------------------------------------------------------------------


def inspect_target(connector: Connector) -> Target:
    """The target's masters, slot routing, server and room; refuses a cluster that is not converged."""
    loaded = connector.loaded
    seen = observe(connector, loaded.layout.servers)
    if loaded.spec.topology == "cluster":
        problems = observed_problems(seen)
        if problems:
            raise RefusedError("the target cluster is not ready for a restore (nothing was written)",
                               describe_problems(problems), "`opsctl cluster check -f SPEC` and `opsctl cluster fix` "
                               "show and close open slots; start down nodes with `opsctl apply`")
        view = next(o.cluster_nodes for o in seen.values() if o.cluster_nodes is not None)
        lines = [line for line in view if line.is_master and line.slots]
        endpoints = [f"{line.address}:{line.port}" for line in lines]
        masters = [_known(loaded, e) for e in endpoints]
        router = cluster_router(lines, endpoints, key_slot)
        shares = [sum(e - s + 1 for s, e in line.slots) / 16384 for line in lines]
    else:
        masters = [o.node for o in seen.values() if o.reachable and o.role and o.role.kind == "master"]
        if len(masters) != 1:
            raise RefusedError(f"the target has {len(masters)} reachable masters, a restore needs exactly one",
                               ", ".join(m.name for m in masters) or "none answers", "`opsctl status -f SPEC`")
        router, shares = Router(), [1.0]
    infos = [seen[m.name].info for m in masters]
    return Target(connector, masters, router, loaded.spec.topology == "cluster", _one_server(infos, "target"),
                  sum(k for info in infos for k, _ in parse_keyspace(info).values()),
                  [(m.name, int(i.get("used_memory", "0")), int(i.get("maxmemory", "0")), share)
                   for m, i, share in zip(masters, infos, shares, strict=True)])


def _known(loaded: LoadedSpec, endpoint: str) -> Node:
    node = loaded.layout.find(endpoint)
    if node is None:
        raise RefusedError(f"the target cluster has a master {endpoint} that the spec does not list",
                           hint="apply the spec first (`opsctl plan -f SPEC`)")
    return node


def _one_server(infos: list[dict[str, str]], what: str) -> Server:
    servers = {s for info in infos if (s := server_of(info))}
    if len(servers) != 1:
        raise RefusedError(f"the {what} masters run {len(servers)} different server versions",
                           ", ".join(server_text(*s) for s in servers) or "unknown",
                           "finish the rolling change first (`opsctl apply`)")
    return servers.pop()


# --- sources -----------------------------------------------------------------------------------------------------


def _sample_every(keys: int, sample: int) -> int:
    return max(1, keys // max(1, sample))


@contextmanager
def backup_sources(folder: Path, target: Target, options: RestoreOptions) -> Iterator[Prepared]:
    """Every RDB of the backup checked and loaded into a scratch server the target can take payloads from."""
    manifest = read_manifest(folder)
    check_files(folder, manifest)
    if target.cluster and manifest.dbs() - {0}:
        raise RefusedError(f"{folder} holds keys in databases {sorted(manifest.dbs() - {0})}; a cluster has only "
                           "database 0 (nothing was written)",
                           hint="restore into a standalone or replication topology, or move the keys to db 0 first")
    binaries = scratch_binaries()
    server = pick_scratch(list(binaries), manifest.rdb_version, target.server, f"the backup {folder}")
    with ExitStack() as stack:
        sources, dataset, expected = [], 0, {}
        databases = max(manifest.dbs() | {0}) + 1
        servers = stack.enter_context(scratch_servers(binaries[server], [folder / s.file for s in manifest.shards],
                                                      databases))
        for shard, scratch in zip(manifest.shards, servers, strict=True):
            dbs = sorted(db for db, (keys, _) in scratch.keyspace().items() if keys)
            dataset += scratch.dataset_bytes()
            key = f"shard-{shard.shard}"
            sources.append(Source(key, shard.file, _scratch_opener(scratch.socket, shard.file), dbs,
                                  _sample_every(shard.total_keys, options.sample)))
            expected[key] = shard
        text = f"backup {folder} ({describe(manifest)})"
        yield Prepared(f"backup:{folder.resolve()}:{manifest.created_at}", text, sources, dataset, expected)


def _scratch_opener(socket_path: str, label: str) -> Callable[[], RawPipe]:
    return lambda: RawPipe.on_socket(unix_socket(socket_path, 120.0), label)


def refuse_same_servers(target: LoadedSpec, source: LoadedSpec) -> None:
    """RefusedError when the source spec names a server of the target's: a topology copied into itself."""
    shared = {n.endpoint for n in source.layout.servers} & {n.endpoint for n in target.layout.servers}
    if shared:
        raise RefusedError("source and target are the same nodes",
                           f"both specs name {', '.join(sorted(shared))}",
                           "--from-live names another topology's spec")


@contextmanager
def live_sources(source: Connector, target: Target, options: RestoreOptions) -> Iterator[Prepared]:
    """A running topology: per shard a linked replica (else the master), read with DUMP as its server writes."""
    from opsctl.net.discover import discover, scan_targets

    chosen, problems = scan_targets(discover(source), allow_masters=True)
    if problems or not chosen:
        raise OpsctlError("the source topology has a shard without a reachable node",
                          "\n".join(f.message for f in problems), "`opsctl status -f SOURCE_SPEC`")
    if {ln.node.endpoint for ln in chosen} & {m.endpoint for m in target.masters}:
        raise RefusedError("source and target are the same nodes", hint="--from-live names another topology's spec")
    sources, dataset, infos = [], 0, []
    for ln in chosen:
        with source.admin(ln.node) as admin:
            info = parse_info(admin.info())
        infos.append(info)
        if target.cluster and set(parse_keyspace(info)) - {0}:
            raise RefusedError(f"{ln.node.name} holds keys in databases other than 0; a cluster has only "
                               "database 0 (nothing was written)", hint="restore into a standalone topology")
        keys = sum(k for k, _ in parse_keyspace(info).values())
        dataset += int(info.get("used_memory_dataset", "0"))
        sources.append(Source(ln.node.name, f"{ln.node.name} ({ln.node.endpoint})", _live_opener(source, ln.node),
                              sorted(parse_keyspace(info)), _sample_every(keys, options.sample)))
    server = _one_server(infos, "source")
    written = rdb_written_by(server)
    if written is None or not reads_rdb(*target.server, written):
        raise RefusedError(f"{server_text(*target.server)} cannot RESTORE what {server_text(*server)} DUMPs "
                           f"(RDB format {written}); nothing was written",
                           hint="restore into servers of the same or a newer version of the source's flavor")
    spec = source.loaded.spec
    yield Prepared(f"live:{source.loaded.file}", f"running topology {spec.name} ({spec.topology}, "
                   f"{len(sources)} shards)", sources, dataset)


def _live_opener(connector: Connector, node: Node) -> Callable[[], RawPipe]:
    return lambda: RawPipe(connector, node, 120.0)


# --- refusals before anything is written ----------------------------------------------------------------------


def _key_pages(src: RawPipe, db: int) -> Iterator[list[bytes]]:
    """Only the key names of db, a SCAN page at a time."""
    scan = src.name("SCAN")
    src.call("SELECT", db)
    cursor = b"0"
    while True:
        src.send(encode([scan, cursor, b"COUNT", 1000]))
        page = src.read(1)[0]
        if not (isinstance(page, list) and isinstance(page[0], bytes) and isinstance(page[1], list)):
            raise OpsctlError(f"unexpected SCAN reply from {src.label}", repr(page)[:200])
        yield [k for k in page[1] if isinstance(k, bytes)]
        cursor = page[0]
        if cursor == b"0":
            return


def existing_keys(prepared: Prepared, target: Target) -> tuple[int, list[str]]:
    """How many source keys the target already has, and a few of their names (EXISTS, pipelined)."""
    found, names = 0, list[str]()
    tp = TargetPipes(target.targets())
    try:
        for source in prepared.sources:
            src = source.open()
            try:
                for db in source.dbs:
                    tp.select(db)
                    for keys in _key_pages(src, db):
                        routed: list[list[bytes]] = [[] for _ in tp.pipes]
                        for key in keys:
                            routed[target.router.target(key)].append(key)
                        for pipe, part in zip(tp.pipes, routed, strict=True):
                            if not part:
                                continue
                            pipe.send(b"".join(encode([pipe.name("EXISTS"), k]) for k in part))
                            for key, reply in zip(part, pipe.read(len(part)), strict=True):
                                if reply == 1:
                                    found += 1
                                    if len(names) < 5:
                                        names.append(shown_key(key))
            finally:
                src.close()
    finally:
        tp.close()
    return found, names


def refuse_unsafe(prepared: Prepared, target: Target, options: RestoreOptions, resumed: bool) -> None:
    """Room and existing keys. A resumed run checked both before its first write, and the keys it wrote since
    count as used memory and as existing keys now: it skips them."""
    if resumed:
        return
    room = room_problems(prepared.dataset, target.room)
    if room:
        raise RefusedError("the target has no room for the data (nothing was written)", "\n".join(room),
                           "raise maxmemory (memory.maxmemory in the spec) or add masters, then restore")
    if options.mode != "fail-if-exists" or target.keys == 0:
        return
    found, names = existing_keys(prepared, target)
    if found:
        raise RefusedError(f"{found} keys of the source already exist on the target (nothing was written)",
                           "for example: " + ", ".join(repr(n) for n in names),
                           "--mode replace overwrites them, --mode skip-existing keeps the target's")


# --- the journal -------------------------------------------------------------------------------------------------


def journal_path(state_dir: Path) -> Path:
    return state_dir / JOURNAL


def load_journal(state_dir: Path, prepared: Prepared, mode: str) -> Journal | None:
    """The journal of this restore: an unfinished one to resume, or a finished one of the same source and mode
    (run_restore decides what it is worth); None for none, or a finished one of another restore."""
    path = journal_path(state_dir)
    text = read_bounded(path, "remove it to start over (keys already restored then count as existing keys)")
    if text is None:
        return None
    journal = parse_journal(text, str(path))
    same = (journal.source, journal.mode) == (prepared.id, mode)
    if journal.finished:
        return journal if same else None
    if not same:
        raise RefusedError("an unfinished restore from another source or in another mode is recorded",
                           f"{path}: source {journal.source}, mode {journal.mode}",
                           "re-run that restore to finish it, or remove the file to start over")
    return journal


def save_journal(state_dir: Path, journal: Journal) -> None:
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_private(journal_path(state_dir), journal_json(journal))


# --- the run -------------------------------------------------------------------------------------------------------


class Meter:
    """Keys written so far, as throttled `restore-progress` events."""

    def __init__(self, emit: Emit, total: int) -> None:
        self.emit, self.total, self.done = emit, total, 0
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self.last = 0.0

    def __call__(self, keys: int) -> None:
        with self.lock:
            self.done += keys
            done, now = self.done, time.monotonic()
            if now - self.last < 0.25:
                return
            self.last = now
        elapsed = max(1e-6, now - self.started)
        self.emit(RestoreProgress(done, self.total, round(done / elapsed), round(elapsed, 3)))


def run_restore(target: Target, prepared: Prepared, state_dir: Path, options: RestoreOptions,
                emit: Emit) -> RestoreReport:
    journal = load_journal(state_dir, prepared, options.mode)
    if journal is not None and journal.finished:
        existing = existing_keys(prepared, target) if options.mode == "fail-if-exists" and target.keys else (0, [])
        if existing[0]:
            return recheck_finished(target, prepared, state_dir, options, journal, existing, emit)
        journal = None  # replace and skip-existing run again in full; so does a target without the source's keys
    refuse_unsafe(prepared, target, options, journal is not None)
    report = RestoreReport(prepared.text, target.loaded.spec.name, options.mode, options.dry_run, journal is not None,
                           dict(journal.done) if journal else {})
    if options.dry_run:
        return report
    journal_was_new = journal is None
    journal = journal or Journal(prepared.id, options.mode)
    save_journal(state_dir, journal)
    started = time.monotonic()
    todo = [s for s in prepared.sources if s.key not in journal.done]
    sample_again([s for s in prepared.sources if s not in todo], options)  # copied by a run killed before its checks
    meter = Meter(emit, sum(e.total_keys for e in prepared.expected.values()))

    def written(keys: int) -> None:
        check_held(target.connector)  # paused past the lock's lease: stop before writing more (a re-run resumes)
        meter(keys)
    lock = threading.Lock()

    def one(source: Source) -> None:
        compare = Side(source.open, target.targets().open)
        try:
            counts = copy_source(source, target.targets(), options.mode, written, compare)
        except (redis.RedisError, *PIPE_ERRORS) as exc:
            raise OpsctlError(f"the restore of {source.label} stopped: {type(exc).__name__}: {exc}",
                              hint="re-run the same command when the nodes answer again: it resumes") from None
        finally:
            compare.close()
        with lock:
            assert journal is not None
            journal.done[source.key] = counts
            report.sources[source.key] = counts
            save_journal(state_dir, journal)

    with ThreadPoolExecutor(max_workers=max(1, len(todo))) as pool:
        for future in [pool.submit(one, s) for s in todo]:
            future.result()
    report.seconds = time.monotonic() - started
    report.problems = count_problems(report, prepared)
    started_empty = journal_was_new and target.keys == 0  # else restored keys may have replaced others
    if started_empty and (problem := landed_problem(0, target_keys(target), report.total)):
        report.problems.append(problem)
    report.verified, problems = checked_again(prepared, target, options, {s.key for s in todo})
    report.problems += problems
    if report.problems:  # a re-run reads every source again and checks again, not trusting the finished ones
        journal.done.clear()
    journal.finished = not report.problems
    save_journal(state_dir, journal)
    emit(report.done())
    return report


def recheck_finished(target: Target, prepared: Prepared, state_dir: Path, options: RestoreOptions,
                     journal: Journal, existing: tuple[int, list[str]], emit: Emit) -> RestoreReport:
    """The same restore finished here before (its journal says so) and the source's keys are on the target: a
    run killed after its checks passed, run again, or the same restore asked for twice. Nothing is copied; the
    counts and the sampled keys are checked again, and a target that no longer matches gets the refusal a fresh
    run would get. The journal stays as it was."""
    report = RestoreReport(prepared.text, target.loaded.spec.name, options.mode, options.dry_run, True,
                           dict(journal.done), rechecked=True)
    sample_again(prepared.sources, options)  # reads only: a dry run checks as much
    report.verified, problems = checked_again(prepared, target, options, set())
    problems = count_problems(report, prepared) + problems
    if problems:
        found, names = existing
        raise RefusedError(f"{found} keys of the source already exist on the target (nothing was written)",
                           f"a restore of this source finished here before ({journal_path(state_dir)}); checked "
                           "again, the target no longer matches it:\n" + "\n".join(problems[:5])
                           + "\nfor example: " + ", ".join(repr(n) for n in names),
                           "--mode replace overwrites them, --mode skip-existing keeps the target's")
    if not options.dry_run:
        emit(report.done())
    return report


def sample_again(sources: list[Source], options: RestoreOptions) -> None:
    """Samples for sources copied by an earlier run (their copy's samples went with it)."""
    for source in sources if options.verify == "sample" else []:
        source.samples = first_entries(source, options.sample)


def checked_again(prepared: Prepared, target: Target, options: RestoreOptions,
                  copied: set[str]) -> tuple[int, list[str]]:
    try:
        return verify(prepared, target, options, copied)
    except (redis.RedisError, *PIPE_ERRORS) as exc:
        raise OpsctlError(f"the checks after the copy stopped: {type(exc).__name__}: {exc}",
                          hint="re-run the same command when the nodes answer again: it resumes and checks") from None


def target_keys(target: Target) -> int:
    """Keys on the target masters now, every db."""
    total = 0
    for master in target.masters:
        with target.connector.admin(master) as admin:
            total += sum(k for k, _ in parse_keyspace(parse_info(admin.info("keyspace"))).values())
    return total


def count_problems(report: RestoreReport, prepared: Prepared) -> list[str]:
    problems = []
    for key, counts in sorted(report.sources.items()):
        balance = counts.balance_problem()
        if balance:
            problems.append(f"{key}: {balance}")
        if counts.conflicts:
            problems.append(f"{key}: {counts.conflicts} keys exist on the target with another value, e.g. "
                            + ", ".join(repr(k) for k in counts.conflict_keys))
        shard = prepared.expected.get(key)
        if shard is not None and (problem := count_problem(shard, counts.scanned)):
            problems.append(f"{key} ({shard.file}): {problem}")
    return problems


def verify(prepared: Prepared, target: Target, options: RestoreOptions, copied: set[str]) -> tuple[int, list[str]]:
    """The sampled keys (or, with verify=full, every key read again) compared with the target. Under
    skip-existing a key the target had keeps its own value: the samples this run copied leave those out (they
    are known), the others (copied by an earlier run, or all keys with verify=full) are checked for presence."""
    checked, problems = 0, []
    skip_existing = options.mode == "skip-existing"
    for source in prepared.sources if options.verify == "sample" else []:
        compare = Side(source.open, target.targets().open)
        tp = TargetPipes(target.targets())
        samples = [e for e in source.samples if (e.db, e.key) not in source.kept]
        try:
            for db in sorted({e.db for e in samples}):
                tp.select(db)
                page = [e for e in samples if e.db == db]
                problems += compare_page(tp, page, compare, skip_existing and source.key not in copied)
                checked += len(page)
        finally:
            tp.close()
            compare.close()
    for source in prepared.sources if options.verify == "full" else []:
        n, found = verify_all(source, target, skip_existing)
        checked += n
        problems += found
    return checked, problems[:MAX_PROBLEMS]


def verify_all(source: Source, target: Target, kept: bool) -> tuple[int, list[str]]:
    compare = Side(source.open, target.targets().open)
    tp = TargetPipes(target.targets())
    src = source.open()
    checked, problems = 0, []
    try:
        for db in source.dbs:
            tp.select(db)
            for page in pages(src, db, source.label):
                problems += compare_page(tp, page, compare, kept)
                checked += len(page)
                if len(problems) >= MAX_PROBLEMS:
                    return checked, problems
    finally:
        src.close()
        tp.close()
        compare.close()
    return checked, problems
