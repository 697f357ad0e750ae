"""Progress of a slot operation: counters, throttled events, and a one-line bar for terminals."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Event = dict[str, Any]
INTERVAL = 0.25


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}GiB"


def bar_line(event: Event, width: int = 24) -> str:
    """`[#####.....]  120/4096 slots  53k keys  12.0MiB  91k keys/s  ETA 3s`. Pure."""
    total = max(1, int(event["slots_total"]))
    done = int(event["slots_done"])
    filled = width * done // total
    eta = event.get("eta")
    eta_text = "-" if eta is None else f"{eta:.0f}s"
    return (f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} slots  {event['keys']} keys  "
            f"{human_bytes(event['bytes'])}  {event['keys_per_sec']:.0f} keys/s  ETA {eta_text}")


@dataclass
class Progress:
    """Thread-safe counters shared by the movers of one operation; emits `slots-progress` events."""

    emit: Callable[[Event], None]
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

    def event(self, final: bool = False) -> Event:
        elapsed = max(1e-6, time.monotonic() - self.started)
        rate = self.keys / elapsed
        left = self.slots_total - self.slots_done
        eta = elapsed * left / self.slots_done if self.slots_done else None
        return {"event": "slots-done" if final else "slots-progress", "slots_done": self.slots_done,
                "slots_total": self.slots_total, "keys": self.keys, "bytes": self.bytes,
                "keys_per_sec": round(rate, 1), "seconds": round(elapsed, 3),
                "eta": None if eta is None else round(eta, 1)}

    def finish(self) -> Event:
        event = self.event(final=True)
        self.emit(event)
        return event
