"""Progress of a slot operation: counters shared by its movers, and throttled SlotsProgress events."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from opsctl.base.events import Emit, SlotsDone, SlotsProgress

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
