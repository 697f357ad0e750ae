"""The cutover: fence every source master (the failover's fence: clients get NOREPLICAS, not a silent OK), wait
until the target applied each shard's final offset, stop, verify, report the write pause and where clients must
point. A failed check lifts the fence: the source serves again, the target got nothing since. The fence outlives
opsctl (docs/migrate.md, "Roll back").

The cutover's checks: key counts of source and target (TTL-aware) and sampled values with their expiries.

Counts first come from INFO keyspace; when they differ, both sides are counted again with SCAN, which leaves out
keys whose time ran out but that no one reclaimed yet (a server counts those until it touches them), so a key
that expired during the migration is not "missing". A sampled key gone from the target is a problem only while
the source still has it."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import ClassVar

from opsctl.backup.savers import parse_keyspace
from opsctl.base.errors import OpsctlError
from opsctl.base.events import Event
from opsctl.base.frozen import Frozen, frozen
from opsctl.base.poll import Pending, wait_for
from opsctl.failover.actions import checkpoint
from opsctl.failover.fence import fence, unfence
from opsctl.migrate.phases import JournalFile
from opsctl.migrate.replay import Applier
from opsctl.migrate.shard import ShardRun
from opsctl.net.connection import connection_to
from opsctl.net.connector import Connector
from opsctl.net.discover import live_node
from opsctl.net.rawpipe import RawPipe
from opsctl.net.topolock import check_held
from opsctl.observe.replies import RespError, info, parse_info
from opsctl.plan.facts import MAX_LAG, TO_WRITE, fenced, spec_values
from opsctl.restore.engine import Targets, value_of
from opsctl.restore.target import Target
from opsctl.spec.layout import Node


@frozen
class CutoverDone(Frozen, Event):
    """A cutover's report: counted from fencing the source, the target applied every shard's final offset after
    caught_up_s and was verified and ready after pause_s (the least write pause clients see)."""

    kind: ClassVar[str] = "cutover-done"
    ok: bool
    pause_s: float
    caught_up_s: float
    source_keys: int
    target_keys: int
    verified: int
    final_offsets: Mapping[str, int]
    point_to: tuple[str, ...]
    problems: tuple[str, ...]

    def line(self) -> str:
        if not self.ok:
            return ("cutover failed verification; the source's write fence is lifted, it serves writes again:\n"
                    + "\n".join(f"  {p}" for p in self.problems))
        return (f"cutover done: write pause {self.pause_s:.3f}s (caught up after {self.caught_up_s:.3f}s), "
                f"{self.target_keys} keys ({self.source_keys} on the source), {self.verified} sampled keys equal; "
                f"point clients at {', '.join(self.point_to)}")


CATCH_UP_TIMEOUT = 30.0


@dataclass(frozen=True)
class CutoverOptions:
    sample: int = 200
    timeout: float = CATCH_UP_TIMEOUT


def shard_master(source: Connector, shard: ShardRun) -> Node:
    for node in shard.members:
        if live_node(source, node).role == "master":
            return node
    raise OpsctlError(f"source {shard.key} has no master answering now", hint="re-run the cutover once it has one")


def master_offset(source: Connector, node: Node) -> int:
    with connection_to(source, node, 10.0) as handle:
        return int(handle.read(info("replication")).get("master_repl_offset", "0"))


def check_locks(source: Connector, target: Connector) -> None:
    """OpsctlError when the run lost the topology lock of the source or the target (a run that holds none: nothing):
    before each batch a shard writes to the target, each look at the lag, and the fence."""
    check_held(source)
    check_held(target)


def cut_over(source: Connector, target: Target, shards: Sequence[ShardRun], stop: Callable[[], None],
             options: CutoverOptions, journal: JournalFile) -> CutoverDone:
    check_locks(source, target.connector)  # the fence changes the source: only while both locks are held
    masters = {s.key: shard_master(source, s) for s in shards}
    record_settings(source, list(masters.values()), journal)
    started = time.monotonic()
    try:
        for node in masters.values():
            with connection_to(source, node) as handle:
                fence(handle)
        checkpoint("migrate-fenced")
        finals = {key: master_offset(source, node) for key, node in masters.items()}
        wait_for(lambda: _caught_up(shards, finals), options.timeout, "the target to apply the source's last writes")
        caught_up = time.monotonic() - started
        stop()
        report = _verify(source, target, shards, masters, options, caught_up, finals, started)
        checkpoint("migrate-verified")
    except BaseException:
        lift_fence(source, journal)
        raise
    if not report.ok:
        lift_fence(source, journal)
    return report


def record_settings(source: Connector, masters: Sequence[Node], journal: JournalFile) -> None:
    """Each master's min-replicas-* values journaled before any is fenced; values an earlier, interrupted cutover
    journaled stay (the master shows the fence now, not what to restore)."""
    known = dict(journal.journal.fence or {})
    for node in masters:
        if node.endpoint in known:
            continue
        with connection_to(source, node) as handle:
            values = {k: v for k, v in handle.config_get("min-replicas-*").items() if k in (TO_WRITE, MAX_LAG)}
        known[node.endpoint] = spec_values(source.loaded, node) if fenced(values) else values
    journal.journal.fence = known
    journal.save()


def lift_fence(source: Connector, journal: JournalFile) -> list[str]:
    """The journaled values back on every master a cutover fenced (the source serves writes again); the record is
    dropped once every one is lifted. Returns the masters lifted."""
    lifted: list[str] = []
    for address, values in sorted((journal.journal.fence or {}).items()):
        node = source.loaded.layout.find(address)
        if node is None:
            raise OpsctlError(f"the journal names a fenced source master {address} the source does not list",
                              hint=f"lift it by hand: CONFIG SET {TO_WRITE} {values.get(TO_WRITE, '0')}")
        with connection_to(source, node) as handle:
            unfence(handle, values, rewrite=False)
        lifted.append(address)
    journal.journal.fence = None
    journal.save()
    return lifted


def _caught_up(shards: Sequence[ShardRun], finals: dict[str, int]) -> bool | Pending:
    behind = [f"{s.key} at {s.position.offset if s.position else 0} of {finals[s.key]}" for s in shards
              if s.position is None or s.position.offset < finals[s.key]]
    return Pending("; ".join(behind)) if behind else True


def _verify(source: Connector, target: Target, shards: Sequence[ShardRun], masters: dict[str, Node],
            options: CutoverOptions, caught_up: float, finals: dict[str, int], started: float) -> CutoverDone:
    targets = target.targets()
    with ExitStack() as stack:
        src = [stack.enter_context(connection_to(source, node, 60.0).dedicated(60.0)) for node in masters.values()]
        dst = [stack.enter_context(targets.open(i)) for i in range(len(targets.names))]
        appliers = [Applier(targets, shards[0].journal.journal.id, s.key, 0, 0.0) for s in shards]
        markers = sum(1 for a in appliers for pipe, key in zip(dst, a.markers, strict=True)
                      if pipe.call("EXISTS", key) == 1)
        prefix = b"opsctl-migrate:"
        source_keys, target_keys, problem = count_problem(src, dst, markers, prefix)
        shift = shards[0].shift_ms if shards else 0
        verified, problems = sample_problems(src, targets, dst, max(1, options.sample // max(1, len(src))), shift)
        problems = ([problem] if problem else []) + problems
        if not problems:
            for applier in appliers:
                applier.drop_markers()
        for applier in appliers:
            applier.close()
    point_to = tuple(m.endpoint for m in target.masters)
    return CutoverDone(not problems, round(time.monotonic() - started, 3), round(caught_up, 3), source_keys,
                       target_keys, verified, finals, point_to, tuple(problems))


TTL_SLACK_MS = 2000


def info_keys(pipe: RawPipe) -> int:
    reply = pipe.call("INFO", "keyspace")
    info = parse_info(reply.decode() if isinstance(reply, bytes) else "")
    return sum(keys for keys, _ in parse_keyspace(info).values())


def scan_keys(pipe: RawPipe, skip: bytes = b"") -> int:
    """Keys of db 0 a SCAN returns (expired ones are dropped as it meets them); keys starting with skip left out."""
    cursor, count = b"0", 0
    while True:
        reply = pipe.call("SCAN", cursor, "COUNT", 1000)
        if not isinstance(reply, list) or not isinstance(reply[0], bytes) or not isinstance(reply[1], list):
            raise RespError(f"unexpected SCAN reply from {pipe.label}")
        cursor = reply[0]
        count += sum(1 for k in reply[1] if isinstance(k, bytes) and not (skip and k.startswith(skip)))
        if cursor == b"0":
            return count


def count_problem(sources: Sequence[RawPipe], targets: Sequence[RawPipe], markers: int,
                  marker_prefix: bytes) -> tuple[int, int, str | None]:
    """(source keys, target keys, a problem or None)."""
    source = sum(info_keys(p) for p in sources)
    target = sum(info_keys(p) for p in targets) - markers
    if source == target:
        return source, target, None
    source = sum(scan_keys(p) for p in sources)
    target = sum(scan_keys(p, marker_prefix) for p in targets)
    if source == target:
        return source, target, None
    return source, target, f"the source holds {source} keys, the target {target} (counted by SCAN, expired keys out)"


def sample_problems(sources: Sequence[RawPipe], targets: Targets, pipes: Sequence[RawPipe], per_source: int,
                    shift_ms: int) -> tuple[int, list[str]]:
    """Up to per_source random keys of each source compared with the target: value and absolute expiry."""
    checked, problems = 0, []
    for src in sources:
        keys = {k for _ in range(per_source) if isinstance(k := src.call("RANDOMKEY"), bytes)}
        for key in sorted(keys):
            dst = pipes[targets.router.target(key)]
            problem = _key_problem(src, dst, key, shift_ms)
            checked += 1
            if problem:
                problems.append(problem)
            if len(problems) >= 10:
                return checked, problems
    return checked, problems


def _key_problem(src: RawPipe, dst: RawPipe, key: bytes, shift_ms: int) -> str | None:
    shown = key[:60].decode("utf-8", "replace")
    theirs = value_of(dst, 0, key)
    ours = value_of(src, 0, key)
    if ours != theirs:
        gone = ours[0] == b"none" if isinstance(ours, tuple) else False
        return None if gone else f"key {shown!r} differs between source and target"
    at_source, at_target = src.call("PEXPIRETIME", key), dst.call("PEXPIRETIME", key)
    if isinstance(at_source, int) and isinstance(at_target, int) and (at_source < 0) != (at_target < 0):
        return f"key {shown!r}: expiry {at_source} on the source, {at_target} on the target"
    if isinstance(at_source, int) and isinstance(at_target, int) and at_source > 0 and \
            abs(at_source + shift_ms - at_target) > TTL_SLACK_MS:
        return f"key {shown!r}: expires at {at_source} (source clock) but {at_target} on the target"
    return None
