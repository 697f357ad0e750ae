"""Key-by-key slot migration, for servers without atomic migration. I/O shell around opsctl.slots.batching.

Per wave of slots, every control step is one pipelined round trip per node (not 5 + masters round trips per
slot): the keys listed and sized (GETKEYSINSLOT, then MEMORY USAGE), IMPORTING on the target, MIGRATING on the source,
the MIGRATE batches, then the drain, SETSLOT NODE on the target, the source, and every other master in parallel.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from opsctl.errors import OpsctlError, RefusedError
from opsctl.events import BigKey, BusyKeyEqual, Emit, EndpointDown, MigrateRetry
from opsctl.observe.collect import Command
from opsctl.observe.parse import ClusterNodeLine, parse_cluster_nodes
from opsctl.rawpipe import PIPE_ERRORS
from opsctl.slots.batching import Batch, backoff, base_timeout_ms, batches, rate_delay, timeout_ms, waves
from opsctl.slots.endpoints import DOWN, OK, REPLACED, flagged_ids, verdict
from opsctl.slots.journal import Journal
from opsctl.slots.progress import Progress
from opsctl.slots.scale import shard_members
from opsctl.slots.session import Peer, Session, checked, keyed, packed_commands, pipe, sent, stream
from opsctl.topolock import check_held

WAVE_SLOTS = 512
FIRST_WAVE = 16  # the source waits while the first wave is listed and opened: keep it short
FETCH_KEYS = 1000
# The waves listed and sized ahead of the one moving: listing competes with MIGRATE for the source's turns,
# so one wave ahead fell behind a wave of half the size moving (the first waves double).
LIST_AHEAD = 2
OPEN_WAVES = 3  # behind (closing), moving, ahead
MAX_FAILED_ROUNDS = 5
Plan = list[tuple[int, Batch]]
Work = dict[int, tuple[list[bytes], list[int | None]]]  # slot -> its keys and their sizes
# Connections a wave's MEMORY USAGE is spread over. The source reads 16 KB of each client's commands per turn of
# its event loop: one stream of MEMORY USAGE (~35 bytes a key) got ~450 keys sized per turn while the MIGRATE
# stream moved ~1200, and fell behind it; four keep ahead. (A Lua script that sizes a whole slot per call keeps
# ahead on one connection but costs the single-threaded source ~60% more CPU per key than the plain commands.)
SIZING_LINKS = 4
SIZING_PART = 256  # keys per connection at least (a connection gets ~450 sized per turn of the source)


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
        self._moved_lock = threading.Lock()

    def move(self, slots: Sequence[int]) -> None:
        """Wave by wave, so that the source never waits for opsctl between waves. Four things run at once,
        each on its own connections: the keys of the next LIST_AHEAD waves are listed and sized (`packed_plan`),
        the next wave is journaled and opened (`admit`), one wave's MIGRATE batches stream (`send`) and the waves
        before are drained and closed (`finish`). Keys listed before (or while) their slot opened are only a
        head start: `drain`, once MIGRATING is set, lists again until the slot is empty, so keys written
        meanwhile move too. At most OPEN_WAVES waves are open at once, each journaled before it opens; each
        slot keeps its own order."""
        try:
            self._move(slots)
        except PIPE_ERRORS as exc:
            self.ensure_endpoints()  # raises EndpointReplaced, or a clear error when one stays down
            raise OpsctlError(f"lost the connection to a node while moving slots {self.source.name} -> "
                              f"{self.target.name}", f"{type(exc).__name__}: {exc}",
                              "both answer again: run the same command again or `opsctl cluster fix -f SPEC`; "
                              "the open slots are journaled") from None

    def _move(self, slots: Sequence[int]) -> None:
        parts = waves(slots, self.options.first_wave, self.options.wave_slots)
        lister, opener, behind = (ThreadPoolExecutor(max_workers=1) for _ in range(3))
        listed: list[Future[tuple[Plan, bytes]]] = []
        finished: list[Future[None]] = []

        def admitted(i: int) -> None:
            if i >= OPEN_WAVES:
                finished[i - OPEN_WAVES].result()  # at most OPEN_WAVES waves open at once
            self.admit(parts[i])

        failed = True
        try:
            listed.extend(lister.submit(self.packed_plan, wave) for wave in parts[:LIST_AHEAD])
            opening = opener.submit(admitted, 0) if parts else None
            for i, wave in enumerate(parts):
                assert opening is not None
                opening.result()
                plan, packed = listed[i].result()
                if i + LIST_AHEAD < len(parts):
                    listed.append(lister.submit(self.packed_plan, parts[i + LIST_AHEAD]))
                opening = opener.submit(admitted, i + 1) if i + 1 < len(parts) else None
                self.send(plan, packed)
                finished.append(behind.submit(self.finish, wave))
                for done in (f for f in finished if f.done()):
                    done.result()  # a wave that failed to close stops the run before more move
            for closing in finished:
                closing.result()
            failed = False
        finally:  # after a failure what runs ends and what waits is dropped first (a wave waiting to open
            # behind a dropped close never opens); opened waves stay journaled
            for pool in (behind, opener, lister):
                pool.shutdown(wait=False, cancel_futures=failed)
            for pool in (behind, opener, lister):
                pool.shutdown(wait=True)

    def packed_plan(self, wave: Sequence[int]) -> tuple[Plan, bytes]:
        """The wave's keys and MIGRATE batches, read before it opens, and their commands packed."""
        plan = self.prepare(wave)
        return plan, packed_commands(self.source, [self.command(b) for _, b in plan])

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
        """The wave's keys and their MIGRATE batches, read before the wave opens."""
        return self.plan(self.listed(wave))

    def listed(self, slots: Sequence[int]) -> Work:
        """Each non-empty slot's keys (at most fetch_keys) with their sizes: GETKEYSINSLOT for every slot in one
        round trip, then MEMORY USAGE of every key found (read-only both: they run with the source at
        maxmemory too)."""
        found = self.fetch(slots)
        sizes = self.sizes(found)
        return {slot: (keys, sizes[slot]) for slot, keys in found.items()}

    def fetch(self, slots: Sequence[int]) -> dict[int, list[bytes]]:
        replies = checked(self.source, [("CLUSTER", "GETKEYSINSLOT", s, self.options.fetch_keys) for s in slots],
                          "GETKEYSINSLOT")
        return {s: list(r) for s, r in zip(slots, replies, strict=True) if r}

    def open(self, wave: Sequence[int], looked: bool = False) -> None:
        """IMPORTING on the target, then MIGRATING on the source, once both ends answer as their shards'
        masters (looked: the caller just made sure)."""
        if not looked:
            self.ensure_endpoints()
        self.control(self.target, [("CLUSTER", "SETSLOT", s, "IMPORTING", self.source.id) for s in wave],
                     "SETSLOT IMPORTING")
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
            reply = self.session.probe(peer.node, timeout).pipeline([("CLUSTER", "NODES")])[0]
        except PIPE_ERRORS:
            return None
        return parse_cluster_nodes(reply) if isinstance(reply, str) else None

    def ensure_endpoints(self) -> None:
        """Return once source and target both answer and are their shards' masters as each other sees them.
        While one is down and nobody replaced it, wait (doubling pauses, bounded by a few node timeouts);
        EndpointReplaced when the cluster promoted another node of its shard."""
        patience = 3 * self.node_timeout_ms / 1000 + 5
        deadline = time.monotonic() + patience
        attempt = 0
        ends = {"source": self.source, "target": self.target}
        while True:
            src_view, tgt_view = self.session.parallel(self.probe, [self.source, self.target])
            states = {"source": verdict(self.source.node.endpoint, src_view, tgt_view, self._shard(self.source)),
                      "target": verdict(self.target.node.endpoint, tgt_view, src_view, self._shard(self.target))}
            for role, state in states.items():
                if state == REPLACED:
                    raise EndpointReplaced(role, ends[role].name)
            if all(state == OK for state in states.values()):
                return
            role = next(r for r, state in states.items() if state == DOWN)
            peer = ends[role]
            if time.monotonic() >= deadline:
                raise OpsctlError(f"the {role} {peer.name} ({peer.node.endpoint}) stopped answering in the middle "
                                  "of a slot move", f"for {patience:.0f}s, and the cluster did not fail it over; "
                                  "the open slots are journaled",
                                  "once it answers again (or its replica is promoted), run `opsctl cluster fix "
                                  "-f SPEC`: it finishes the move")
            attempt += 1
            if attempt == 1:
                self.emit(EndpointDown(role, peer.name))
            time.sleep(backoff(attempt, 0.05, 1.0))

    def _shard(self, peer: Peer) -> set[str]:
        """The endpoints of peer's shard, without the move's other end (a merge moves within one shard)."""
        names = set(shard_members(self.session.loaded, peer.name)) - {self.source.name, self.target.name}
        return {n.endpoint for n in self.session.nodes if n.name in names}

    def plan(self, work: Work) -> Plan:
        return [(slot, b) for slot, (keys, sizes) in work.items() for b in batches(keys, sizes, base_ms=self.base_ms)]

    def sizes(self, work: dict[int, list[bytes]]) -> dict[int, list[int | None]]:
        """Bytes per key (None: vanished, or no longer here): MEMORY USAGE of every key, packed in one buffer
        per connection, over up to SIZING_LINKS connections at once."""
        flat = [k for keys in work.values() for k in keys]
        links = max(1, min(SIZING_LINKS, len(flat) // SIZING_PART))
        step = max(1, -(-len(flat) // links))
        parts = [flat[at:at + step] for at in range(0, len(flat), step)]
        if len(parts) > 1:
            with ThreadPoolExecutor(len(parts)) as pool:
                replies = [r for part in pool.map(lambda ks: keyed(self.source, "MEMORY", "USAGE", ks), parts)
                           for r in part]
        else:
            replies = keyed(self.source, "MEMORY", "USAGE", flat)
        out: dict[int, list[int | None]] = {}
        at = 0
        for slot, keys in work.items():
            out[slot] = [None if isinstance(v, Exception) else v for v in replies[at:at + len(keys)]]
            at += len(keys)
        return out

    def send(self, plan: Plan, packed: bytes | None = None) -> bool:
        """Report big keys, then send every MIGRATE batch on one connection: packed ahead (a wave's, in one
        write: the source never waits for this process between two of them, however busy the machine), else
        streamed as packed. False if any failed."""
        for slot, batch in plan:
            if batch.big:
                self.emit(BigKey(slot, batch.keys[0].decode(errors="replace"), batch.size, batch.timeout_ms))
        replies = (sent(self.source, packed, len(plan)) if packed is not None
                   else stream(self.source, [self.command(b) for _, b in plan]))
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

