"""`opsctl cluster check`: coverage, open slots and agreement from observed nodes. Pure (data in, data out)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from opsctl.observe.cluster_state import Disagreement, Names, observed_problems, slot_map, span, uncovered
from opsctl.observe.replies import SLOTS, NodeObservation


@dataclass(frozen=True)
class ShardView:
    master: str
    slots: str
    slot_count: int
    replicas: tuple[str, ...]


@dataclass(frozen=True)
class ClusterReport:
    nodes: int
    reachable: int
    covered: int
    shards: tuple[ShardView, ...]
    open_slots: tuple[str, ...]
    agreeing: int
    problems: tuple[Disagreement, ...] = field(default=())
    pending: tuple[str, ...] = ()  # nodes the next apply adds: not deployed yet, so neither down nor unhealthy

    @property
    def healthy(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "healthy": self.healthy}


def _shards(observations: Mapping[str, NodeObservation]) -> tuple[tuple[ShardView, ...], int, int]:
    views = {n: o.cluster_nodes for n, o in observations.items() if o.cluster_nodes}
    if not views:
        return (), 0, 0
    names = Names(views)
    maps = {n: slot_map(v) for n, v in views.items()}
    reference = max(maps.values(), key=lambda m: sum(1 for x in maps.values() if x == m))
    agreeing = sum(1 for m in maps.values() if m == reference)
    view = next(v for n, v in views.items() if maps[n] == reference)
    shards = []
    for line in sorted((ln for ln in view if ln.is_master and ln.slots), key=lambda ln: ln.slots[0]):
        replicas = tuple(names.label(r.id) for r in view if r.master_id == line.id)
        shards.append(ShardView(names.label(line.id), ", ".join(span(s, e) for s, e in line.slots),
                                line.slot_count, replicas))
    gaps = sum(e - s + 1 for s, e in uncovered(reference))
    return tuple(shards), SLOTS - gaps, agreeing


def summarize(observations: Mapping[str, NodeObservation]) -> ClusterReport:
    shards, covered, agreeing = _shards(observations)
    problems = observed_problems(dict(observations))
    open_slots = tuple(p.render() for p in problems if " is open: " in p.what)
    reachable = sum(1 for o in observations.values() if o.reachable)
    return ClusterReport(len(observations), reachable, covered, shards, open_slots, agreeing, tuple(problems))


def report_text(report: ClusterReport) -> str:
    lines = [f"nodes: {report.reachable}/{report.nodes} reachable"
             + (f"; to be added by the next apply: {', '.join(report.pending)}" if report.pending else ""),
             f"coverage: {report.covered}/{SLOTS} slots served"]
    for shard in report.shards:
        replicas = ", ".join(shard.replicas) or "no replicas"
        lines.append(f"  {shard.master}: {shard.slots} ({shard.slot_count} slots); replicas: {replicas}")
    lines.append(f"open slots: {len(report.open_slots) or 'none'}")
    lines += [f"  {text}" for text in report.open_slots]
    lines.append(f"agreement: {report.agreeing}/{report.reachable} nodes see the same slot map")
    if report.healthy:
        lines.append("cluster ok: every node agrees")
    else:
        lines.append(f"problems: {len(report.problems)}")
        lines += [f"  {text}" for p in report.problems if (text := p.render()) not in report.open_slots]
    return "\n".join(lines)


