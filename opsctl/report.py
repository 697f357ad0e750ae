"""Text for people: plans and status tables. Pure functions from data to strings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opsctl.plan.facts import NodeFacts
from opsctl.plan.steps import Plan
from opsctl.spec.layout import Layout


def plan_text(plan: Plan) -> str:
    if plan.empty:
        return "\n".join(["Plan: no changes.", *(f"  {note}" for note in plan.notes)])
    lines = [f"Plan: {len(plan.steps)} step(s) for '{plan.spec_name}':"]
    for i, step in enumerate(plan.steps, start=1):
        lines.append(f"  {i:>3}. {step.title()}")
        lines.append(f"       why: {step.reason}")
    lines += [f"  warning: {w}" for w in plan.warnings]
    return "\n".join(lines)


@dataclass(frozen=True)
class NodeStatus:
    name: str
    endpoint: str
    host: str
    state: str
    role: str
    link: str
    offset: int | None
    lag: int | None
    memory: str
    keys: int
    slots: int
    shard: int | None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def node_status(layout: Layout, facts: Mapping[str, NodeFacts]) -> list[NodeStatus]:
    rows = []
    for node in layout.nodes:
        f = facts[node.name]
        role = f.role
        master_offset = _master_offset(layout, facts, role.master) if role and role.master else None
        me = f.myself
        rows.append(NodeStatus(
            name=node.name, endpoint=node.endpoint, host=node.host,
            state="up" if f.reachable else ("running, not answering" if f.running else "down"),
            role=role.kind if role else "-",
            link=(role.link or "-") if role and role.kind == "replica" else "-",
            offset=role.offset if role else None,
            lag=(master_offset - role.offset) if role and master_offset is not None else None,
            memory=f"{f.info.get('used_memory_human', '-')}/{_maxmemory(f.info)}",
            keys=f.keys, slots=sum(b - a + 1 for a, b in me.slots) if me else 0, shard=node.shard))
    return rows


def _maxmemory(info: Mapping[str, str]) -> str:
    value = info.get("maxmemory_human", "-")
    return "unlimited" if value in ("0B", "0") else value


def _master_offset(layout: Layout, facts: Mapping[str, NodeFacts], master: tuple[str, int]) -> int | None:
    node = layout.find(f"{master[0]}:{master[1]}")
    role = facts[node.name].role if node else None
    return role.offset if role and role.kind == "master" else None


def status_table(rows: list[NodeStatus]) -> str:
    header = f"{'NODE':<22} {'ENDPOINT':<22} {'STATE':<8} {'ROLE':<9} {'LINK':<10} {'LAG':>8} " \
             f"{'MEMORY':<16} {'KEYS':>8} {'SLOTS':>6}"
    lines = [header]
    for r in rows:
        lag = "-" if r.lag is None else str(r.lag)
        lines.append(f"{r.name:<22} {r.endpoint:<22} {r.state:<8} {r.role:<9} {r.link:<10} {lag:>8} "
                     f"{r.memory:<16} {r.keys:>8} {r.slots:>6}")
    return "\n".join(lines)
