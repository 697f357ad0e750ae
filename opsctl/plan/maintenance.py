"""Hosts marked `maintenance: true` serve no master (issue 22, item 6): each shard's master on such a host fails over
gracefully to a member on another host, and apply keeps it so until the mark is removed (a failover is never fixed
back, so nothing moves when it is). Refused (exit 3) before anything changes when a shard has no member elsewhere.
Pure."""

from __future__ import annotations

from collections.abc import Collection

from opsctl.base.errors import RefusedError
from opsctl.plan.facts import Facts
from opsctl.plan.masters import current_master
from opsctl.plan.steps import Failover
from opsctl.spec.layout import Layout, Shard
from opsctl.spec.model import Spec

RULE = "a host marked maintenance serves no master"


def held_hosts(spec: Spec) -> set[str]:
    return {h.name for h in spec.hosts if h.maintenance}


def _elsewhere(layout: Layout, shard: Shard, master: str, held: set[str]) -> list[str]:
    return [m for m in shard.members if m != master and layout.node(m).host not in held]


def refuse_unmovable(spec: Spec, layout: Layout) -> None:
    """Every shard with a member on a held host needs a member elsewhere to serve as its master."""
    held = held_hosts(spec)
    stuck = [s.index for s in layout.shards if held and all(layout.node(m).host in held for m in s.members)]
    if stuck:
        raise RefusedError(f"refused by the maintenance rule ({RULE}): shard(s) {', '.join(map(str, stuck))} have "
                           "no member on a host without the mark",
                           f"hosts under maintenance: {', '.join(sorted(held))}; their masters could not fail over",
                           "add a replica on another host first (cluster.replicas_per_master, or a replica host), "
                           "or remove the mark from one of these hosts")


def maintenance_failovers(spec: Spec, layout: Layout, facts: Facts, moving: Collection[str]) -> list[Failover]:
    """A graceful failover of each running master on a held host to a member elsewhere (one that follows it
    first); in a Sentinel topology Sentinel chooses, and the held hosts' replicas carry replica-priority 0."""
    held = held_hosts(spec)
    steps = []
    for shard in layout.shards if held else ():
        master = current_master(shard, layout, facts)
        node, f = layout.node(master), facts.get(master)
        if node.host not in held or master in moving or f is None or f.role is None or f.role.kind != "master":
            continue
        others = _elsewhere(layout, shard, master, held)
        linked = [m for m in others if (r := facts[m].role) is not None and r.kind == "replica"
                  and r.master == (node.address, node.port)]
        to = "" if spec.topology == "sentinel" else (linked or others)[0]
        steps.append(Failover(master, f"{node.host} is marked maintenance ({RULE}): its writes move to a member "
                                      "on another host", shard=shard.index, to=to))
    return steps
