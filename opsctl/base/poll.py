"""The one way to wait: poll a check until it gives a result or the time runs out, and say why it did not.

Every wait in opsctl is a check that returns its result, or Pending with the reason it is not there yet; the
reason of the last look is what a timeout reports (a wait that says only "timed out" leaves the operator guessing).
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
    """A check's "not yet", with the reason shown if waiting times out."""

    reason: str


def wait_for(check: Callable[[], T | Pending | None], timeout: float, what: str,
             interval: float | Callable[[], float] = 0.005, last_reason: Callable[[], str] | None = None,
             on_timeout: Callable[[str], BaseException] | None = None) -> T:
    """Poll check() until it returns a result (anything but None or Pending), pausing `interval` s between looks
    (or interval(), for a pause that grows: a backoff).

    On timeout the error names `what` and the last reason: a returned Pending's, else last_reason(). A wait whose
    callers know its error by class or words builds it instead: on_timeout(last reason) is raised.
    """
    deadline = time.monotonic() + timeout
    reason = ""
    while True:
        result = check()
        if isinstance(result, Pending):
            reason = result.reason
        elif result is not None:
            return result
        elif last_reason is not None:
            reason = last_reason()
        if time.monotonic() >= deadline:
            if on_timeout is not None:
                raise on_timeout(reason)
            raise ConvergenceError(f"timed out after {timeout:g}s waiting for {what}", reason or "no reason given",
                                   "look at the nodes named above; `opsctl cluster check -f SPEC` shows the state")
        time.sleep(interval() if callable(interval) else interval)
