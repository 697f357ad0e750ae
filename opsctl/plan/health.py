"""Pure health checks of replication and sentinel topologies from observed facts (None = healthy).

The topology's health in one line, from observed facts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from opsctl.base.errors import AUTH_HINT, auth_failed, is_auth_failure, not_answering
from opsctl.base.events import plural
from opsctl.observe.cluster_state import cluster_problems
from opsctl.observe.replies import SLOTS, listed_replicas, master_side_problems
from opsctl.plan.facts import NodeFacts
from opsctl.plan.masters import sentinel_agreed_master, shard_master
from opsctl.spec.layout import Layout, Node, Shard, sentinel_master_name
from opsctl.spec.load import LoadedSpec

MAX_LAG_BYTES = 1024 * 1024


def replication_problem(layout: Layout, facts: Mapping[str, NodeFacts]) -> str | None:
    walls = [n.name for n in layout.servers if facts[n.name].fenced]
    if walls:
        return (f"{', '.join(walls)} fenced by an interrupted failover (refuses writes): "
                "`opsctl apply` or `opsctl failover` finishes it")
    shard = layout.shards[0]
    master = shard_master(layout, shard, facts)
    target = layout.node(master)
    master_role = facts[master].role
    if master_role is None and is_auth_failure(facts[master].error):
        return auth_failed(master)
    if master_role is None or master_role.kind != "master":
        return f"{master} is not answering as master"
    for name in shard.members:
        if name == master:
            continue
        role = facts[name].role
        if role is None:
            return not_answering(name, facts[name].error)
        if role.kind != "replica" or role.master != (target.address, target.port):
            return f"{name} is a {role.kind}, not a replica of {master} ({target.endpoint})"
        if role.link != "connected":
            return f"{name}'s link to {master} is {role.link}"
        if master_role.offset - role.offset > MAX_LAG_BYTES:
            return f"{name} lags {master_role.offset - role.offset} bytes behind {master}"
    counted = master_side_problems(facts[master].info)
    return f"{master} {counted[0]}" if counted else None


def sentinel_problem(layout: Layout, facts: Mapping[str, NodeFacts], master_name: str) -> str | None:
    """Every sentinel sees the same master, status ok, all replicas and all other sentinels; while placement retires
    nodes (spec.replplacement) they may count those too, until the plan's SENTINEL RESET."""
    sentinels = layout.sentinels
    replicas = len(layout.shards[0].replicas)
    leaving = sum(1 for n in layout.retired if not n.is_sentinel), sum(1 for n in layout.retired if n.is_sentinel)
    masters: set[tuple[str, int]] = set()
    for node in sentinels:
        f = facts[node.name]
        line = dict(part.split("=", 1) for part in f.info.get("master0", "").split(",") if "=" in part)
        if not f.reachable:
            return not_answering(node.name, f.error)
        if line.get("name") != master_name:
            return f"{node.name} does not monitor '{master_name}'"
        if line.get("status") != "ok":
            return f"{node.name} sees master status {line.get('status')}"
        if not replicas <= int(line.get("slaves", "0")) <= replicas + leaving[0]:
            return f"{node.name} sees {line.get('slaves')} replicas, expected {_counted(replicas, leaving[0])}"
        if not len(sentinels) <= int(line.get("sentinels", "0")) <= len(sentinels) + leaving[1]:
            return (f"{node.name} sees {line.get('sentinels')} sentinels, expected "
                    f"{_counted(len(sentinels), leaving[1])}")
        address, port = line["address"].rsplit(":", 1)
        masters.add((address, int(port)))
    if len(masters) > 1:
        return f"sentinels disagree about the master: {sorted(masters)}"
    return _sentinels_behind(layout, facts)


def _counted(count: int, leaving: int) -> str:
    return f"{count} to {count + leaving} (the retired ones until SENTINEL RESET)" if leaving else str(count)


def _sentinels_behind(layout: Layout, facts: Mapping[str, NodeFacts]) -> str | None:
    """The sentinels agree on a node that no longer answers as master, while another one does (they have not
    confirmed a promotion yet): clients that ask them still reach the old master."""
    agreed = sentinel_agreed_master(layout, facts)
    running = [n.name for n in layout.servers if (r := facts[n.name].role) and r.kind == "master"]
    if agreed is not None and len(running) == 1 and running != [agreed]:
        return f"the sentinels name {agreed} as master, but {running[0]} is the master (not confirmed yet)"
    return None


def node_problem(loaded: LoadedSpec, facts: Mapping[str, NodeFacts], node: Node) -> str | None:
    """Is this one node healthy in its place? A replica must be linked to a master and caught up."""
    f = facts[node.name]
    if not f.reachable:
        return not_answering(node.name, f.error)
    if node.is_sentinel:
        return None if f.sentinel_master else f"{node.name} does not monitor a master yet"
    role = f.role
    if role is None:
        return f"{node.name} has no role yet"
    if loaded.spec.topology == "cluster" and f.info.get("cluster_state") != "ok":
        return f"{node.name} reports cluster_state:{f.info.get('cluster_state')}"
    if role.kind != "replica":
        return None
    if role.link != "connected" or role.master is None:
        return f"{node.name}'s link to its master is {role.link}"
    upstream = loaded.layout.find(f"{role.master[0]}:{role.master[1]}")
    master_role = facts[upstream.name].role if upstream else None
    if master_role and master_role.offset - role.offset > MAX_LAG_BYTES:
        return f"{node.name} lags {master_role.offset - role.offset} bytes behind its master"
    if upstream is None:
        return None
    state = next((r.get("state") for r in listed_replicas(facts[upstream.name].info)
                  if r.get("ip") == node.address and r.get("port") == str(node.port)), "online")
    return None if state == "online" else f"{upstream.name} lists {node.name} as {state} (its sync is not done)"


def health_line(loaded: LoadedSpec, facts: Mapping[str, NodeFacts]) -> tuple[bool, str]:
    layout = loaded.layout
    silent = [n.name for n in layout.nodes if not facts[n.name].reachable]
    refused = [name for name in silent if is_auth_failure(facts[name].error)]
    down = [name for name in silent if name not in refused]
    topology = loaded.spec.topology
    if silent:
        parts = [f"authentication failed for {', '.join(refused)}"] if refused else []
        parts += [f"{len(down)} node(s) down: {', '.join(down)}"] if down else []
        return False, f"{topology} degraded: {'; '.join(parts)}"
    if topology == "cluster":
        views = {n.name: list(facts[n.name].cluster_nodes or []) for n in layout.servers}
        infos = {n.name: facts[n.name].info for n in layout.servers}
        problems = cluster_problems(views, infos)
        if problems:
            return False, f"cluster degraded: {problems[0].node}: {problems[0].what}" + (
                f" (+{len(problems) - 1} more)" if len(problems) > 1 else "")
        masters = sum(1 for n in layout.servers if (r := facts[n.name].role) and r.kind == "master")
        return True, (f"cluster ok: {SLOTS}/{SLOTS} slots, {plural(masters, 'master')}, "
                      f"{plural(len(layout.servers) - masters, 'replica')}, all nodes agree")
    if topology in ("replication", "sentinel"):
        problem = replication_problem(layout, facts)
        if problem is None and topology == "sentinel":
            problem = sentinel_problem(layout, facts, sentinel_master_name(loaded.spec))
        if problem:
            return False, f"{topology} degraded: {problem}"
        extra = f", {plural(len(layout.sentinels), 'sentinel')} agree" if topology == "sentinel" else ""
        return True, f"{topology} ok: 1 master, {plural(len(layout.shards[0].replicas), 'replica')} linked{extra}"
    return True, "standalone ok"


def health_hint(facts: Mapping[str, NodeFacts]) -> str:
    """How to fix what status found, for what has one fix (a refused password); else the general advice."""
    if any(not f.reachable and is_auth_failure(f.error) for f in facts.values()):
        return AUTH_HINT
    return "`opsctl apply -f SPEC` starts what is down and re-links replicas; the node logs say why one stopped"


def deployed_view(layout: Layout, facts: Mapping[str, NodeFacts]) -> tuple[Layout, tuple[Node, ...]]:
    """What status judges: the layout's nodes that are deployed (a record, or a process) and the retired ones that
    still run (drained from a host the spec lost, at their recorded address, until the apply that removes them);
    and, apart, the nodes the next apply adds (no record, no process, while something is deployed): to be added,
    not down. With nothing deployed at all, the layout as it is (every node down)."""
    if not any(f.record or f.running for f in facts.values()):
        return layout, ()
    pending = tuple(n for n in layout.nodes if not facts[n.name].record and not facts[n.name].running)
    names = {n.name for n in pending}
    retiring = tuple(n for n in layout.retired if n.name in facts and facts[n.name].running)
    if not pending and not retiring:
        return layout, ()
    kept = tuple(n for n in layout.nodes if n.name not in names)
    shards = tuple(Shard(s.index, s.master, tuple(r for r in s.replicas if r not in names)) for s in layout.shards)
    return replace(layout, nodes=(*kept, *retiring), shards=shards), pending
