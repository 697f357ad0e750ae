"""Progress of a slot operation: counters, throttled events, and a one-line bar for terminals.

TtyLine is the one way opsctl redraws a status line (slot moves, the audit's scan): carriage return, the line
cut to the terminal's width (a wrapped line cannot be redrawn in place), erase to the end of the line.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

Event = dict[str, Any]
INTERVAL = 0.25
MIN_FRACTION_FOR_ETA = 0.05  # before that, setup time (opening slots) makes any ETA a wild guess


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}GiB"


def human_seconds(seconds: float | None) -> str:
    """3s, 2m05s, 1h07m; "-" when unknown."""
    if seconds is None:
        return "-"
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    return f"{s // 60}m{s % 60:02d}s" if s < 3600 else f"{s // 3600}h{s % 3600 // 60:02d}m"


def gauge(done: int, total: int, width: int) -> str:
    """`[#####.....]`: done of total (clamped, total 0 counts as 1)."""
    filled = min(width, max(0, width * done // max(1, total)))
    return f"[{'#' * filled}{'.' * (width - filled)}]"


def bar_line(event: Event, width: int = 24) -> str:
    """`[#####.....] 120/4096 slots  53000 keys  12.0MiB  91000 keys/s  ETA 3s`. Pure."""
    total, done = int(event["slots_total"]), int(event["slots_done"])
    return (f"{gauge(done, total, width)} {done}/{total} slots  {event['keys']} keys  "
            f"{human_bytes(event['bytes'])}  {event['keys_per_sec']:.0f} keys/s  ETA {human_seconds(event.get('eta'))}")


def redraw(line: str, columns: int) -> str:
    """What replaces the current terminal line by `line`: CR, the line cut to columns - 1, erase to the end. Pure."""
    return "\r" + line[:max(1, columns - 1)] + "\x1b[K"


def done_fraction(slots_done: int, slots_total: int, keys: int, est_keys: int) -> float:
    """How far an operation is: moved keys against the estimate (finer than slots, which finish in waves),
    never below the slots done and below 1 until every slot is. Pure."""
    by_slots = slots_done / slots_total if slots_total else 0.0
    if by_slots >= 1 or est_keys <= 0:
        return min(1.0, by_slots)
    return max(by_slots, min(0.99, keys / est_keys))


CLEAR_LINE = "\r\x1b[K"


class TtyLine:
    """A status line redrawn in place on a terminal stream; `show` at most every `interval` s, `done` always."""

    def __init__(self, stream: TextIO, interval: float = 0.1) -> None:
        self.stream = stream
        self.interval = interval
        self._last = -interval
        self._lock = threading.Lock()

    def _columns(self) -> int:
        try:
            return os.get_terminal_size(self.stream.fileno()).columns
        except (OSError, ValueError):
            return 80

    def show(self, line: str, force: bool = False) -> None:
        with self._lock:
            now = time.monotonic()
            if not force and now - self._last < self.interval:
                return
            self._last = now
            self.stream.write(redraw(line, self._columns()))
            self.stream.flush()

    def done(self, line: str) -> None:
        """Draw the final state and end the line, so what follows starts on a clean line."""
        self.show(line, force=True)
        with self._lock:
            self.stream.write("\n")
            self.stream.flush()


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
        fraction = done_fraction(self.slots_done, self.slots_total, self.keys, self.est_keys)
        eta = elapsed * (1 - fraction) / fraction if fraction >= MIN_FRACTION_FOR_ETA else None
        return {"event": "slots-done" if final else "slots-progress", "slots_done": self.slots_done,
                "slots_total": self.slots_total, "keys": self.keys, "bytes": self.bytes,
                "keys_per_sec": round(rate, 1), "seconds": round(elapsed, 3),
                "eta": None if eta is None else round(eta, 1)}

    def finish(self) -> Event:
        event = self.event(final=True)
        self.emit(event)
        return event
