"""The fewest member moves that even out a cluster's load over its hosts (issue 22, item 2): members per host within
one of each other where anti-affinity allows, masters spread as a tie-break, no two members of a shard on one host.
Each move is a drain of one member for load (spec.placement.Move): a replacement on the target host, synced, a master
failed over first, then the member forgotten, stopped and purged. Pure; the rules: docs/changing-the-fleet.md.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

from opsctl.spec.deployed import Deployed, name_index
from opsctl.spec.load import LoadedSpec
from opsctl.spec.model import Spec
from opsctl.spec.placement import Move


def rebalancing(spec: Spec) -> bool:
    """Whether placement moves members to even out load: cluster.rebalance_placement (or `cluster rebalance
    --placement`, which sets it for its run)."""
    return spec.topology == "cluster" and spec.cluster_or_default().rebalance_placement


def with_rebalancing(loaded: LoadedSpec) -> LoadedSpec:
    """loaded with cluster.rebalance_placement on (`cluster rebalance --placement` for its run; the file unchanged)."""
    if loaded.spec.topology != "cluster":
        return loaded
    cluster = loaded.spec.cluster_or_default().model_copy(update={"rebalance_placement": True})
    return replace(loaded, spec=loaded.spec.model_copy(update={"cluster": cluster}))


@dataclass
class _Member:
    name: str
    shard: int
    host: str
    master: bool
    index: int


def placement_moves(spec: Spec, deployed: Sequence[Deployed], serving: Collection[str] = ()) -> tuple[Move, ...]:
    """The moves for spec given what is deployed. serving: the masters now (else the recorded ones count).
    First the moves a stopped run left half done (a shard with a surplus member: the one on the most loaded host
    retires); then, once every shard has exactly its members, greedy moves from the most to the least loaded host.
    Why greedy: each move lowers the sum of squared loads, so it ends, and it moves nothing that needs no move."""
    topo = spec.cluster_or_default()
    if spec.topology != "cluster" or topo.replicas_per_master == 0:
        return ()  # a lone member's move would be a slot move: not a placement move
    members = _members(spec, deployed, serving)
    load = {h.name: sum(1 for m in members if m.host == h.name) for h in spec.hosts}
    finishing = _finishing(members, load, topo.replicas_per_master + 1)
    kept = [m for m in members if m.name not in {f.name for f in finishing}]
    complete = all(sum(1 for m in kept if m.shard == s) == topo.replicas_per_master + 1
                   for s in range(1, topo.masters + 1))
    return tuple(finishing) + (tuple(_even(spec, kept)) if complete else ())


def _members(spec: Spec, deployed: Sequence[Deployed], serving: Collection[str]) -> list[_Member]:
    """The live members of the spec's shards on the spec's hosts (drained and surplus shards are not load to even)."""
    hosts = {h.name for h in spec.hosts}
    masters = spec.cluster_or_default().masters
    live = [d for d in deployed if not d.retired and d.host in hosts and d.shard and 1 <= d.shard <= masters]
    return [_Member(d.name, d.shard or 0, d.host, _is_master(d, live, set(serving)), name_index(spec, d.name) or 0)
            for d in live]


def _is_master(d: Deployed, live: list[Deployed], serving: set[str]) -> bool:
    """d serves its shard now; the recorded role when no member of the shard says so, or when two do (a failover
    under way: the promoted one's word reaches the old master a moment later)."""
    claiming = [m for m in live if m.shard == d.shard and m.name in serving]
    if len(claiming) == 1:
        return d is claiming[0]
    return d.role == "master" and (not claiming or d in claiming)


def _finishing(members: list[_Member], load: dict[str, int], size: int) -> list[Move]:
    """A shard with more members than size: a move stopped after its replacement was deployed. The surplus on the
    most loaded hosts retire (never a master; ties: the oldest, which a move replaces), so a re-run finishes it."""
    out = []
    for shard in sorted({m.shard for m in members}):
        mine = [m for m in members if m.shard == shard]
        surplus = len(mine) - size
        ranked = sorted((m for m in mine if not m.master), key=lambda m: (-load[m.host], m.index))
        for m in ranked[:max(0, surplus)]:
            load[m.host] -= 1
            out.append(Move(m.name, shard, m.host, "", f"{m.name} on {m.host}: retired, shard {shard} has {len(mine)} "
                                                       f"members (a move to even out load stopped part way)"))
    return out


def _even(spec: Spec, members: list[_Member]) -> list[Move]:
    order = [h.name for h in spec.hosts]
    moves = []
    while (found := _best(order, members)) is not None:
        member, target, why = found
        moves.append(Move(member.name, member.shard, member.host, target, why))
        if member.master:  # failed over first: the role goes to the shard's member on the least-mastered host
            heir = min((m for m in members if m.shard == member.shard and m is not member),
                       key=lambda m: (_masters(members)[m.host], order.index(m.host)))
            heir.master, member.master = True, False
        member.host = target
    return moves


def _masters(members: list[_Member]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for m in members:
        counts[m.host] = counts.get(m.host, 0) + int(m.master)
    return counts


def _best(order: list[str], members: list[_Member]) -> tuple[_Member, str, str] | None:
    """The next move: from the most loaded host to the least loaded one two or more below it that holds no member
    of the moved one's shard; among its candidates the one leaving masters most even, then a replica (no
    failover), then the oldest name. None when no such move exists."""
    load = {h: sum(1 for m in members if m.host == h) for h in order}
    for source in sorted(order, key=lambda h: (-load[h], order.index(h))):
        for target in sorted(order, key=lambda h: (load[h], order.index(h))):
            if load[source] - load[target] < 2:
                break
            taken = {m.shard for m in members if m.host == target}
            candidates = [m for m in members if m.host == source and m.shard not in taken]
            if candidates:
                pick = min(candidates, key=lambda m: (_spread_after(members, m, order), m.master, m.index))
                return pick, target, (f"{pick.name} on {source}: moved to {target} to even out load "
                                      f"({source} {load[source]} members, {target} {load[target]})")
    return None


def _spread_after(members: list[_Member], moved: _Member, order: list[str]) -> int:
    """Max minus min masters per host after moved leaves its host (a master's role goes to a member elsewhere)."""
    counts = _masters(members)
    counts = {h: counts.get(h, 0) for h in order}
    if moved.master:
        heir = min((m for m in members if m.shard == moved.shard and m is not moved),
                   key=lambda m: (counts[m.host], order.index(m.host)))
        counts[moved.host] -= 1
        counts[heir.host] += 1
    return max(counts.values()) - min(counts.values())
