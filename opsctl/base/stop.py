"""A stop request: SIGTERM and SIGINT stop a long command at its next safe point.

Outside a region that must finish (finishing()) the first signal raises Stopped at once, so each command's cleanup
runs; inside one (a slot move) engines poll check(), finish or undo what is in flight, journal it and say how to go
on. A second signal raises at once. Exit 128 + signal (130, 143), as a shell reports it."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from opsctl.base.errors import OpsctlError

SIGNALS = (signal.SIGTERM, signal.SIGINT)
RESUME_HINT = ("run the same command again (or `opsctl cluster fix -f SPEC`, `opsctl apply -f SPEC`): what this run "
               "journaled is picked up where it stopped; `opsctl plan -f SPEC` shows what is left")
AGAIN_HINT = "run the same command again: this command journals nothing, there is nothing to pick up"

_requested: list[int] = []  # the signals received (a list: append is atomic under the GIL, read from any thread)
_regions: list[str] = []  # the finishing regions entered and not left (any thread)
_hint: list[str] = [RESUME_HINT]  # the hint of a stop at once: resuming is said only by commands that journal


class Stopped(OpsctlError):
    """The run stopped because it was asked to (SIGTERM, SIGINT); detail says what it finished or left journaled."""

    def __init__(self, signum: int, detail: str = "", hint: str = RESUME_HINT) -> None:
        super().__init__(f"stopped on {signal.Signals(signum).name}", detail, hint)
        self.signum, self.exit_code = signum, 128 + signum


def requested() -> int | None:
    """The signal that asked this run to stop, or None."""
    return _requested[0] if _requested else None


def asked_once() -> bool:
    """A stop was asked for once: the run stopped where it chose to (a normal stop), not at once on a second."""
    return len(_requested) == 1


def check(detail: str = "", hint: str = RESUME_HINT) -> None:
    """A safe point: raise Stopped (with what was done, and how to go on) when a stop was requested."""
    signum = requested()
    if signum is not None:
        raise Stopped(signum, detail, hint)


@contextmanager
def finishing(what: str) -> Iterator[None]:
    """A region the first signal does not interrupt: its engines poll check(); leaving it normally with a stop
    requested raises Stopped then (the step in flight finished: start no other)."""
    _regions.append(what)
    try:
        yield
    finally:
        _regions.remove(what)
    check(f"{what} finished before it reached a point to stop at", "`opsctl plan -f SPEC` shows what is left")


def _on_signal(signum: int, frame: FrameType | None) -> None:
    first = not _requested
    _requested.append(signum)
    if first and _regions:
        return  # polled at the region's safe points
    raise Stopped(signum, "interrupted where it was: nothing waited for the step in flight"
                  if not first else "", _hint[0])


@contextmanager
def installed(hint: str = RESUME_HINT) -> Iterator[None]:
    """SIGTERM and SIGINT become stop requests for the duration (main thread only); the previous handlers and a
    clear request after. hint: what a stop at once tells the user to do (AGAIN_HINT for a command that journals
    nothing)."""
    try:
        previous = {s: signal.signal(s, _on_signal) for s in SIGNALS}
    except ValueError:  # not the main thread (a library caller's worker): signals stay the caller's
        yield
        return
    _requested.clear()
    _hint[0] = hint
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _requested.clear()
        _hint[0] = RESUME_HINT
