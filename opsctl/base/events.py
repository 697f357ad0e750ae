"""What a running operation tells people: the interface of its events and the words they are said in.

An event is a frozen value with a `kind` (its JSON name), how a printer shows it (`redrawn`) and a `line()` for
people; each feature declares its own events in its package (apply/executor's steps, slots/progress' moves,
backup/save's shards...). The printer (opsctl.cli.output) shows any of them as text (a progress bar redrawn in
place on a terminal) or as JSON lines. Here: the protocol, the sink (`Emit`), the JSON form, the events every
feature says (`Log`, `Note`), an event tagged with its topology (a fleet runs several at once, one sink for all),
and the words for people: counts with their nouns, sizes, durations, gauges."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import ClassVar, Literal, Protocol

from opsctl.base.frozen import Frozen, frozen

# How a printer shows an event. line: a line of its own. bar: progress, redrawn in place on a terminal, elsewhere a
# heartbeat (the newest as a line every HEARTBEAT seconds: a CI log shows the run is alive). bar-only: on the bar,
# nothing off a terminal. bar-last: the bar's last state, left as a line.
Redrawn = Literal["line", "bar", "bar-only", "bar-last"]
HEARTBEAT = 5.0


class Event(Protocol):
    """What every event is: a kind, how it is shown, its fields (a dataclass: the JSON form) and a line for people.
    Events subclass it to take the default `redrawn`."""

    kind: ClassVar[str]
    redrawn: ClassVar[Redrawn] = "line"
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[object]]]

    def line(self) -> str: ...


Emit = Callable[[Event], None]


@frozen
class Log(Frozen, Event):
    kind: ClassVar[str] = "log"
    step: str
    text: str

    def line(self) -> str:
        return f"      {self.text}"


@frozen
class Note(Frozen, Event):
    """A line a runbook says as it goes (a pre-check, a promotion, a node reloaded), outside any plan step."""

    kind: ClassVar[str] = "note"
    text: str

    def line(self) -> str:
        return self.text


@frozen
class Tagged(Frozen, Event):
    """An event of one topology among several run at once."""

    kind: ClassVar[str] = "tagged"
    topology: str
    event: Event

    def line(self) -> str:
        return f"{self.topology}: {self.event.line()}"

    def as_dict(self) -> dict[str, object]:
        """The JSON form: the topology, and the event's own form under "tagged"."""
        return {"event": self.kind, "topology": self.topology,
                "tagged": {"event": self.event.kind, **dataclasses.asdict(self.event)}}


def tagged(emit: Callable[[Tagged], None], topology: str) -> Emit:
    """emit, each event tagged with the topology it comes from."""
    return lambda event: emit(Tagged(topology, event))


def as_dict(event: Event) -> dict[str, object]:
    """The JSON form: {"event": kind, field: value, ...}."""
    if isinstance(event, Tagged):
        return event.as_dict()
    return {"event": event.kind, **dataclasses.asdict(event)}


def as_log(emit: Emit, step: str) -> Emit:
    """emit, with a runbook's notes shown as lines of the plan step that runs it."""
    return lambda event: emit(Log(step, event.text) if isinstance(event, Note) else event)


def ignore(event: Event) -> None:
    """An Emit that shows nothing."""


def on_stderr(event: Event) -> None:
    """The Emit of a library call given none where silence would hide a risk (a lock forced or taken over): the
    event's line on stderr. The command line passes its printer instead."""
    print(event.line(), file=sys.stderr, flush=True)


# --- words for people ----------------------------------------------------------------------------------------------


def plural(count: int, noun: str, many: str | None = None) -> str:
    """`1 node`, `3 nodes`, `0 replicas`; many for irregular nouns."""
    return f"{count} {noun if count == 1 else many or noun + 's'}"


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
