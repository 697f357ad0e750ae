"""`opsctl migrate`: every source shard copied and followed at once, then the cutover, started by `--cutover
auto` under the lag bound or by the request file `opsctl migrate cutover` leaves in the target's state dir.
Killed, the same command resumes from the journal: a snapshot copy starts again, a stream continues with a partial
resync (docs/migrate.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import ClassVar

from opsctl.base.errors import NodeUnreachable, OpsctlError, RefusedError
from opsctl.base.events import Emit, Event, Note, Redrawn, human_bytes
from opsctl.base.frozen import Frozen, frozen
from opsctl.base.stop import Stopped
from opsctl.migrate.cutover import CutoverDone, CutoverOptions, check_locks, cut_over, master_offset, shard_master
from opsctl.migrate.phases import REQUEST, RESULT, JournalFile, load_journal, new_journal
from opsctl.migrate.replay import TargetChanged
from opsctl.migrate.shard import NoMemberAnswers, ShardRun
from opsctl.net.connection import connection_to
from opsctl.net.connector import Connector
from opsctl.net.fanout import Borrowed
from opsctl.restore.engine import Targets
from opsctl.restore.functions import check_libraries
from opsctl.restore.target import Target, inspect_target
from opsctl.state.safefs import write_private


@frozen
class MigrateLag(Frozen, Event):
    """A live migration's progress: per source shard its phase, keys copied, commands applied, and how far the
    target trails the source (bytes of stream, seconds since the oldest unapplied command arrived)."""

    kind: ClassVar[str] = "migrate-lag"
    redrawn: ClassVar[Redrawn] = "bar"
    shards: Mapping[str, Mapping[str, object]]

    def line(self) -> str:
        parts = []
        for name, s in self.shards.items():
            lag_bytes = int(str(s.get("lag_bytes", 0)))
            if s.get("phase") == "stream":
                # -1: the source did not answer (a split): its lag is unknown, not small
                shown = human_bytes(lag_bytes) if lag_bytes >= 0 else "unknown (the source does not answer)"
                parts.append(f"{name}: lag {shown} {float(str(s.get('lag_seconds', 0.0))):.2f}s, "
                             f"{s.get('applied', 0)} applied")
            elif s.get("phase") == "attach":
                parts.append(f"{name}: attaching again (link lost), {s.get('applied', 0)} applied")
            else:
                parts.append(f"{name}: {s.get('phase')}, {s.get('copied', 0)} keys copied")
        return "  ".join(parts)


CLOCK_BOUND_MS = 1000  # a snapshot's expiries are in the source's clock: a wider skew would move them
AUTO_LAG_BYTES = 1 << 20


@dataclass(frozen=True)
class MigrateOptions:
    cutover: str = "manual"  # auto | manual
    lag_bound: float = 1.0  # seconds: --cutover auto starts once every shard trails by less
    sample: int = 200
    interval: float = 0.5
    # a passed cutover's next step before its report is published (RESULT, the event): a standby lifts its own
    # fence there (opsctl.standby.link), so a waiting `switchover` returns once the standby takes writes
    after_cutover: Callable[[CutoverDone], CutoverDone] | None = None


def clock_offset_ms(connector: Connector, node: object) -> float:
    """The node's clock minus ours, in ms (within half a round trip)."""
    from opsctl.spec.layout import Node

    assert isinstance(node, Node)
    with connection_to(connector, node, 10.0) as handle:
        handle.ping()  # the connection is open before the clock is read: the round trip counts, not the connect
        before = time.time()
        reply = handle.call("TIME")
        after = time.time()
    if not isinstance(reply, list) or len(reply) != 2:
        raise OpsctlError(f"unexpected TIME reply from {node.name}")
    theirs = int(reply[0]) * 1000 + int(reply[1]) / 1000  # type: ignore[arg-type]
    return theirs - (before + after) * 500


def source_id(source: Connector) -> str:
    return f"{source.loaded.spec.name}:{','.join(sorted(n.endpoint for n in source.loaded.layout.servers))}"


def prepare(source: Connector, target_connector: Connector, state_dir: Path,
            source_ref: dict[str, str]) -> tuple[Target, JournalFile, bool]:
    """The target inspected and the journal: resumed once a shard has begun (its first save precedes any key it
    writes), else new or not begun, when the target must be empty. Not saved here: run_migrate saves it once the
    checks before the copy passed, so a refused start leaves nothing behind that a re-run would take for a begun
    migration and skip those checks."""
    target = inspect_target(target_connector)
    if {n.endpoint for n in source.loaded.layout.servers} & {m.endpoint for m in target.masters}:
        raise RefusedError("source and target are the same nodes", hint="--from names another topology's spec")
    sid = f"endpoints:{source_ref['from_endpoints']}" if "from_endpoints" in source_ref else source_id(source)
    journal = load_journal(state_dir, sid)
    resumed = journal is not None and bool(journal.shards)
    if not resumed:
        if target.keys:
            raise RefusedError(f"the target holds {target.keys} keys; a migration starts into an empty target "
                               "(nothing was written)", hint="empty it, or migrate into another topology")
        journal = journal or new_journal(sid, source_ref)
    assert journal is not None
    for name in (REQUEST, RESULT):
        (state_dir / name).unlink(missing_ok=True)
    return target, JournalFile(state_dir, journal), resumed


def source_clock_ms(source: Connector) -> float:
    """The source's clock minus ours, read on the first of its servers that answers: its spec's first master may
    be down (a failover since, and the run resumed meanwhile), and any member's clock is the shard's."""
    down = []
    for node in source.loaded.layout.servers:
        try:
            return clock_offset_ms(source, node)
        except NodeUnreachable as exc:
            down.append(exc.summary)
    raise NoMemberAnswers("no server of the source answers", "\n".join(down),
                          "start them (`opsctl status -f SOURCE_SPEC`), then re-run: it resumes")


def shard_runs(source: Connector, target: Target, journal: JournalFile, state_dir: Path) -> list[ShardRun]:
    layout = source.loaded.layout
    source_ms = source_clock_ms(source)
    target_ms = clock_offset_ms(target.connector, target.masters[0])
    if abs(source_ms) > CLOCK_BOUND_MS:
        raise RefusedError(f"the source's clock is {source_ms / 1000:+.1f}s off this host's",
                           "the snapshot's expiry times are the source's and are read here",
                           "sync the clocks (NTP), then run again")
    runs = []
    for shard in layout.shards:
        members = [n for name in shard.members if (n := layout.find(name)) is not None]
        runs.append(ShardRun(f"shard-{shard.index}", members, source, partial(fresh_targets, target.connector),
                             journal, state_dir, round(target_ms - source_ms), source_ms,
                             check_locks=partial(check_locks, source, target.connector)))
    return runs


def check_source_libraries(source: Connector, shards: Sequence[ShardRun], targets: Targets) -> None:
    """A function library that differs between source shards, or from the target's, refused before any shard
    copies a key (each shard's copy would find it only on its own turn). A shard with no member answering is
    left to its run, which waits it out."""
    openers = {}
    for shard in shards:
        try:
            handle = connection_to(source, shard.attach_node(), 10.0)
            openers[f"source {shard.key}"] = partial(handle.dedicated, 10.0)
        except NoMemberAnswers:
            continue
    check_libraries(openers, [partial(targets.open, index) for index in range(len(targets.names))])


def fresh_targets(connector: Connector) -> Targets:
    """The target's masters and routing as they are now; not converged (a failover under way): TargetChanged,
    which a shard waits out like a lost link."""
    try:
        return inspect_target(connector).targets()
    except RefusedError as exc:
        raise TargetChanged(exc.summary, exc.detail) from None


def run_migrate(source: Connector, target_connector: Connector, state_dir: Path, options: MigrateOptions,
                emit: Emit, source_ref: dict[str, str] | None = None) -> CutoverDone:
    """source_ref: the --from* options that reach the source again, kept in the journal (no secret in them)."""
    target, journal, resumed = prepare(source, target_connector, state_dir, source_ref or {})
    if resumed:
        emit(Note(f"resuming the migration recorded in {journal.path}"))
    if journal.journal.fence is not None:
        emit(Note("an interrupted cutover left the source fenced: cutting over as soon as every shard streams"))
    shards = shard_runs(source, target, journal, state_dir)
    if not resumed:
        check_source_libraries(source, shards, target.targets())
    journal.save()
    with Borrowed() as pool:
        futures = [pool.submit(s.run) for s in shards]
        try:
            report = _watch(source, target, shards, futures, state_dir, options, emit, journal)
            if report.ok and options.after_cutover is not None:
                report = options.after_cutover(report)
        except OpsctlError as exc:
            if (state_dir / REQUEST).exists():  # the waiting `migrate cutover` learns why, not just that
                write_private(state_dir / RESULT, f"cutover failed: {exc.summary}\n")
                (state_dir / REQUEST).unlink(missing_ok=True)
            raise
        finally:
            for s in shards:
                s.stop.set()
    if report.ok:
        journal.journal.finished = True
        journal.save()
    write_private(state_dir / RESULT, report.line())
    (state_dir / REQUEST).unlink(missing_ok=True)
    emit(report)
    return report


def _watch(source: Connector, target: Target, shards: Sequence[ShardRun], futures: Sequence[Future[None]],
           state_dir: Path, options: MigrateOptions, emit: Emit, journal: JournalFile) -> CutoverDone:
    """Progress until the cutover; a shard's error stops the run."""
    while True:
        check_locks(source, target.connector)  # hours of streaming: a lost lock stops the run (it resumes)
        for future in futures:
            if future.done():
                future.result()  # raises the shard's error
                raise OpsctlError("a shard stopped without an error")  # never: shards run until told
        lags = _lags(source, shards)
        emit(MigrateLag({s.key: lags[s.key] for s in shards}))
        if _cutover_due(shards, lags, state_dir, options, journal.journal.fence is not None):
            emit(Note("cutover: fencing the source against writes"))

            def stop() -> None:
                for s in shards:
                    s.stop.set()
                for f in futures:
                    f.result()
            now = inspect_target(target.connector)  # its masters now: a target failover since the start
            return cut_over(source, now, shards, stop, CutoverOptions(options.sample), journal)
        time.sleep(options.interval)


def _lags(source: Connector, shards: Sequence[ShardRun]) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for s in shards:
        row: dict[str, object] = {"phase": s.phase, "copied": s.copied,
                                  "applied": s.applied, "lag_seconds": round(s.lag_seconds, 3),
                                  "applied_at": s.applied_at}
        if s.streaming and s.position is not None:
            try:
                row["lag_bytes"] = max(0, master_offset(source, shard_master(source, s)) - s.position.offset)
            except Stopped:
                raise  # a stop request, not a node that did not answer
            except OpsctlError:  # NodeError too: the node did not answer
                row["lag_bytes"] = -1
        out[s.key] = row
    return out


def _cutover_due(shards: Sequence[ShardRun], lags: dict[str, dict[str, object]], state_dir: Path,
                 options: MigrateOptions, fenced: bool) -> bool:
    """Every shard streams, and: a cutover was asked for, one was interrupted (the source is fenced), or --cutover
    auto finds every lag under the bound."""
    if not all(s.streaming for s in shards):
        return False
    if fenced or (state_dir / REQUEST).exists():
        return True
    if options.cutover != "auto":
        return False
    return all(0 <= int(str(r.get("lag_bytes", -1))) < AUTO_LAG_BYTES and float(str(r["lag_seconds"])) <
               options.lag_bound for r in lags.values())
