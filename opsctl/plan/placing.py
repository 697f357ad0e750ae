"""What a plan says about the fleet's shape: each placed or retired node's reason, and the one-line count. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from opsctl.plan.facts import Facts
from opsctl.plan.steps import Failover, RemoveNode, StartNode, Step, WriteConfig
from opsctl.spec.layout import Layout

NEW = "new node"


def with_placement_reasons(layout: Layout, steps: Sequence[Step]) -> list[Step]:
    """A new node's steps and a retired node's removal say why placement added or retired it (spec.placement),
    e.g. "topo-9 on h4: new replica of shard 2 (replicas_per_master 1 -> 2)"."""
    out: list[Step] = []
    for step in steps:
        why = layout.reason(step.node)
        new = isinstance(step, (StartNode, WriteConfig)) and step.reason == NEW
        if why and (new or isinstance(step, RemoveNode)):
            step = replace(step, reason=why if step.reason == NEW else f"{why}: {step.reason}")
        out.append(step)
    return out


def summary(layout: Layout, facts: Facts, steps: Sequence[Step]) -> str:
    """"N to add, N to fail over, N to retire, N to change, N unchanged" over the layout's nodes and the retired
    ones the plan removes (zero counts left out); "" for an empty plan."""
    if not steps:
        return ""
    touched = {s.node for s in steps}
    names = [n.name for n in layout.nodes]
    added = {n for n in names if n in touched and not facts[n].recorded_digest and not facts[n].running}
    failing = {s.node for s in steps if isinstance(s, Failover)}
    retiring = {s.node for s in steps if isinstance(s, RemoveNode)}
    changing = {n for n in names if n in touched} - added - failing
    counts = ((len(added), "to add"), (len(failing), "to fail over"), (len(retiring), "to retire"),
              (len(changing), "to change"), (len(names) - len(touched & set(names)), "unchanged"))
    return ", ".join(f"{count} {what}" for count, what in counts if count)
