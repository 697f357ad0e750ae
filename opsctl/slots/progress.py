"""Progress of a slot operation: counters shared by its movers, and throttled SlotsProgress events."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from opsctl.base.events import Emit, Event, Redrawn, gauge, human_bytes, human_seconds
from opsctl.base.frozen import Frozen, frozen


@frozen
class SlotsStart(Frozen, Event):
    """moves: each move's source, target, slots, slot_count, est_keys and est_bytes."""

    kind: ClassVar[str] = "slots-start"
    mode: str
    slot_count: int
    moves: tuple[Mapping[str, str | int], ...]

    def line(self) -> str:
        return f"moving {self.slot_count} slots ({self.mode})"


@frozen
class SlotsProgress(Frozen, Event):
    """Counters of a slot operation so far; eta in seconds, None while too early to say."""

    kind: ClassVar[str] = "slots-progress"
    redrawn: ClassVar[Redrawn] = "bar"
    slots_done: int
    slots_total: int
    keys: int
    bytes: int
    keys_per_sec: float
    seconds: float
    eta: float | None

    def line(self, width: int = 24) -> str:
        """`[#####.....] 120/4096 slots  53000 keys  12.0MiB  91000 keys/s  ETA 3s`."""
        return (f"{gauge(self.slots_done, self.slots_total, width)} {self.slots_done}/{self.slots_total} slots  "
                f"{self.keys} keys  {human_bytes(self.bytes)}  {self.keys_per_sec:.0f} keys/s  "
                f"ETA {human_seconds(self.eta)}")


@frozen
class SlotsDone(SlotsProgress):
    kind: ClassVar[str] = "slots-done"
    redrawn: ClassVar[Redrawn] = "bar-last"


@frozen
class BigKey(Frozen, Event):
    kind: ClassVar[str] = "big-key"
    slot: int
    key: str
    bytes: int
    timeout_ms: int

    def line(self) -> str:
        return (f"big-key: slot {self.slot}, {self.key!r}, {human_bytes(self.bytes)}: moved alone, "
                f"MIGRATE timeout {self.timeout_ms} ms")


@frozen
class MigrateRetry(Frozen, Event):
    kind: ClassVar[str] = "migrate-retry"
    slot: int
    keys: int
    error: str

    def line(self) -> str:
        return f"migrate-retry: slot {self.slot}, {self.keys} keys: {self.error}"


@frozen
class BusyKeyEqual(Frozen, Event):
    kind: ClassVar[str] = "busy-key-equal"
    slot: int
    key: str

    def line(self) -> str:
        return f"busy-key-equal: slot {self.slot}, {self.key!r} was on the target already, equal: replaced"


@frozen
class Closed(Frozen, Event):
    """Open slots closed: actions maps finish/assign/cancel to the slot ranges it applied to."""

    kind: ClassVar[str] = "closed"
    source: str
    target: str
    journaled: bool
    actions: Mapping[str, str]

    def line(self) -> str:
        origin = "journaled" if self.journaled else "found open"
        done = ", ".join(f"{action} {slots}" for action, slots in sorted(self.actions.items()))
        return f"closed: {self.source} -> {self.target} ({origin}): {done}"


@frozen
class SlotsSkip(Frozen, Event):
    kind: ClassVar[str] = "slots-skip"
    step: str
    why: str

    def line(self) -> str:
        return f"slots-skip: {self.step}: {self.why}"


@frozen
class SlotsClosed(Frozen, Event):
    kind: ClassVar[str] = "slots-closed"
    what: str

    def line(self) -> str:
        return f"slots-closed: {self.what}"


@frozen
class EndpointDown(Frozen, Event):
    """A node a slot move goes from (source) or to (target) does not answer, or is flagged failing."""

    kind: ClassVar[str] = "endpoint-down"
    role: str
    node: str

    def line(self) -> str:
        return f"endpoint-down: the {self.role} {self.node} does not answer: waiting, no SETSLOT meanwhile"


@frozen
class EndpointReplacedEvent(Frozen, Event):
    """The cluster failed over the shard of a move's source or target; the move follows the shard."""

    kind: ClassVar[str] = "endpoint-replaced"
    role: str
    node: str

    def line(self) -> str:
        return (f"endpoint-replaced: the {self.role} {self.node} was failed over: the move goes on with its "
                "shard's new master")


INTERVAL = 0.25
MIN_FRACTION_FOR_ETA = 0.05  # before that, setup time (opening slots) makes any ETA a wild guess


def done_fraction(slots_done: int, slots_total: int, keys: int, est_keys: int) -> float:
    """How far an operation is: moved keys against the estimate (finer than slots, which finish in waves),
    never below the slots done and below 1 until every slot is. Pure."""
    by_slots = slots_done / slots_total if slots_total else 0.0
    if by_slots >= 1 or est_keys <= 0:
        return min(1.0, by_slots)
    return max(by_slots, min(0.99, keys / est_keys))


@dataclass
class Progress:
    """Thread-safe counters shared by the movers of one operation; emits `slots-progress` events."""

    emit: Emit
    slots_total: int
    est_keys: int = 0
    slots_done: int = 0
    keys: int = 0
    bytes: int = 0
    started: float = field(default_factory=time.monotonic)
    _last: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, slots: int = 0, keys: int = 0, size: int = 0) -> None:
        with self._lock:
            self.slots_done += slots
            self.keys += keys
            self.bytes += size
            now = time.monotonic()
            if now - self._last < INTERVAL:
                return
            self._last = now
        self.emit(self.event())

    def event(self, final: bool = False) -> SlotsProgress:
        elapsed = max(1e-6, time.monotonic() - self.started)
        rate = self.keys / elapsed
        fraction = done_fraction(self.slots_done, self.slots_total, self.keys, self.est_keys)
        eta = elapsed * (1 - fraction) / fraction if fraction >= MIN_FRACTION_FOR_ETA else None
        return (SlotsDone if final else SlotsProgress)(
            self.slots_done, self.slots_total, self.keys, self.bytes, round(rate, 1), round(elapsed, 3),
            None if eta is None else round(eta, 1))

    def finish(self) -> SlotsProgress:
        event = self.event(final=True)
        self.emit(event)
        return event
