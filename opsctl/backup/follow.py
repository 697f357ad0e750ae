"""The continuous archive following the fleet `apply` changes: the spec placed again from the nodes' records every
few seconds (as every command places it), so a master placed since the start is found; a change of the deployed
shards (a scale-out, a scale-in) is recorded in the base (changed.json: it serves a restore only up to the last look
that still found its shards) and answered with a new base (docs/backup.md, "Point-in-time recovery")."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future

from opsctl.backup.store import Store
from opsctl.backup.timeline import CHANGED, Base, Changed, changed_json, iso
from opsctl.base.errors import OpsctlError
from opsctl.base.events import Emit, Note
from opsctl.net.connector import Connector
from opsctl.net.fanout import shared_pool
from opsctl.spec.load import LoadedSpec

FOLLOW_EVERY = 2.0  # s between looks at the records: a new shard's nodes are recorded before any write reaches it
RETRY_BASE = 5.0  # s between tries of a new base the changed shards ask for (an apply holds the topology lock)

# The spec read again and placed from the records as they are now, and the names of the nodes deployed.
Placer = Callable[[], tuple[LoadedSpec, frozenset[str]]]


def deployed_shards(loaded: LoadedSpec, deployed: frozenset[str]) -> frozenset[int]:
    """The shards the archive must hold: a cluster's shards with a member deployed (one the spec names but apply
    did not deploy yet holds nothing); every shard of another topology (one, placed by the spec)."""
    shards = loaded.layout.shards
    if loaded.spec.topology != "cluster":
        return frozenset(s.index for s in shards)
    return frozenset(s.index for s in shards if any(name in deployed for name in s.members))


class Fleet:
    """What the archiver archives now: connector.loaded placed again every FOLLOW_EVERY s (place None: never, the
    nodes placed at the start), the deployed shards, and since when they are the current base's."""

    def __init__(self, connector: Connector, place: Placer | None, emit: Emit) -> None:
        self.connector, self.place, self.emit = connector, place, emit
        self.shards: frozenset[int] | None = None  # at the last look; None: never looked
        self.base: Base | None = None
        self.agreed = 0.0  # the last look (wall clock, when it began) that found the base's shards
        self.marked = ""  # the base whose change is recorded
        self.next_look = 0.0
        self.looking: Future[tuple[LoadedSpec, frozenset[str]] | OpsctlError] | None = None  # a look under way
        self.began = 0.0  # when it began (wall clock)
        self.said = ""

    def look(self, now: bool = False) -> None:
        """The fleet placed again when due, in the background (the records may be read over SSH, the cluster
        asked who serves: the streams are read meanwhile), its outcome taken at a later call; now: at once, here.
        A spec or record that cannot be read (being edited, a host not answering) is said once and the placement
        before is kept."""
        if self.place is None:
            return
        if now:
            self._placed(time.time(), self._try(self.place))
            return
        if self.looking is not None:
            if self.looking.done():
                self._placed(self.began, self.looking.result())
                self.looking = None
            return
        if time.monotonic() >= self.next_look:
            self.next_look, self.began = time.monotonic() + FOLLOW_EVERY, time.time()
            self.looking = shared_pool().submit(self._try, self.place)

    @staticmethod
    def _try(place: Placer) -> tuple[LoadedSpec, frozenset[str]] | OpsctlError:
        try:
            return place()
        except OpsctlError as exc:
            return exc

    def _placed(self, began: float, found: tuple[LoadedSpec, frozenset[str]] | OpsctlError) -> None:
        if isinstance(found, OpsctlError):
            if found.summary != self.said:
                self.emit(Note(f"the fleet could not be placed again ({found.summary}); archiving the nodes placed "
                               "before, looking again"))
            self.said = found.summary
            return
        loaded, deployed = found
        self.said = ""
        self.connector.loaded = loaded
        self.shards = deployed_shards(loaded, deployed)
        if self.base is not None and self.shards == frozenset(self.base.positions):
            self.agreed = began

    def follow(self, base: Base) -> None:
        """base is archived from now on: its shards are the ones deployed at its time."""
        self.base, self.agreed = base, max(self.agreed, base.taken)

    def changed(self, store: Store) -> bool:
        """Whether the deployed shards differ from the base's: the first time, changed.json written into the base
        (a restore after its `until` is refused, never served without a new shard's writes) and said."""
        if self.base is None or self.shards is None or self.shards == frozenset(self.base.positions):
            return False
        if self.marked != self.base.name:
            change = Changed(self.agreed, time.time(), tuple(sorted(self.base.positions)), tuple(sorted(self.shards)))
            try:
                store.put_bytes(f"{self.base.name}/{CHANGED}", changed_json(change).encode())
            except (OpsctlError, OSError):
                return True  # tried again at the next look; the failing store is said by the segments' writes
            self.marked = self.base.name
            self.emit(Note(f"the topology's {change.text()}: base {self.base.name} serves a restore up to "
                           f"{iso(change.until)}; taking a new base"))
        return True
