"""Key-by-key slot migration, for servers without atomic migration; the I/O shell of opsctl.slots.batching.

Per wave of slots each control step is one pipelined round trip per node, not several per slot: list and size the
keys, IMPORTING, MIGRATING, the MIGRATE batches, the drain, then SETSLOT NODE on the target, the source and every
other master."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from opsctl.base import stop
from opsctl.base.errors import NodeUnreachable, OpsctlError, RefusedError
from opsctl.base.events import Emit
from opsctl.base.poll import Pending, wait_for
from opsctl.net.fanout import Borrowed, fan_out
from opsctl.net.topolock import check_held
from opsctl.observe.replies import ClusterNodeLine, Command, myself, parse_cluster_nodes
from opsctl.slots.batching import (
    Batch,
    backoff,
    base_timeout_ms,
    batches,
    closed_first,
    opened_together,
    rate_delay,
    timeout_ms,
    trip_timeout_s,
    waves,
)
from opsctl.slots.journal import Journal
from opsctl.slots.members import shard_members
from opsctl.slots.moveguard import DOWN, OK, REPLACED, flagged_ids, verdict
from opsctl.slots.progress import BigKey, BusyKeyEqual, EndpointDown, MigrateRetry, Progress
from opsctl.slots.session import Peer, Session, checked, keyed, pipe, stream

WAVE_SLOTS = 512
FIRST_WAVE = 16  # the source waits while the first wave is listed and opened: keep it short
FETCH_KEYS = 1000
# Waves listed and sized at once, ahead of the one moving: a listing takes two turns of the source at least
# (GETKEYSINSLOT, then MEMORY USAGE), each behind ~16 KB of MIGRATE, longer than a first wave takes to move.
# Two kept the waves that double waiting 0.1-0.3 s in all for their listing once they opened together; three,
# 0.01-0.07 s (Redis 7.0, 300k keys).
LIST_AHEAD = 3
# Slots open at once: at most this many waves of the full size (behind, moving, ahead); the small first waves
# open as soon as they are journaled (their closes take a few turns of the source each, longer than they move),
# after the first together (batching.opened_together).
OPEN_WAVES = 3
MAX_FAILED_ROUNDS = 5
Plan = list[tuple[int, Batch]]
Work = dict[int, tuple[list[bytes], list[int | None]]]  # slot -> its keys and their sizes
# Connections a wave's listing and sizing is spread over, each with a share of its slots. The source reads 16 KB
# of each client's commands per turn of its event loop (~450 MEMORY USAGE, ~35 bytes a key) and, below its
# maxmemory, writes at most 64 KB of each client's replies (~3000 listed keys): one connection fell behind the
# MIGRATE stream (~900 keys a turn), four kept up with waves of one size but not with waves that double. (A Lua
# script that sizes a whole slot per call keeps up on one connection but costs the single-threaded source ~60%
# more CPU per key than the plain commands.)
LISTING_LINKS = 8
LISTING_PART = 16  # slots per connection at least


class EndpointReplaced(OpsctlError):
    """The cluster promoted another node of the source's or the target's shard in the middle of the move."""

    def __init__(self, role: str, name: str) -> None:
        super().__init__(f"the {role} {name} was failed over in the middle of a slot move",
                         "the cluster promoted another node of its shard; the open slots are journaled",
                         "`opsctl cluster fix -f SPEC` (or `apply`) finishes the move with the shard's new master")
        self.role, self.name = role, name


@dataclass(frozen=True)
class Options:
    max_keys_per_sec: float | None = None
    wave_slots: int = WAVE_SLOTS
    first_wave: int = FIRST_WAVE
    fetch_keys: int = FETCH_KEYS


def _closed_so_far(closed: Sequence[Future[None]]) -> int:
    """How many waves from the first are closed, each without an error."""
    return next((i for i, wave in enumerate(closed) if not wave.done() or wave.exception() is not None), len(closed))


def auth_args(session: Session) -> tuple[str, ...]:
    """MIGRATE's credentials for the target (a command argument on an authenticated link, never argv)."""
    spec = session.loaded.spec
    password = session.loaded.credentials.password.reveal()
    if spec.auth.mode == "acl":
        return ("AUTH2", spec.auth.admin_user, password)
    return ("AUTH", password)


class KeyMover:
    """Moves slots from source to target key by key; every slot it opens is journaled first."""

    def __init__(self, session: Session, source: Peer, target: Peer, journal: Journal, progress: Progress,
                 emit: Emit, options: Options) -> None:
        self.session, self.source, self.target = session, source, target
        self.journal, self.progress, self.emit, self.options = journal, progress, emit, options
        failing = flagged_ids(session.views())
        self.others = [p for p in session.masters() if p.name not in (source.name, target.name)
                       and p.id not in failing]
        self.auth = auth_args(session)
        self.node_timeout_ms = session.loaded.spec.cluster_or_default().node_timeout_ms
        self.base_ms = base_timeout_ms(self.node_timeout_ms)
        self.started = time.monotonic()
        self.moved = 0
        self.target_serves: frozenset[int] = frozenset()  # by the target's own view at the last look at both ends
        self._moved_lock = threading.Lock()

    def move(self, slots: Sequence[int]) -> None:
        """Wave by wave, so that the source never waits for opsctl. Listing ahead (`packed_plan`), journaling
        and opening (`admit`), streaming MIGRATEs (`send`) and draining/closing (`finish`) run at once on their own
        connections. A slot is journaled before it opens; `drain` lists again once MIGRATING is set, so keys
        written meanwhile move too."""
        try:
            self._move(slots)
        except NodeUnreachable as exc:
            self.ensure_endpoints()  # raises EndpointReplaced, or a clear error when one stays down
            raise OpsctlError(f"lost the connection to a node while moving slots {self.source.name} -> "
                              f"{self.target.name}", exc.why,
                              "both answer again: run the same command again or `opsctl cluster fix -f SPEC`; "
                              "the open slots are journaled") from None

    def _move(self, slots: Sequence[int]) -> None:
        parts = waves(slots, self.options.first_wave, self.options.wave_slots)
        lister = Borrowed()  # at most LIST_AHEAD listings submitted at a time
        # private, one thread each: waves open and close one at a time, in order (an opening waits for closes)
        opener, behind = ThreadPoolExecutor(max_workers=1), ThreadPoolExecutor(max_workers=1)
        closed: list[Future[None]] = [Future() for _ in parts]
        sizes, most_open = [len(p) for p in parts], OPEN_WAVES * self.options.wave_slots

        stopped = threading.Event()  # a wave failed to open, or the move failed: open no more
        opened_early: set[int] = set()  # waves opened with an earlier one (the opener's thread only)

        def admitted(i: int) -> None:
            if i in opened_early:
                return
            for earlier in closed[:closed_first(sizes, i, most_open)]:
                earlier.result()
            if stopped.is_set():
                raise OpsctlError("the move stopped before this wave opened")
            try:
                stop.check()  # the safe point: a stop request opens no more slots
            except stop.Stopped:
                stopped.set()
                raise
            count = opened_together(sizes, i, most_open, self.options.wave_slots, _closed_so_far(closed))
            try:
                self.admit([slot for wave in parts[i:i + count] for slot in wave])
            except BaseException:
                stopped.set()
                raise
            opened_early.update(range(i + 1, i + count))

        read: list[int] = []  # waves whose replies are all read and that no close has taken yet
        read_lock = threading.Lock()

        def finished() -> None:
            """Every wave read and not yet taken, drained and closed together: a close costs the same few turns
            of the source and the target whatever its size, so a closer that fell behind the stream catches up
            instead of holding back the openings (and the stream behind them)."""
            with read_lock:
                taken = read[:]
                read.clear()
            if not taken:
                return
            try:
                self.finish([slot for i in taken for slot in parts[i]])
            except BaseException as exc:
                for i in taken:
                    closed[i].set_exception(exc)
                raise
            for i in taken:
                closed[i].set_result(None)

        failed = True
        stopped_at: tuple[int, stop.Stopped] | None = None
        try:
            listed = [lister.submit(self.packed_plan, wave) for wave in parts[:LIST_AHEAD]]
            opened = [opener.submit(admitted, i) for i in range(len(parts))]  # each as soon as it may
            closing: list[Future[None]] = []
            plans: dict[int, Plan] = {}
            trip = self.session.engine_timeout
            with self.source.handle.held() as link:

                def collect(i: int) -> None:
                    """Wave i's replies, then its close behind; a close that failed stops the run."""
                    plan = plans.pop(i)
                    self.received(plan, link.read(len(plan)))
                    with read_lock:
                        read.append(i)
                    closing.append(behind.submit(finished))
                    for done in (f for f in closing if f.done()):
                        done.result()

                for i in range(len(parts)):
                    try:
                        opened[i].result()
                    except stop.Stopped as asked:  # the waves open so far move and close, then it stops
                        stopped_at = (i, asked)
                        break
                    plan, packed = listed[i].result()
                    if i + LIST_AHEAD < len(parts):
                        listed.append(lister.submit(self.packed_plan, parts[i + LIST_AHEAD]))
                    if i and self.options.max_keys_per_sec:
                        collect(i - 1)  # throttled: one wave at a time
                    self.announce(plan)
                    trip = max(trip, self.trip_timeout(plan))  # the longest MIGRATE of the waves in flight
                    link.settimeout(trip)
                    link.send(packed)
                    plans[i] = plan
                    if i and not self.options.max_keys_per_sec:
                        collect(i - 1)  # its replies read while this wave is queued behind it
                for i in sorted(plans):
                    collect(i)
                link.settimeout(self.session.engine_timeout)  # back in the pool as it came out
            for done in closing:
                done.result()
            failed = False
            if stopped_at is not None:
                at, request = stopped_at
                raise stop.Stopped(request.signum, f"moved {sum(sizes[:at])} of {len(slots)} slots from "
                                   f"{self.source.name} to {self.target.name}; every slot it opened is closed "
                                   "(journaled)", request.hint)
        finally:
            if failed or stopped_at is not None:  # what runs ends, what waits is dropped: no wave opens after
                # this; the waves that opened stay journaled
                stopped.set()
                for pool in (behind, opener, lister):
                    pool.shutdown(wait=False, cancel_futures=True)
                behind.shutdown(wait=True)
                for wave_closed in (f for f in closed if not f.done()):
                    wave_closed.set_exception(OpsctlError("the move stopped before this wave closed"))
            for pool in (behind, opener, lister):
                pool.shutdown(wait=True)

    def packed_plan(self, wave: Sequence[int]) -> tuple[Plan, bytes]:
        """The wave's keys and MIGRATE batches, read ahead (before or while it opens), and their commands packed."""
        plan = self.prepare(wave)
        return plan, self.source.handle.packed([self.command(b) for _, b in plan])

    def admit(self, wave: Sequence[int]) -> None:
        """The wave journaled (fsync), then opened. The look at both ends that opening starts with runs while
        the journal line is written: it only reads."""
        check_held(self.session.connector)  # a lost topology lock stops before opening more slots
        journaled = self.session.pool.submit(self.journal.opened, self.source.name, self.source.id,
                                             self.target.name, self.target.id, wave)
        try:
            self.ensure_endpoints()
        except BaseException:
            wait([journaled])  # the line is written (or not) before the error goes up
            raise
        journaled.result()
        self.open(wave, looked=True)

    def finish(self, wave: Sequence[int]) -> None:
        self.drain(wave)
        self.close(wave)
        self.journal.closed(wave)
        self.progress.add(slots=len(wave))

    def prepare(self, wave: Sequence[int]) -> Plan:
        """The wave's keys and their MIGRATE batches, read ahead: only a head start (see drain)."""
        return self.plan(self.listed(wave))

    def listed(self, slots: Sequence[int]) -> Work:
        """Each non-empty slot's keys (at most fetch_keys) with their sizes (read-only both: they run with the
        source at maxmemory too). Up to LISTING_LINKS connections each take a share of the slots: GETKEYSINSLOT
        for each in one round trip, then MEMORY USAGE of every key found, packed in one buffer."""
        links = max(1, min(LISTING_LINKS, len(slots) // LISTING_PART))
        if links == 1:
            return self._listed_share(slots)
        found: Work = {}
        for share in fan_out(self._listed_share, [slots[at::links] for at in range(links)]):
            found.update(share)
        return {slot: found[slot] for slot in slots if slot in found}

    def _listed_share(self, slots: Sequence[int]) -> Work:
        found = self.fetch(slots)
        replies: list[int | None] = keyed(self.source, "MEMORY", "USAGE", [k for keys in found.values() for k in keys])
        if any(issubclass(kind, Exception) for kind in set(map(type, replies))):  # rare: the check runs in C
            replies = [None if isinstance(v, Exception) else v for v in replies]
        out: Work = {}
        at = 0
        for slot, keys in found.items():
            out[slot] = (keys, replies[at:at + len(keys)])
            at += len(keys)
        return out

    def fetch(self, slots: Sequence[int]) -> dict[int, list[bytes]]:
        replies = checked(self.source, [("CLUSTER", "GETKEYSINSLOT", s, self.options.fetch_keys) for s in slots],
                          "GETKEYSINSLOT")
        return {s: list(r) for s, r in zip(slots, replies, strict=True) if r}

    def open(self, wave: Sequence[int], looked: bool = False) -> None:
        """IMPORTING on the target, then MIGRATING on the source, once both ends answer as their shards'
        masters (looked: the caller just made sure)."""
        if not looked:
            self.ensure_endpoints()
        # never re-open a slot the target serves (a source failed over mid-move may still claim it): the server
        # refuses it ("already the owner"); its keys left on the source move all the same, under MIGRATING
        self.control(self.target, [("CLUSTER", "SETSLOT", s, "IMPORTING", self.source.id) for s in wave
                                   if s not in self.target_serves], "SETSLOT IMPORTING")
        self.control(self.source, [("CLUSTER", "SETSLOT", s, "MIGRATING", self.target.id) for s in wave],
                     "SETSLOT MIGRATING")

    def close(self, wave: Sequence[int]) -> None:
        """The new owner first (target, then source), then every other master, in parallel; only once both
        ends answer and are still their shards' masters (a stalled node runs queued commands when it wakes,
        before it learns it was replaced). Looked at again after: a failover in between is followed."""
        self.ensure_endpoints()
        commands: list[Command] = [("CLUSTER", "SETSLOT", s, "NODE", self.target.id) for s in wave]
        self.control(self.target, commands, "SETSLOT NODE")
        self.control(self.source, commands, "SETSLOT NODE")
        self.session.parallel(lambda p: checked(p, commands, "SETSLOT NODE"), self.others)
        self.ensure_endpoints()

    def control(self, peer: Peer, commands: Sequence[Command], doing: str) -> None:
        """SETSLOT on one end; refused because an end was failed over meanwhile ("not a master"): that is
        EndpointReplaced (followed), not a dead end."""
        try:
            checked(peer, commands, doing)
        except OpsctlError:
            self.ensure_endpoints()
            raise

    def drain(self, wave: Sequence[int]) -> None:
        """Fetch and move until every slot of the (open) wave is empty on the source."""
        pending = list(wave)
        failed_rounds = 0
        failing_since = 0.0
        patience = 3 * self.node_timeout_ms / 1000 + 5  # e.g. CLUSTERDOWN while a failover settles
        while pending:
            work = self.listed(pending)
            if not work:
                return
            if self.send(self.plan(work)):
                failed_rounds = 0
            else:
                failed_rounds += 1
                failing_since = failing_since if failed_rounds > 1 else time.monotonic()
            if failed_rounds >= MAX_FAILED_ROUNDS and time.monotonic() - failing_since >= patience:
                raise OpsctlError(f"MIGRATE from {self.source.name} to {self.target.name} keeps failing",
                                  f"{failed_rounds} rounds in a row over {time.monotonic() - failing_since:.0f}s; "
                                  f"last: {self.last_error}", "look at both nodes' logs; `opsctl cluster fix -f SPEC` "
                                  "finishes the open slots once the cause is gone")
            if failed_rounds:
                self.ensure_endpoints()
                time.sleep(backoff(failed_rounds, 0.1, 2.0))
            pending = list(work)

    last_error = ""

    def probe(self, peer: Peer) -> list[ClusterNodeLine] | None:
        """The node's CLUSTER NODES on a connection of its own with a short timeout (never behind a command
        stuck on the engine's connection); None when it does not answer in time."""
        timeout = max(0.2, min(1.0, self.node_timeout_ms / 4000))
        try:
            reply = self.session.probe(peer.node, timeout).texts([("CLUSTER", "NODES")])[0]
        except NodeUnreachable:
            return None
        return parse_cluster_nodes(reply) if isinstance(reply, str) else None

    def ensure_endpoints(self) -> None:
        """Return once source and target both answer and are their shards' masters as each other sees them.
        While one is down and nobody replaced it, wait (doubling pauses, bounded by a few node timeouts);
        EndpointReplaced when the cluster promoted another node of its shard."""
        patience = 3 * self.node_timeout_ms / 1000 + 5
        failed = itertools.count(1)
        pauses = (backoff(attempt, 0.05, 1.0) for attempt in itertools.count(1))

        def up() -> bool | Pending:
            role = self._down_end()
            if role is None:
                return True
            peer = self.source if role == "source" else self.target
            if next(failed) == 1:
                self.emit(EndpointDown(role, peer.name))
            return Pending(f"the {role} {peer.name} ({peer.node.endpoint})")

        wait_for(up, patience, "both ends of the move to answer", lambda: next(pauses),
                 on_timeout=lambda down: OpsctlError(
                     f"{down} stopped answering in the middle of a slot move",
                     f"for {patience:.0f}s, and the cluster did not fail it over; the open slots are journaled",
                     "once it answers again (or its replica is promoted), run `opsctl cluster fix -f SPEC`: it "
                     "finishes the move"))

    def _down_end(self) -> str | None:
        """The end ("source" or "target") that does not answer, None when both answer as their shards' masters;
        EndpointReplaced when the cluster promoted another node of an end's shard."""
        src_view, tgt_view = self.session.parallel(self.probe, [self.source, self.target])
        mine = myself(tgt_view or [])
        # the ranges expanded in C: a look runs three times a wave, at a target that may serve 16384 slots
        self.target_serves = frozenset(itertools.chain.from_iterable(range(a, b + 1) for a, b in mine.slots)
                                       if mine else ())
        ends = {"source": self.source, "target": self.target}
        states = {"source": verdict(self.source.node.endpoint, src_view, tgt_view, self._shard(self.source)),
                  "target": verdict(self.target.node.endpoint, tgt_view, src_view, self._shard(self.target))}
        for role, state in states.items():
            if state == REPLACED:
                raise EndpointReplaced(role, ends[role].name)
        if all(state == OK for state in states.values()):
            return None
        return next(r for r, state in states.items() if state == DOWN)

    def _shard(self, peer: Peer) -> set[str]:
        """The endpoints of peer's shard, without the move's other end (a merge moves within one shard)."""
        names = set(shard_members(self.session.loaded, peer.name)) - {self.source.name, self.target.name}
        return {n.endpoint for n in self.session.nodes if n.name in names}

    def plan(self, work: Work) -> Plan:
        return [(slot, b) for slot, (keys, sizes) in work.items() for b in batches(keys, sizes, base_ms=self.base_ms)]

    def send(self, plan: Plan) -> bool:
        """Report big keys, then stream every MIGRATE batch on one connection. False if any failed."""
        self.announce(plan)
        return self.received(plan, stream(self.source, [self.command(b) for _, b in plan],
                                          timeout=self.trip_timeout(plan)))

    def trip_timeout(self, plan: Plan) -> float:
        """Each reply's wait on a stream of plan's MIGRATEs (never the 300 s that outlasted a split)."""
        return trip_timeout_s([b.timeout_ms for _, b in plan], self.node_timeout_ms)

    def announce(self, plan: Plan) -> None:
        """Big keys are reported before they travel."""
        for slot, batch in plan:
            if batch.big:
                self.emit(BigKey(slot, batch.keys[0].decode(errors="replace"), batch.size, batch.timeout_ms))

    def received(self, plan: Plan, replies: Sequence[object]) -> bool:
        """Count what moved, handle what failed (False if any did), then keep to --max-keys-per-sec."""
        ok = True
        for (slot, batch), reply in zip(plan, replies, strict=True):
            if isinstance(reply, Exception):
                ok = self.failed(slot, batch, reply) and ok
            else:
                with self._moved_lock:
                    self.moved += len(batch.keys)
                self.progress.add(keys=len(batch.keys), size=batch.size)
        self.throttle()
        return ok

    def command(self, batch: Batch, replace: bool = False) -> Command:
        target = self.target.node
        extra = ("REPLACE",) if replace else ()
        return ("MIGRATE", target.address, target.port, "", 0, batch.timeout_ms, *extra, *self.auth,
                "KEYS", *batch.keys)

    def failed(self, slot: int, batch: Batch, error: Exception) -> bool:
        self.last_error = f"slot {slot}: {error}"
        if "BUSYKEY" not in str(error):
            self.emit(MigrateRetry(slot, len(batch.keys), str(error)))
            return False
        for key in batch.keys:
            self.busy(slot, key)
        return True

    def busy(self, slot: int, key: bytes) -> None:
        """The target already has the key (e.g. a MIGRATE that timed out but arrived): REPLACE only if equal."""
        single = Batch((key,), 0, timeout_ms(0, self.base_ms))
        reply = pipe(self.source, [self.command(single)])[0]
        if not isinstance(reply, Exception):
            self.progress.add(keys=1)
            return
        if "BUSYKEY" not in str(reply):
            raise OpsctlError(f"MIGRATE of one key of slot {slot} failed", str(reply))
        mine = pipe(self.source, [("DUMP", key)])[0]
        theirs = pipe(self.target, [("ASKING",), ("DUMP", key)])[1]
        label = key.decode(errors="replace")
        if mine is not None and mine != theirs:
            raise RefusedError(f"key {label!r} of slot {slot} exists on {self.source.name} and on "
                               f"{self.target.name} with different values",
                               "replacing either copy would lose data; the slot stays open (journaled)",
                               "compare both copies, delete the wrong one, then run `opsctl cluster fix -f SPEC`")
        self.emit(BusyKeyEqual(slot, label))
        checked(self.source, [self.command(single, replace=True)], "MIGRATE REPLACE")
        self.progress.add(keys=1)

    def throttle(self) -> None:
        delay = rate_delay(self.moved, time.monotonic() - self.started, self.options.max_keys_per_sec)
        if delay > 0:
            time.sleep(delay)

