"""The one way to wait: poll a check until it gives a result or the time runs out, and say why it did not.

Every wait in opsctl is a check that returns its result, or Pending with the reason it is not there yet; the
reason of the last look, and the ones before it with when, is what a timeout reports (a wait that says only "timed
out" leaves the operator guessing, and one that says only the last state hides how it got there).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from opsctl.base.errors import ConvergenceError
from opsctl.base.frozen import Frozen, frozen

T = TypeVar("T")


@frozen
class Pending(Frozen):
    """A check's "not yet", with the reason shown if waiting times out. left: how many things the wait still
    waits for (nodes not joined, slots not spread), where the check can count them: a wait given `stall` goes on
    while that count falls."""

    reason: str
    left: int | None = None


def wait_for(check: Callable[[], T | Pending | None], timeout: float, what: str,
             interval: float | Callable[[], float] = 0.005, last_reason: Callable[[], str] | None = None,
             on_timeout: Callable[[str], BaseException] | None = None, stall: float | None = None) -> T:
    """Poll check() until it returns a result (anything but None or Pending), pausing `interval` s between looks
    (or interval(), for a pause that grows: a backoff).

    On timeout the error names `what`, the last reason (a returned Pending's, else last_reason()) and the reasons
    seen before it with when, so a wait that went through several states says which. A wait whose callers know
    its error by class or words builds it instead: on_timeout(last reason) is raised.

    stall: follow progress rather than a fixed budget. The wait goes on while its Pending's `left` keeps falling
    (a new fewest), and fails once `stall` seconds pass with no new fewest, naming what is stuck; `timeout`
    stays the cap on the whole wait. Why: at hundreds of nodes on a loaded machine a cluster forms slowly but
    steadily, and any fixed budget is either too short there or far too long for a wait that is stuck.
    """
    start = time.monotonic()
    deadline = start + timeout
    seen = ReasonLog(start)
    progress = Progress(start, stall)
    while True:
        result = check()
        if isinstance(result, Pending):
            seen.note(result.reason)
            progress.note(result.left)
        elif result is not None:
            return result
        elif last_reason is not None:
            seen.note(last_reason())
        now = time.monotonic()
        if now >= deadline or progress.stalled(now):
            if on_timeout is not None:
                raise on_timeout(seen.last)
            why = progress.describe(now) if progress.stalled(now) and now < deadline \
                else f"timed out after {timeout:g}s"
            raise ConvergenceError(f"{why} waiting for {what}", seen.render(),
                                   "look at the nodes named above; `opsctl cluster check -f SPEC` shows the state")
        time.sleep(interval() if callable(interval) else interval)


class Progress:
    """When a wait last made progress: the fewest things it has seen left, and since when. A wait without
    `stall`, or whose checks count nothing, never stalls (its timeout alone ends it)."""

    def __init__(self, start: float, stall: float | None) -> None:
        self.stall = stall
        self.fewest: int | None = None
        self.since = start  # when the fewest was first seen (the start, before any count)
        self.first: int | None = None

    def note(self, left: int | None, now: float | None = None) -> None:
        if left is None:
            return
        if self.first is None:
            self.first = left
        if self.fewest is None or left < self.fewest:
            self.fewest = left
            self.since = time.monotonic() if now is None else now

    def stalled(self, now: float) -> bool:
        return self.stall is not None and self.fewest is not None and now - self.since >= self.stall

    def describe(self, now: float) -> str:
        return (f"no progress for {now - self.since:.1f}s ({self.fewest} of {self.first} still waited for, "
                f"the fewest seen)")


class ReasonLog:
    """The distinct reasons a wait saw, in order, each with when it was first and last seen (seconds into the
    wait). Only the last EARLIER_KEPT before the current one are kept: a timeout's message stays short."""

    EARLIER_KEPT = 4

    def __init__(self, start: float) -> None:
        self.start = start
        self.spans: list[tuple[str, float, float]] = []  # (reason, first seen, last seen)

    @property
    def last(self) -> str:
        return self.spans[-1][0] if self.spans else ""

    def note(self, reason: str) -> None:
        now = time.monotonic() - self.start
        if self.spans and self.spans[-1][0] == reason:
            self.spans[-1] = (reason, self.spans[-1][1], now)
            return
        self.spans.append((reason, now, now))
        del self.spans[:-(self.EARLIER_KEPT + 1)]

    def render(self) -> str:
        """The last reason whole; before it, each earlier one's first line with its span."""
        if not self.spans:
            return "no reason given"
        *earlier, (last, since, _) = self.spans
        last = last or "no reason given"
        if not earlier:
            return last
        lines = [last, f"(since {since:.1f} s into the wait; before that:"]
        lines += [f"  {first:.1f}-{until:.1f} s: {_first_line(reason)}" for reason, first, until in earlier]
        return "\n".join(lines) + ")"


def _first_line(reason: str) -> str:
    head, _, rest = reason.partition("\n")
    more = rest.count("\n") + 1 if rest else 0
    return f"{head} (+{more} more line{'s' if more != 1 else ''})" if more else head
