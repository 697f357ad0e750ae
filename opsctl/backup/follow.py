"""The continuous archive following the fleet `apply` changes: the spec placed again from the nodes' records every
few seconds (as every command places it), so a master placed since the start is found; a change of the deployed
shards (a scale-out, a scale-in) or of a cluster's slots (a reshard, a rebalance: slots open or owned otherwise than
at the base) is recorded in the base (changed.json: it serves a restore only up to the last look that still found
its shards and slots) and answered with a new base (docs/backup.md, "Point-in-time recovery").

Why slots too: a key moved between two archived shards is the target's RESTORE in one stream and the source's DEL in
another, each timed when the archiver read it; a restore cut between the two reads would hold neither."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import ClassVar

from opsctl.backup.manifest import MANIFEST, parse_manifest
from opsctl.backup.store import Store
from opsctl.backup.timeline import CHANGED, Base, Changed, changed_json, iso
from opsctl.base.errors import OpsctlError
from opsctl.base.events import Emit, Event, Note, Redrawn, human_bytes, plural
from opsctl.base.frozen import Frozen, frozen
from opsctl.base.stop import Stopped
from opsctl.net.connector import Connector
from opsctl.net.fanout import shared_pool
from opsctl.observe.replies import ClusterNodeLine
from opsctl.spec.load import LoadedSpec


@frozen
class SegmentArchived(Frozen, Event):
    """A segment of a shard's replication stream is durable in the store (continuous archive). first/last: when its
    first and last command were read; durable: when the store confirmed it (all unix times)."""

    kind: ClassVar[str] = "segment-archived"
    redrawn: ClassVar[Redrawn] = "bar-only"
    shard: int
    name: str
    start: int
    end: int
    entries: int
    bytes: int
    first: float
    last: float
    durable: float

    def line(self) -> str:
        return (f"shard {self.shard}: {self.entries} commands archived (offsets {self.start}..{self.end}, "
                f"{human_bytes(self.bytes)}), {self.durable - self.first:.2f}s after the first was read")


@frozen
class ArchiveProgress(Frozen, Event):
    """The continuous archive is alive: since its base, `segments` stored holding `bytes`; shards: each shard's
    offset archived up to. Said every second, also when no write comes (a heartbeat off a terminal)."""

    kind: ClassVar[str] = "archive-progress"
    redrawn: ClassVar[Redrawn] = "bar"
    base: str
    segments: int
    bytes: int
    shards: Mapping[int, int]

    def line(self) -> str:
        offsets = ", ".join(f"shard {shard} at offset {offset}" for shard, offset in sorted(self.shards.items()))
        return (f"archiving base {self.base}: {plural(self.segments, 'segment')} ({human_bytes(self.bytes)}) stored; "
                f"{offsets}")


@frozen
class ArchiveStopped(Frozen, Event):
    """backup --continuous was stopped as a service is (SIGTERM, SIGINT): a normal end, its last line."""

    kind: ClassVar[str] = "archive-stopped"
    signal: str
    detail: str

    def line(self) -> str:
        return f"the continuous archive stopped on {self.signal}: {self.detail}"


FOLLOW_EVERY = 2.0  # s between looks at the records: a new shard's nodes are recorded before any write reaches it
HURRIED = 0.5  # s between looks while a link waits for its master (it may be on a node placed since)
RETRY_BASE = 5.0  # s between tries of a new base the changed shards ask for (an apply holds the topology lock)

SLOTS = 16384
# The spec read again and placed from the records as they are now, and the names of the nodes deployed.
Placer = Callable[[], tuple[LoadedSpec, frozenset[str]]]
SlotMap = dict[int, tuple[tuple[int, int], ...]]  # shard -> the slot ranges its master serves
MOVING = "moving"  # slots open (migrating, importing) somewhere: a reshard under way
Look = tuple[LoadedSpec, frozenset[str], SlotMap | str | None]


def deployed_shards(loaded: LoadedSpec, deployed: frozenset[str]) -> frozenset[int]:
    """The shards the archive must hold: a cluster's shards with a member deployed (one the spec names but apply
    did not deploy yet holds nothing); every shard of another topology (one, placed by the spec)."""
    shards = loaded.layout.shards
    if loaded.spec.topology != "cluster":
        return frozenset(s.index for s in shards)
    return frozenset(s.index for s in shards if any(name in deployed for name in s.members))


def slot_map(loaded: LoadedSpec, views: Mapping[str, Sequence[ClusterNodeLine] | None]) -> SlotMap | str | None:
    """Each shard's slots as its master says on its own CLUSTER NODES line (views: by node name); MOVING while a
    node has a slot open; None while that is not known whole (a master down, two claiming one shard)."""
    out: SlotMap = {}
    for name, lines in views.items():
        me = next((line for line in lines or () if line.is_myself), None)
        if me is None:
            continue
        if me.migrating or me.importing:
            return MOVING
        shard = loaded.layout.shard_of(name)
        if me.is_master and me.slots and shard is not None:
            if shard.index in out:
                return None
            out[shard.index] = tuple(sorted(me.slots))
    covered = sum(end - start + 1 for ranges in out.values() for start, end in ranges)
    return out if covered == SLOTS else None


def _slots_now(place: Placer, connector: Connector) -> Look | OpsctlError:
    """One look (in the background): the fleet placed, and a cluster's slots as its masters serve them."""
    try:
        loaded, deployed = place()
    except OpsctlError as exc:
        return exc
    if loaded.spec.topology != "cluster":
        return loaded, deployed, None
    from opsctl.net.observer import observe  # a client library: clusters only

    seen = observe(connector, loaded.layout.servers)
    return loaded, deployed, slot_map(loaded, {name: o.cluster_nodes for name, o in seen.items()})


class Fleet:
    """What the archiver archives now: connector.loaded placed again every FOLLOW_EVERY s (place None: never, the
    nodes placed at the start), the deployed shards, and since when they are the current base's."""

    def __init__(self, connector: Connector, place: Placer | None, emit: Emit) -> None:
        self.connector, self.place, self.emit = connector, place, emit
        self.shards: frozenset[int] | None = None  # at the last look; None: never looked
        self.base: Base | None = None
        self.agreed = 0.0  # the last look (wall clock, when it began) that found the base's shards and slots
        self.marked = ""  # the base whose change is recorded
        self.next_look = self.started = 0.0  # monotonic: when the next look is due, when the last began
        self.looking: Future[Look | OpsctlError] | None = None  # a look under way
        self.began = 0.0  # when it began (wall clock)
        self.slots: SlotMap | str | None = None  # at the last look (a cluster's; MOVING, None: unknown or none)
        self.seen = 0.0  # when the last look whose outcome was taken began (wall clock)
        self.base_slots: SlotMap | None = None  # the base's, from its manifest
        self.said = ""

    def hurry(self) -> None:
        """A link broke or waits for its master: the next look comes sooner (HURRIED after the last began)."""
        self.next_look = min(self.next_look, self.started + HURRIED)

    def look(self, now: bool = False) -> None:
        """The fleet placed again when due, in the background (the records may be read over SSH, the cluster
        asked who serves: the streams are read meanwhile), its outcome taken at a later call; now: at once, here.
        A spec or record that cannot be read (being edited, a host not answering) is said once and the placement
        before is kept."""
        if self.place is None:
            return
        if now:
            self.began = time.time()
            self._placed(self.began, _slots_now(self.place, self.connector))
            return
        if self.looking is not None:
            if self.looking.done():
                self._placed(self.began, self.looking.result())
                self.looking = None
            return
        if time.monotonic() >= self.next_look:
            self.started, self.began = time.monotonic(), time.time()
            self.next_look = self.started + FOLLOW_EVERY
            self.looking = shared_pool().submit(_slots_now, self.place, self.connector)

    def _placed(self, began: float, found: Look | OpsctlError) -> None:
        if isinstance(found, OpsctlError):
            if found.summary != self.said:
                self.emit(Note(f"the fleet could not be placed again ({found.summary}); archiving the nodes placed "
                               "before, looking again"))
            self.said = found.summary
            return
        loaded, deployed, slots = found
        self.said, self.seen = "", began
        self.connector.loaded = loaded
        self.shards = deployed_shards(loaded, deployed)
        self.slots = slots
        if self.base is not None and self.shards == frozenset(self.base.positions) and not self._slots_moved(True):
            self.agreed = max(self.agreed, began)  # a look begun before the base was taken says nothing earlier

    def _slots_moved(self, unknown: bool) -> bool:
        """Whether the slots moved since the base (a cluster's); unknown: the answer while it cannot be told."""
        if self.slots == MOVING:
            return True
        if self.base_slots is None:
            return False
        if not isinstance(self.slots, dict):
            return unknown
        return self.slots != self.base_slots

    def follow(self, base: Base, store: Store) -> None:
        """base is archived from now on, its slots its manifest's: it serves from its time while the last look
        found its shards (a base taken while they changed, without the topology lock, serves no time: its
        changed.json says so at the next look)."""
        again = self.base is not None and self.base.name == base.name  # resumed: the start's look agreed since
        agrees = self.shards is None or self.shards == frozenset(base.positions)
        self.agreed = max(base.taken, self.agreed if again else 0.0) if agrees else base.taken - 0.001
        self.base, self.base_slots = base, None
        if self.connector.loaded.spec.topology == "cluster":  # the slots each shard's file holds
            data = store.get_bytes(f"{base.name}/{MANIFEST}")
            try:
                manifest = parse_manifest((data or b"").decode("utf-8", "replace"), store.where(base.name))
            except Stopped:
                raise  # a stop request, not a damaged manifest
            except OpsctlError:
                return  # a damaged manifest: its slots unknown (a restore of that base refuses it by name)
            self.base_slots = {shard.shard: tuple(sorted(shard.slots)) for shard in manifest.shards}

    def differs(self, base: Base, store: Store, masters: Callable[[], frozenset[int]]) -> str | None:
        """At the start: how the fleet now differs from the newest base (its shards; a cluster's slots, moved
        while no archiver looked), None when it does not. masters: the shards with a master now, for an archiver
        that does not place again (a spec from stdin)."""
        self.follow(base, store)
        shards = self.shards if self.shards is not None else masters()
        if shards != frozenset(base.positions):
            return f"has shards {sorted(base.positions)}, the topology {sorted(shards)} now"
        if self._slots_moved(False):
            return "has other slots than the cluster's now"
        self.agreed = max(self.agreed, self.began)  # the look at the start found the resumed base's shards and slots
        return None

    def changed(self, store: Store) -> bool:
        """Whether the deployed shards (or a cluster's slots) differ from the base's: the first time, changed.json
        written into the base (a restore after its `until` is refused, never served without a shard's writes) and
        said."""
        if self.base is None or self.shards is None or self.seen < self.base.taken or (
                self.shards == frozenset(self.base.positions) and not self._slots_moved(False)):
            return False  # a look begun before the base was taken tells nothing about it (a slow look, mid-reshard)
        if self.marked != self.base.name:
            change = Changed(self.agreed, time.time(), tuple(sorted(self.base.positions)), tuple(sorted(self.shards)))
            try:
                store.put_bytes(f"{self.base.name}/{CHANGED}", changed_json(change).encode())
            except Stopped:
                raise
            except (OpsctlError, OSError):
                return True  # tried again at the next look; the failing store is said by the segments' writes
            self.marked = self.base.name
            self.emit(Note(f"the topology changed ({change.text()}): base {self.base.name} serves a restore up "
                           f"to {iso(change.until)}; taking a new base"))
        return True
