"""The topology's health in one line, from observed facts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from opsctl.base.connerr import AUTH_HINT, is_auth_failure
from opsctl.base.words import plural
from opsctl.observe.cluster_state import cluster_problems
from opsctl.observe.parse import SLOTS
from opsctl.plan.facts import NodeFacts
from opsctl.plan.health import replication_problem, sentinel_problem
from opsctl.spec.layout import Layout, Node, Shard, sentinel_master_name
from opsctl.spec.load import LoadedSpec


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
