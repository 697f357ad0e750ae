"""A shard's steps in rolling order: replicas first, then the master, failed over first when it must restart and a
replica can take its writes. Used by apply's plan (each node's own steps) and by `opsctl restart`. Pure.

Hosts marked `maintenance: true` serve no master (issue 22, item 6): each shard's master on such a host fails over
gracefully to a member on another host, and apply keeps it so until the mark is removed (a failover is never fixed
back, so nothing moves when it is). Refused (exit 3) before anything changes when a shard has no member elsewhere.
Pure."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from opsctl.base.errors import RefusedError
from opsctl.plan.desired import DesiredNode
from opsctl.plan.facts import FENCE, TO_WRITE, Facts, NodeFacts, fingerprint
from opsctl.plan.masters import current_master, start_master, writer_now
from opsctl.plan.servers import server_steps
from opsctl.plan.steps import NODE_LOCAL, Failover, Plan, RestartNode, StartNode, Step, WaitConverged, WriteConfig
from opsctl.server.versions import Version
from opsctl.spec.layout import Layout, Node, Shard
from opsctl.spec.load import LoadedSpec
from opsctl.spec.model import Spec

NodeSteps = Callable[[Node, bool], list[Step]]


def shard_steps(layout: Layout, shard: Shard, desired: Mapping[str, DesiredNode], facts: Facts,
                server: tuple[str, Version], together: bool = False, topology: str = "") -> list[Step]:
    follow = start_master(layout, shard, facts) if topology in ("replication", "sentinel") else None

    def steps_of(node: Node, is_master: bool) -> list[Step]:
        steps = server_steps(node, desired[node.name], facts[node.name], is_master, server)
        return _start_as_replica(layout, node, facts[node.name], follow, steps, topology == "sentinel")

    return rolling(layout, shard, facts, steps_of, fail_over=not together)


def _start_as_replica(layout: Layout, node: Node, f: NodeFacts, follow: str | None, steps: list[Step],
                      sentinel: bool = False) -> list[Step]:
    """A stopped node whose shard has another master gets its file written with `replicaof` that master first
    (the executor adds the line from the live state), unless its file already says so. In a Sentinel topology a
    stopped node the sentinels still name as master starts fenced: they may be promoting a replica right now."""
    if follow is None or not any(isinstance(s, StartNode) for s in steps) or \
            any(isinstance(s, WriteConfig) for s in steps):
        return steps
    on_disk = f.on_disk or {}
    if follow == node.name:
        if not sentinel or on_disk.get(TO_WRITE) == FENCE:
            return steps
        why = "starts fenced (refuses writes) until no Sentinel failover of it is in flight, then takes writes"
        return [WriteConfig(node.name, why, f.recorded_digest or ""), *steps]
    master = layout.node(follow)
    if on_disk.get("replicaof", "").split() == [master.address, str(master.port)]:
        return steps
    why = f"starts as a replica of {follow}, the shard's master now (its file would start it as a master)"
    return [WriteConfig(node.name, why, f.recorded_digest or ""), *steps]


def rolling(layout: Layout, shard: Shard, facts: Facts, steps_of: NodeSteps, fail_over: bool = True) -> list[Step]:
    """One shard: replicas first, then the master; a master that must restart is failed over first
    (unless names change: clients and Sentinel use one name per command, so all nodes switch together). A shard
    whose steps only write files and start nodes (a new shard, say) lists its master first: apply runs such steps
    side by side, so the order is the reader's, and a master reads before its replicas."""
    writer = writer_now(layout, shard, facts)
    ordered = [m for m in shard.members if m != writer] + ([writer] if writer else [])
    per_node = [steps_of(node, node.name == writer) for node in map(layout.node, ordered)]
    if writer and all(isinstance(s, NODE_LOCAL) for node_steps in per_node for s in node_steps):
        per_node = [per_node[-1], *per_node[:-1]]  # files and starts only: run side by side, listed master first
        ordered = [writer, *ordered[:-1]]
    steps: list[Step] = []
    for name, node_steps in zip(ordered, per_node, strict=True):
        steps += _fail_over_before_restart(node_steps, shard, facts, name) if fail_over else \
            [_in_shard(s, shard.index) for s in node_steps]
    return steps


def _in_shard(step: Step, shard: int) -> Step:
    return RestartNode(step.node, step.reason, step.needs_downtime, shard) if isinstance(step, RestartNode) else step


def restart_plan(loaded: LoadedSpec, facts: Facts, selected: set[str], spec_digest: str) -> Plan:
    """`opsctl restart`: the selected nodes, shard by shard, replicas first, masters after a failover."""
    layout = loaded.layout

    def steps_of(node: Node, is_master: bool) -> list[Step]:
        return [RestartNode(node.name, "restart requested", needs_downtime=is_master)] \
            if node.name in selected else []

    steps: list[Step] = []
    for shard in layout.shards:
        steps += rolling(layout, shard, facts, steps_of)
    steps += [RestartNode(n.name, "restart requested") for n in layout.sentinels if n.name in selected]
    if steps and loaded.spec.topology != "standalone":
        steps.append(WaitConverged(layout.nodes[0].name, "wait until every node agrees"))
    return Plan(loaded.spec.name, spec_digest, fingerprint(facts), tuple(steps))


def _fail_over_before_restart(steps: list[Step], shard: Shard, facts: Facts, name: str) -> list[Step]:
    """Insert a failover before a master's restart. Its new file is written after the failover, because the
    failover's CONFIG REWRITE would otherwise write the old live values back into it."""
    live_replicas = [m for m in shard.members if m != name and (r := facts[m].role) and r.kind == "replica"]
    restart = next((s for s in steps if isinstance(s, RestartNode)), None)
    if restart is None or not (restart.needs_downtime and live_replicas):
        return [_in_shard(s, shard.index) for s in steps]
    writes = [s for s in steps if isinstance(s, WriteConfig)]
    others = [s for s in steps if not isinstance(s, (WriteConfig, RestartNode))]
    failover = Failover(name, f"{name} must restart; its writes move to an updated replica first", shard.index)
    return [*others, failover, *writes, RestartNode(name, restart.reason, needs_downtime=False, shard=shard.index)]


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
