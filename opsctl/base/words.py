"""Words for people: counts with their nouns.

Text for a terminal: sizes, durations, gauges, and TtyLine, the one way opsctl redraws a status line (slot
moves, apply, the audit's scan): carriage return, the line cut to the terminal's width (a wrapped line cannot be
redrawn in place), erase to the end of the line."""

from __future__ import annotations


def plural(count: int, noun: str, many: str | None = None) -> str:
    """`1 node`, `3 nodes`, `0 replicas`; many for irregular nouns."""
    return f"{count} {noun if count == 1 else many or noun + 's'}"


CLEAR_LINE = "\r\x1b[K"


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


def redraw(line: str, columns: int) -> str:
    """What replaces the current terminal line by `line`: CR, the line cut to columns - 1, erase to the end. Pure."""
    return "\r" + line[:max(1, columns - 1)] + "\x1b[K"
