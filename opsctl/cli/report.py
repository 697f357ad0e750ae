"""Text for people: plans and status tables. Pure functions from data to strings."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from opsctl.base.errors import is_auth_failure
from opsctl.base.frozen import Frozen, frozen
from opsctl.base.words import human_bytes, plural
from opsctl.spec.layout import same_endpoint

if TYPE_CHECKING:  # annotations only: `opsctl --help` must not import the spec model
    from opsctl.observe.replies import RoleInfo
    from opsctl.plan.facts import NodeFacts
    from opsctl.plan.steps import Plan
    from opsctl.spec.layout import Layout, Node


def plan_text(plan: Plan) -> str:
    """The plan for people: a summary line, each step with why, and each setting a write changes, before -> after
    (secrets as verdicts or ***, as the step holds them)."""
    from opsctl.plan.steps import WriteConfig

    if plan.empty:
        return "\n".join(["Plan: no changes.", *(f"  {note}" for note in plan.notes)])
    lines = [f"Plan: {plural(len(plan.steps), 'step')} for '{plan.spec_name}':"]
    lines += [f"  {plan.summary}"] if plan.summary else []
    for i, step in enumerate(plan.steps, start=1):
        lines.append(f"  {i:>3}. {step.title()}")
        lines.append(f"       why: {step.reason}")
        if isinstance(step, WriteConfig):
            lines += [f"       {name}: {before} -> {after}" for name, before, after in step.changes]
    lines += [f"  warning: {w}" for w in plan.warnings]
    lines += [f"  then: {note}" for note in plan.notes if plan.replan]
    return "\n".join(lines)


@frozen
class NodeStatus(Frozen):
    """One node's row. offset: its replication offset. lag: a replica's bytes behind its master (None when the
    master is unknown or silent); a master's slowest replica's lag (None without replicas). ops_per_sec: the
    server's own instantaneous_ops_per_sec (None for a node that does not answer)."""

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
    ops_per_sec: int | None = None

    def as_dict(self) -> dict[str, str | int | None]:
        return dict(self.__dict__)

    @property
    def lag_text(self) -> str:
        """The LAG column: replication offsets apart, with its unit (0B, 700B, 1.2MiB: a bare number reads as
        seconds as well), `?` for a replica whose lag is unknown, `-` where there is no lag."""
        if self.lag is not None:
            return human_bytes(self.lag)
        return "?" if self.role == "replica" else "-"


def node_status(layout: Layout, facts: Mapping[str, NodeFacts], pending: Sequence[Node] = ()) -> list[NodeStatus]:
    """A row per node of layout, then per node the next apply adds (pending: "to be added", not down)."""
    rows = []
    for node in (*layout.nodes, *pending):
        f = facts[node.name]
        role = f.role
        me = f.myself
        rows.append(NodeStatus(
            name=node.name, endpoint=node.endpoint, host=node.host,
            state="to be added" if node in pending else "up" if f.reachable else (
                "authentication failed" if is_auth_failure(f.error) else
                "running, not answering" if f.running else "down"),
            role=role.kind if role else "-",
            link=(role.link or "-") if role and role.kind == "replica" else "-",
            offset=role.offset if role and role.kind != "sentinel" else None,
            lag=_lag(layout, facts, node.endpoint, role),
            memory=f"{f.info.get('used_memory_human', '-')}/{_maxmemory(f.info)}",
            keys=f.keys, slots=sum(b - a + 1 for a, b in me.slots) if me else 0, shard=node.shard,
            ops_per_sec=_ops_per_sec(f.info) if f.reachable else None))
    return rows


def _ops_per_sec(info: Mapping[str, str]) -> int | None:
    value = info.get("instantaneous_ops_per_sec", "")
    return int(value) if value.isdigit() else None


def _lag(layout: Layout, facts: Mapping[str, NodeFacts], endpoint: str, role: RoleInfo | None) -> int | None:
    """A replica: bytes behind its master, as the master's ROLE reports (one snapshot), else from the two offsets.
    A master: its slowest replica's lag. Never negative (two nodes are not observed at the same instant)."""
    if role is None or role.kind == "sentinel":
        return None
    if role.kind == "master":
        return max((max(0, role.offset - acked) for _, _, acked in role.replicas), default=None)
    master = _master_role(layout, facts, role.master) if role.master else None
    if master is None:
        return None
    acked = next((off for address, port, off in master.replicas if same_endpoint(f"{address}:{port}", endpoint)), None)
    return max(0, master.offset - (acked if acked is not None else role.offset))


def _maxmemory(info: Mapping[str, str]) -> str:
    value = info.get("maxmemory_human", "-")
    return "unlimited" if value in ("0B", "0") else value


def _master_role(layout: Layout, facts: Mapping[str, NodeFacts], master: tuple[str, int]) -> RoleInfo | None:
    node = layout.find(f"{master[0]}:{master[1]}")
    f = facts.get(node.name) if node else None
    role = f.role if f and f.reachable else None
    return role if role and role.kind == "master" else None


def status_table(rows: list[NodeStatus], with_ops: bool = False) -> str:
    """The status table; with_ops adds an OPS/S column (status --watch: a rate means something when it moves)."""
    header = f"{'NODE':<22} {'ENDPOINT':<22} {'STATE':<8} {'ROLE':<9} {'LINK':<10} {'LAG':>8} " \
             f"{'MEMORY':<16} {'KEYS':>8} {'SLOTS':>6}" + (f" {'OPS/S':>8}" if with_ops else "")
    lines = [header]
    for r in rows:
        ops = f" {'-' if r.ops_per_sec is None else r.ops_per_sec:>8}" if with_ops else ""
        lines.append(f"{r.name:<22} {r.endpoint:<22} {r.state:<8} {r.role:<9} {r.link:<10} {r.lag_text:>8} "
                     f"{r.memory:<16} {r.keys:>8} {r.slots:>6}{ops}")
    return "\n".join(lines)
