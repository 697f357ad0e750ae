"""The status operation: one look at every node (status), looked at again while it settles, a look every few
seconds (watch), the node rows and table of what it saw (StatusResult); and the waits of a run (polling every few
ms) until a replication or sentinel topology is healthy, or a restarted node back in place; errors name the
laggard."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from opsctl.base.errors import AUTH_HINT, NodeError, is_auth_failure
from opsctl.base.events import human_bytes
from opsctl.base.frozen import Frozen, frozen
from opsctl.base.poll import wait_for
from opsctl.net.connection import connection_to, said
from opsctl.net.resp import text
from opsctl.observe.replies import parse_pairs
from opsctl.plan.health import node_problem, replication_problem, sentinel_problem
from opsctl.runtime.gather import FleetView
from opsctl.runtime.opening import Runtime
from opsctl.spec.layout import Node, same_endpoint, sentinel_master_name
from opsctl.state.standbyfiles import StandbyStatus, standby_status

if TYPE_CHECKING:
    from opsctl.observe.replies import RoleInfo
    from opsctl.plan.facts import NodeFacts
    from opsctl.spec.layout import Layout

POLL = 0.05  # each poll observes every node: 50 ms keeps that cheap and still far below redis-cli's 1 s steps


def wait_replication(rt: Runtime, timeout: float) -> None:
    last = [""]

    def healthy() -> bool | None:
        problem = replication_problem(rt.loaded.layout, fleet.facts())
        last[0] = problem or ""
        return None if problem else True

    with FleetView(rt) as fleet:
        wait_for(healthy, timeout, "replicas to link to the master", interval=POLL, last_reason=lambda: last[0])


def wait_sentinels(rt: Runtime, timeout: float) -> None:
    name = sentinel_master_name(rt.loaded.spec)
    last = [""]

    def agreed() -> bool | None:
        problem = sentinel_problem(rt.loaded.layout, fleet.facts(), name)
        if problem is None:
            problem = _ckquorum_problem(rt, name)
        last[0] = problem or ""
        return None if problem else True

    with FleetView(rt) as fleet:
        wait_for(agreed, timeout, "sentinels to agree on the master", interval=POLL, last_reason=lambda: last[0])


def _ckquorum_problem(rt: Runtime, name: str) -> str | None:
    """Each sentinel can reach a quorum (CKQUORUM) and runs no failover: one still running names the old master
    in its entry and may reconfigure replicas after apply has looked."""
    for node in rt.loaded.layout.sentinels:
        try:
            with connection_to(rt.connector, node, timeout=2.0) as handle:  # a silent sentinel: the next poll
                handle.call("SENTINEL", "CKQUORUM", name)
                entry = text(handle.call("SENTINEL", "MASTER", name))
        except NodeError as exc:
            return f"{node.name}: SENTINEL CKQUORUM {name}: {said(exc)}"
        pairs = parse_pairs(entry if isinstance(entry, list) else [])
        if "failover_in_progress" in pairs.get("flags", "").split(","):
            return f"{node.name} runs a failover of {name} ({pairs.get('failover-state', '?')})"
    return None


def wait_back_in_place(rt: Runtime, node: Node, timeout: float) -> None:
    """After a restart: a replica linked to its master and caught up; a cluster node agreeing with the rest."""
    last = [""]

    def back() -> bool | None:
        problem = node_problem(rt.loaded, fleet.facts(), node)
        last[0] = problem or ""
        return None if problem else True

    with FleetView(rt) as fleet:
        wait_for(back, timeout, f"{node.name} to be back in place after its restart", interval=POLL,
                 last_reason=lambda: last[0])


LOOK_EVERY = 0.25  # a look opens a connection per node: four a second is plenty for what gossip does


@frozen
class StatusOptions(Frozen):
    """settle: seconds an unhealthy look is looked at again (apply: what the servers finish on their own, a role
    gossiped, a replica's first ACK, a sentinel's replica reconfigured, is not a failed apply); a refused password
    is not waited for."""

    settle: float = 0.0


ONE_LOOK = StatusOptions()


def status(rt: Runtime, options: StatusOptions = ONE_LOOK) -> StatusResult:
    """The status of rt's topology: a look, again while it is unhealthy, up to options.settle seconds; a standby's
    link as its state dir says (a spec with follows:, or one switched over)."""
    deadline = time.monotonic() + options.settle
    result = look(rt)
    while not result.healthy and result.hint != AUTH_HINT and time.monotonic() < deadline:
        time.sleep(LOOK_EVERY)
        result = look(rt)
    return _with_standby(rt, result)


def watch(rt: Runtime, interval: float) -> Iterator[StatusResult]:
    """A look, then another every interval seconds, for as long as the caller reads (status --watch); each with
    the standby's link as status gives it."""
    while True:
        yield _with_standby(rt, look(rt))
        time.sleep(interval)


def _with_standby(rt: Runtime, result: StatusResult) -> StatusResult:
    from dataclasses import replace

    return replace(result, standby=standby_status(rt.loaded, rt.state_dir, time.time()))


def look(rt: Runtime) -> StatusResult:
    """What status reports: one look at every node (no config read), the health line and its hint."""
    from dataclasses import replace

    from opsctl.plan.health import deployed_view, health_hint, health_line
    from opsctl.runtime.gather import gather_facts

    facts = gather_facts(rt, with_config=False)  # a look without the config still reads the write fence
    view, pending = deployed_view(rt.loaded.layout, facts)  # what runs; what the next apply adds is not down
    healthy, line = health_line(replace(rt.loaded, layout=view), facts)
    if pending:
        line += f"; to be added by the next apply: {', '.join(n.name for n in pending)}"
    return StatusResult(rt.loaded.spec.name, rt.loaded.spec.topology, healthy, line,
                        tuple(node_status(view, facts, pending)), None if healthy else health_hint(facts))


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


@frozen
class StatusResult(Frozen):
    """status, and the status apply and restart show when done. healthy: every node answers as the spec says;
    health: the line that says so or why not; hint: how to get healthy (None when healthy); standby: its link
    (None: not a standby, never switched over)."""

    spec: str
    topology: str
    healthy: bool
    health: str
    nodes: tuple[NodeStatus, ...]
    hint: str | None
    standby: StandbyStatus | None = None

    def text(self) -> str:
        standby = "" if self.standby is None else f"\n{self.standby.line()}"
        return f"{status_table(list(self.nodes))}\n{self.health}{standby}"

    def to_dict(self) -> dict[str, object]:
        return {"spec": self.spec, "topology": self.topology, "healthy": self.healthy, "health": self.health,
                "nodes": [row.as_dict() for row in self.nodes],
                "standby": None if self.standby is None else self.standby.to_dict()}


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
