"""The events of a run as a whole, beside its steps' (opsctl.base.events): an apply round done, a replan, and an
event of one topology among several run at once (tagged: a fleet fans out over topologies, one sink for all)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import ClassVar, Protocol

from opsctl.base.frozen import Frozen, frozen


class Said(Protocol):
    """What every event is (opsctl.base.events.Event): a kind and a line for people."""

    kind: ClassVar[str]
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[object]]]

    def line(self) -> str: ...


@frozen
class RoundDone(Frozen):
    """A round of apply ran its plan's steps (wall time: steps run side by side)."""

    kind: ClassVar[str] = "round-done"
    steps: int
    seconds: float

    def line(self) -> str:
        return f"Applied {self.steps} step(s) in {self.seconds:.2f}s."


@frozen
class Replanning(Frozen):
    """Nodes that ran when apply looked are down now (a node told to stop before, by a run killed mid-restart, may
    answer until it acts on it): apply plans again."""

    kind: ClassVar[str] = "replanning"
    nodes: tuple[str, ...]

    def line(self) -> str:
        return f"{', '.join(self.nodes)} ran when apply looked and is down now: planning again"


@frozen
class Tagged(Frozen):
    """An event of one topology among several run at once."""

    kind: ClassVar[str] = "tagged"
    topology: str
    event: Said

    def line(self) -> str:
        return f"{self.topology}: {self.event.line()}"

    def as_dict(self) -> dict[str, object]:
        """The JSON form: the topology, and the event's own form under "tagged"."""
        return {"event": self.kind, "topology": self.topology,
                "tagged": {"event": self.event.kind, **dataclasses.asdict(self.event)}}


def tagged(emit: Callable[[Tagged], None], topology: str) -> Callable[[Said], None]:
    """emit, each event tagged with the topology it comes from."""
    return lambda event: emit(Tagged(topology, event))
