"""Is a cluster converged? Pure checks over every node's CLUSTER NODES view and INFO/CLUSTER INFO.

Like redis-operator's clusterStableNoOpenSlots, but every problem names the node that disagrees and what
differs, so "[ERR] Nodes don't agree about configuration" becomes "orders-4 sees slots 0-5460 owned by ..."."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from opsctl.base.frozen import Frozen, frozen
from opsctl.observe.replies import (
    SLOTS,
    ClusterNodeLine,
    NodeObservation,
    distinct_lines,
    kept_objects,
    master_side_problems,
    myself,
)

SlotMap = tuple[tuple[int, int, str], ...]  # merged (start, end, owner id) ranges, sorted


def even_slot_ranges(masters: int) -> list[tuple[int, int]]:
    """16384 slots split into `masters` contiguous ranges whose sizes differ by at most one."""
    if masters < 1:
        raise ValueError("a cluster needs at least one master")
    base, extra = divmod(SLOTS, masters)
    ranges: list[tuple[int, int]] = []
    start = 0
    for i in range(masters):
        size = base + (1 if i < extra else 0)
        ranges.append((start, start + size - 1))
        start += size
    return ranges


@frozen
class Disagreement(Frozen):
    """One reason a cluster is not converged: the node it concerns and what differs."""

    node: str
    what: str

    def render(self) -> str:
        return f"{self.node}: {self.what}"


def slot_map(view: Sequence[ClusterNodeLine]) -> SlotMap:
    """Who owns which slots in one node's view, as merged ranges. Only masters own slots."""
    ranges = sorted((s, e, line.id) for line in view if line.is_master for s, e in line.slots)
    merged: list[tuple[int, int, str]] = []
    for start, end, owner in ranges:
        if merged and merged[-1][2] == owner and merged[-1][1] + 1 == start:
            merged[-1] = (merged[-1][0], end, owner)
        else:
            merged.append((start, end, owner))
    return tuple(merged)


def _owner_at(smap: SlotMap, slot: int) -> tuple[str | None, int]:
    """The owner of slot and the last slot of the run it belongs to (a gap is owned by None)."""
    for start, end, owner in smap:
        if start <= slot <= end:
            return owner, end
        if start > slot:
            return None, start - 1
    return None, SLOTS - 1


def first_difference(a: SlotMap, b: SlotMap) -> tuple[int, int, str | None, str | None] | None:
    """The first slot range where two maps disagree: (start, end, owner in a, owner in b), or None."""
    if a == b:
        return None
    slot = 0
    while slot < SLOTS:
        owner_a, end_a = _owner_at(a, slot)
        owner_b, end_b = _owner_at(b, slot)
        end = min(end_a, end_b)
        if owner_a != owner_b:
            return slot, end, owner_a, owner_b
        slot = end + 1
    return None


def uncovered(smap: SlotMap) -> list[tuple[int, int]]:
    gaps: list[tuple[int, int]] = []
    nxt = 0
    for start, end, _ in smap:
        if start > nxt:
            gaps.append((nxt, start - 1))
        nxt = max(nxt, end + 1)
    if nxt < SLOTS:
        gaps.append((nxt, SLOTS - 1))
    return gaps


def span(start: int, end: int) -> str:
    return str(start) if start == end else f"{start}-{end}"


class Names:
    """Labels for node ids: 'name (address:port)' when the id is one of the observed nodes."""

    def __init__(self, views: Mapping[str, Sequence[ClusterNodeLine]]) -> None:
        self.by_id: dict[str, str] = {}
        self.endpoints: dict[str, str] = {}
        for line in distinct_lines(views.values()):  # first seen wins, as line by line; ~2n objects, not n² lines
            self.endpoints.setdefault(line.id, line.endpoint)
        for name, view in views.items():
            me = myself(view)
            if me is not None:
                self.by_id[me.id] = name
                self.endpoints[me.id] = me.endpoint

    def label(self, node_id: str | None) -> str:
        if node_id is None:
            return "no master"
        endpoint = self.endpoints.get(node_id, "?")
        name = self.by_id.get(node_id)
        return f"{endpoint} ({name})" if name else f"{node_id[:8]}… ({endpoint})"


def _state_problems(infos: Mapping[str, Mapping[str, str]]) -> list[Disagreement]:
    out: list[Disagreement] = []
    for name, info in infos.items():
        state = info.get("cluster_state")
        if state is not None and state != "ok":
            assigned = info.get("cluster_slots_assigned", "?")
            fail = info.get("cluster_slots_fail", "0")
            out.append(Disagreement(name, f"cluster_state is {state} ({assigned}/{SLOTS} slots assigned, "
                                          f"{fail} failing)"))
        if info.get("role") == "slave" and info.get("master_link_status", "up") != "up":
            out.append(Disagreement(name, f"replica link to {info.get('master_host')}:{info.get('master_port')} "
                                          f"is {info.get('master_link_status')}"))
        out += [Disagreement(name, what) for what in master_side_problems(info)]
    return out


def _open_slot_problems(views: Mapping[str, Sequence[ClusterNodeLine]], names: Names) -> list[Disagreement]:
    """One line per run of consecutive open slots with the same peer, not one per slot."""
    out: list[Disagreement] = []
    for name, view in views.items():
        me = myself(view)
        if me is None:
            continue
        for (start, end), target in _runs(me.migrating):
            out.append(Disagreement(name, f"{_slots(start, end)} is open: MIGRATING to {names.label(target)}"))
        for (start, end), source in _runs(me.importing):
            out.append(Disagreement(name, f"{_slots(start, end)} is open: IMPORTING from {names.label(source)}"))
    return out


def _runs(open_slots: Mapping[int, str]) -> list[tuple[tuple[int, int], str]]:
    runs: list[tuple[tuple[int, int], str]] = []
    for slot, peer in sorted(open_slots.items()):
        if runs and runs[-1][1] == peer and runs[-1][0][1] == slot - 1:
            runs[-1] = ((runs[-1][0][0], slot), peer)
        else:
            runs.append(((slot, slot), peer))
    return runs


def _slots(start: int, end: int) -> str:
    return f"slot {start}" if start == end else f"slot range {start}-{end}"


def _reference(maps: Mapping[str, SlotMap]) -> tuple[str, SlotMap]:
    """The slot map most nodes see (ties: the first node by name) and a node that sees it."""
    counts = Counter(maps.values())
    best = max(counts.values())
    name = next(n for n in sorted(maps) if counts[maps[n]] == best)
    return name, maps[name]


def _slot_problems(views: Mapping[str, Sequence[ClusterNodeLine]], names: Names) -> list[Disagreement]:
    maps = {name: slot_map(view) for name, view in views.items()}
    if not maps:
        return []
    ref_name, ref = _reference(maps)
    agree = sum(1 for m in maps.values() if m == ref)
    out = [Disagreement("cluster", f"slots {span(s, e)} are not served by any master "
                                   f"(as {agree} of {len(maps)} nodes see it, e.g. {ref_name})")
           for s, e in uncovered(ref)]
    for name in sorted(maps):
        diff = first_difference(maps[name], ref)
        if diff is None:
            continue
        start, end, mine, theirs = diff
        out.append(Disagreement(name, f"sees slots {span(start, end)} owned by {names.label(mine)} but "
                                      f"{ref_name} (and {agree - 1} more) sees {names.label(theirs)} owning them"))
    return out


def node_groups(views: Mapping[str, Sequence[ClusterNodeLine]]) -> list[list[str]]:
    """The nodes, by name, in groups that know nothing of each other: two nodes share a group when a chain of views
    links them (a view shows the other's id, or a handshake with its endpoint: a MEET under way).
    One group is one cluster; several never converge, and no slot can move between them. A node known only by an id
    it no longer has is apart."""
    ids = {me.id: name for name, view in views.items() if (me := myself(view)) is not None}
    endpoints = {me.endpoint: name for name, view in views.items() if (me := myself(view)) is not None}
    groups: list[set[str]] = []
    for name, view in sorted(views.items()):
        linked = {name} | {ids[line.id] for line in view if line.id in ids} | \
            {endpoints[line.endpoint] for line in view if "handshake" in line.flags and line.endpoint in endpoints}
        groups = [g for g in groups if not g & linked] + [linked.union(*(g for g in groups if g & linked))]
    return sorted(sorted(g) for g in groups)


UNSETTLED_FLAGS = frozenset({"fail", "fail?", "handshake", "noaddr"})


def _membership_problems(views: Mapping[str, Sequence[ClusterNodeLine]], names: Names) -> list[Disagreement]:
    observed = set(names.by_id)
    out: list[Disagreement] = []
    for name, view in sorted(views.items()):
        known = {line.id: line for line in view}
        missing = sorted(observed - set(known))
        if missing:
            out.append(Disagreement(name, f"does not know {', '.join(names.label(i) for i in missing)}"))
        for line in view:
            bad = line.flags & UNSETTLED_FLAGS
            if bad and not line.is_myself:
                out.append(Disagreement(name, f"sees {names.label(line.id)} as {','.join(sorted(bad))}"))
            elif line.id not in observed:
                out.append(Disagreement(name, f"knows {names.label(line.id)}, which is not an observed node"))
    return out


def _role_problems(views: Mapping[str, Sequence[ClusterNodeLine]], names: Names) -> list[Disagreement]:
    """Each node's own role (from its myself line) against how every other node sees it."""
    own = {me.id: me.master_id for view in views.values() if (me := myself(view)) is not None}
    wrong = kept_objects(views.values(), lambda line: not line.is_myself and line.id in own
                         and line.master_id != own[line.id])
    out: list[Disagreement] = []
    for name, view in sorted(views.items()):
        if wrong is not None and wrong.isdisjoint(map(id, view)):  # a view that sees every role right
            continue
        for line in view:
            if line.is_myself or line.id not in own or line.master_id == own[line.id]:
                continue
            seen = f"a replica of {names.label(line.master_id)}" if line.master_id else "a master"
            actual = f"a replica of {names.label(own[line.id])}" if own[line.id] else "a master"
            out.append(Disagreement(name, f"sees {names.label(line.id)} as {seen} but it is {actual}"))
    return out


def _epoch_problems(views: Mapping[str, Sequence[ClusterNodeLine]], names: Names) -> list[Disagreement]:
    seen: dict[int, str] = {}
    out: list[Disagreement] = []
    for name, view in sorted(views.items()):
        me = myself(view)
        if me is None or not me.is_master:
            continue
        if me.config_epoch in seen:
            out.append(Disagreement(name, f"has config epoch {me.config_epoch}, the same as master "
                                          f"{seen[me.config_epoch]}"))
        else:
            seen[me.config_epoch] = name
    return out


def cluster_problems(views: Mapping[str, Sequence[ClusterNodeLine]],
                     infos: Mapping[str, Mapping[str, str]]) -> list[Disagreement]:
    """Everything that keeps a cluster from being converged; empty means converged.

    views: node name -> its CLUSTER NODES; infos: node name -> INFO merged with CLUSTER INFO.
    """
    names = Names(views)
    return [*_state_problems(infos), *_open_slot_problems(views, names), *_slot_problems(views, names),
            *_membership_problems(views, names), *_role_problems(views, names), *_epoch_problems(views, names)]


def voting_masters(views: Iterable[Sequence[ClusterNodeLine]]) -> tuple[set[str], set[str]]:
    """(ids of the slot-owning masters among the views' own nodes: those that answer, ids of every master any view
    shows serving slots: the servers' cluster_size). An election, and a failure flag, need more than half of the
    second to answer; without that the cluster never promotes a replica by itself."""
    views = list(views)
    serving = {line.id for view in views for line in view if line.is_master and line.slots}
    return {me.id for view in views if (me := myself(view)) is not None and me.id in serving}, serving


def no_master_hint(views: Iterable[Sequence[ClusterNodeLine]], then: str) -> str:
    """The way on for a shard whose master does not answer, from the views of the nodes that do: the cluster's own
    election while the slot-owning masters that answer are a majority; without one it never comes, and waiting for
    it is a dead end (issue 33, item 3)."""
    answering, serving = (len(ids) for ids in voting_masters(views))
    if answering > serving // 2:
        return (f"wait for the cluster to promote a replica (or start the node again), then {then}. A replica cut off "
                "from its master longer than cluster.replica_validity_factor allows is never elected: if the host is "
                "gone for good, give its entry in the spec the new machine's address and run `opsctl apply`: it "
                "promotes that replica (CLUSTER FAILOVER FORCE)")
    return (f"the cluster cannot promote a replica: {answering} of {serving} slot-owning masters answer, an election "
            f"needs {serving // 2 + 1}. Start the masters that are down again; if a host is gone for good, give its "
            "entry in the spec the new machine's address (or remove it) and run `opsctl apply`: it promotes the "
            f"replica holding the most data (CLUSTER FAILOVER TAKEOVER) and replaces the host; then {then}")


def observed_problems(observations: dict[str, NodeObservation]) -> list[Disagreement]:
    """cluster_problems over the nodes that answered, plus one line per node that did not."""
    out = [Disagreement(name, f"unreachable: {o.error}") for name, o in observations.items() if not o.reachable]
    out += [Disagreement(name, f"has no cluster view: {o.error}") for name, o in observations.items()
            if o.reachable and o.cluster_nodes is None]
    views = {n: o.cluster_nodes for n, o in observations.items() if o.cluster_nodes is not None}
    infos = {n: o.info for n, o in observations.items() if o.cluster_nodes is not None}
    return out + cluster_problems(views, infos)
