"""Times read back from stored records (manifests, archive descriptions, segments, leases, retention records) and
given on the command line (--to-time): finite, not before 1970, and not in the far future. Pure: the caller passes
now."""

from __future__ import annotations

import math
from datetime import datetime

FLOOR = 0.0  # 1970-01-01T00:00:00Z: a time before is no clock's
AHEAD = 86400.0  # s a stored time may lie ahead of this clock (written on a host whose clock runs ahead)


def stored_time(value: object, now: float) -> float | None:
    """value as a unix time when it is a number (not a bool) from FLOOR to now + AHEAD; None otherwise (NaN,
    1e308, negative, a string, a date in 9999)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    moment = float(value)
    return moment if math.isfinite(moment) and FLOOR <= moment <= now + AHEAD else None


def stored_iso(text: str, now: float) -> float | None:
    """An ISO 8601 time with a zone as a unix time, checked as stored_time; None when it is not one."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        return None
    try:
        return stored_time(moment.timestamp(), now)
    except (OverflowError, OSError, ValueError):
        return None
