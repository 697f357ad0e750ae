"""Wait (polling every few ms) until a replication or sentinel topology is healthy; errors name the laggard."""

from __future__ import annotations

from opsctl.base.poll import wait_for
from opsctl.plan.health import node_problem, replication_problem, sentinel_problem
from opsctl.runtime.gather import FleetView
from opsctl.runtime.opening import Runtime
from opsctl.spec.layout import Node, sentinel_master_name

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
    import redis

    for node in rt.loaded.layout.sentinels:
        try:
            with rt.admin(node, timeout=2.0) as admin:
                admin.call("SENTINEL", "CKQUORUM", name)
                entry = admin.call("SENTINEL", "MASTER", name)
        except redis.RedisError as exc:
            return f"{node.name}: SENTINEL CKQUORUM {name}: {exc}"
        pairs = entry if isinstance(entry, dict) else dict(zip(entry[::2], entry[1::2], strict=False))
        if "failover_in_progress" in str(pairs.get("flags", "")).split(","):
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
