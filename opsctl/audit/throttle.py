"""Keeping a scan or a delete within a rate of operations per second."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


def throttle_delay(started: float, spent: int, rate: float | None, now: float) -> float:
    """Seconds to wait so that `spent` operations since `started` stay within `rate` per second."""
    if not rate:
        return 0.0
    return max(0.0, started + spent / rate - now)


@dataclass
class Throttle:
    rate: float | None
    started: float = field(default_factory=time.monotonic)
    spent: int = 0

    def spend(self, ops: int) -> None:
        self.spent += ops
        delay = throttle_delay(self.started, self.spent, self.rate, time.monotonic())
        if delay > 0:
            time.sleep(delay)
