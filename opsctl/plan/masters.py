"""Which node is a shard's master now, from observed facts: for the planner, status and failover checks. Pure."""

from __future__ import annotations

from opsctl.base.errors import RefusedError
from opsctl.plan.facts import Facts, NodeFacts
from opsctl.spec.layout import Layout, Shard, endpoint


def current_master(shard: Shard, layout: Layout, facts: Facts) -> str:
    """The shard's master now: the one answer for every step and check pointing at it; refused when facts cannot tell.
    In order: the master that serves (replicas, slots), the one holding keys, the declared one if it runs as a
    master, the one promoted from a replica, the declared one. A master fenced by an interrupted failover is not it
    while another master exists."""
    masters = live_masters(shard, facts)
    masters = [m for m in masters if not facts[m].fenced] or masters
    if not masters:
        return shard.master  # none runs as master: the declared one starts as one from its file
    active = [m for m in masters if _serves(m, shard, layout, facts)]
    if len(active) > 1:
        both_slots = sum(1 for m in active if has_slots(facts[m])) > 1
        raise RefusedError(f"shard {shard.index} has {len(active)} masters serving data: {', '.join(active)}",
                           "making one a replica would drop its writes",
                           "they serve different slots: `opsctl cluster fix -f SPEC` moves one's slots to the "
                           "other and makes it its replica, then apply again" if both_slots else
                           "decide which one holds the data you want, stop the other, then apply again")
    stranded = [m for m in masters if m not in active and facts[m].myself is not None and facts[m].keys > 0]
    if active and stranded:
        raise RefusedError(f"shard {shard.index}: {', '.join(stranded)} serves no slot but holds keys, beside "
                           f"its master {active[0]}", "a shard merge that stopped before its CLUSTER REPLICATE "
                           "leaves such a node; making it a replica would drop keys that may exist nowhere else",
                           "`opsctl cluster fix -f SPEC` hands its keys to their slots' masters and makes it a "
                           "replica, then apply again")
    if active:
        return active[0]
    with_keys = [m for m in masters if facts[m].keys > 0]
    if shard.master in with_keys or (not with_keys and shard.master in masters):
        return shard.master
    taking_over = max(with_keys, key=lambda m: facts[m].keys) if with_keys else \
        _promoted_master(shard, masters, facts)
    if taking_over != shard.master:
        _refuse_lesser_master(shard, layout, taking_over, facts)
    return taking_over


def _promoted_master(shard: Shard, masters: list[str], facts: Facts) -> str:
    """No master serves or holds keys, and the declared one is not among them. One promoted from a replica is the
    master (whoever promoted it chose it; _refuse_lesser_master checks it holds what the others hold). A master
    never promoted does not take over from the declared one: that may be down with its data on disk."""
    promoted = [m for m in masters if facts[m].promoted]
    if len(promoted) > 1:
        raise RefusedError(f"shard {shard.index}: opsctl cannot tell which master is the shard's master now: "
                           f"{', '.join(promoted)} were promoted from replicas, and none serves a replica or "
                           "holds keys", "making the others replicas of a guess may drop writes they took",
                           "point the others at the one you want (REPLICAOF its-address its-port on each), then "
                           f"apply again; {RENAMED}")
    return promoted[0] if promoted else shard.master


# What a master streams to its replicas every repl-ping-replica-period, and the shortest thing it streams: any
# write is longer, a transaction counts whole (a replica's offset moves past MULTI..EXEC at once).
HEARTBEAT = len(b"*1\r\n$4\r\nPING\r\n")
RENAMED = ("REPLICAOF may run under another name (in password mode opsctl derives one: "
           "hardening.rename_takeover_commands): `opsctl render -f SPEC --dir -` prints it in the rename-command lines")


def _refuse_lesser_master(shard: Shard, layout: Layout, master: str, facts: Facts) -> None:
    """Refuse `master` taking over from the declared one while nothing follows it and it may lack data: every other node
    would be emptied by a full sync from it.
    Refused while a running member holds data it lacks, or while it holds no keys and no running member shows it
    synced before its promotion. Once a replica names it, it serves and is not asked."""
    f = facts[master]
    others = [m for m in shard.members if m != master and facts[m].reachable]
    unwritable = _fenced_histories(shard, facts)
    ahead = [m for m in others if _holds_more(facts[m], f, unwritable)]
    node, declared = layout.node(master), shard.master
    wait = "wait until the sentinels agree on the master (a failover may be in flight), or " if layout.sentinels \
        else ""
    if ahead:
        best = max(ahead, key=lambda m: (-1 if (p := _past(facts[m], f, unwritable)) is None else p, facts[m].keys))
        to_best, role = layout.node(best), facts[best].role
        promote = f"REPLICAOF NO ONE on {best}, then " if role is not None and role.kind == "replica" else ""
        later = "" if declared in others else f" (and {declared} once it starts, with what it has on disk)"
        heartbeats = f" Offsets count the heartbeats a master streams too (a PING of {HEARTBEAT} bytes every " \
            "repl-ping-replica-period): a node ahead only by a few of them holds no more data; compare the keys." \
            if any(_past(facts[m], f, unwritable) is not None for m in ahead) else ""
        raise RefusedError(
            f"shard {shard.index}: {master} would take over as master ({_held(master, layout, facts)}), but "
            f"{', '.join(f'{m} ({_held(m, layout, facts)})' for m in ahead)} "
            f"{'holds' if len(ahead) == 1 else 'hold'} data it lacks",
            f"no node follows {master} yet: as its replicas {', '.join(ahead)}{later} would be emptied by a full "
            f"sync.{heartbeats}",
            f"{wait}choose whose data set to keep, then apply again: {master}'s (REPLICAOF {node.address} "
            f"{node.port} on {', '.join(others)}), or {best}'s ({promote}REPLICAOF {to_best.address} "
            f"{to_best.port} on {master}); {RENAMED}")
    if f.keys == 0 and not _took_the_data(f, [facts[m] for m in others]):
        held = layout.node(declared)
        back = f"apply then starts {declared} as the master" if declared not in others else \
            f"then REPLICAOF NO ONE on {declared} and apply again"
        keep = f"point {', '.join(others)} at it (REPLICAOF {node.address} {node.port} on each)" if others else \
            f"let it take writes first (no other node runs to follow it): once it holds keys, apply makes " \
            f"{declared} its replica, and {declared}'s data is dropped"
        raise RefusedError(
            f"shard {shard.index}: {master} would take over as master, but it holds no keys and no running node "
            f"shows it had taken {declared}'s data before its promotion ({_held(master, layout, facts)})",
            f"{declared} does not run as master and may hold the data on its disk: started as {master}'s "
            "replica it would be emptied",
            f"{wait}to keep {declared}'s data, make {master} its replica again (REPLICAOF {held.address} "
            f"{held.port} on {master}): {back}; to keep {master} as the master, {keep}; {RENAMED}")


def _fenced_histories(shard: Shard, facts: Facts) -> set[str]:
    """Replication ids of fenced masters' streams, which offsets do not judge (keys judge them instead).
    A fenced master refused writes since the promotion its failover made, so what it and its replicas got past that
    point is heartbeats and expiries, no data the promoted one lacks."""
    return {h[0] for m in shard.members if (f := facts[m]).fenced and f.role is not None
            and f.role.kind == "master" and (h := f.history) is not None}


def _past(member: NodeFacts, master: NodeFacts, unwritable: set[str]) -> int | None:
    """How far member got past the offset master was promoted at, on that same replication history; None where
    offsets do not tell (another history, unknown, or a fenced master's)."""
    was, has = master.promoted_at, member.history
    if was is None or has is None or was[0] != has[0] or has[0] in unwritable:
        return None
    return has[1] - was[1]


def _holds_more(member: NodeFacts, master: NodeFacts, unwritable: set[str]) -> bool:
    """member has writes master lacks: more than one heartbeat past the offset master was promoted at (one PING
    further is no write); more keys where offsets do not tell."""
    past = _past(member, master, unwritable)
    return member.keys > master.keys if past is None else past > HEARTBEAT


def _took_the_data(master: NodeFacts, others: list[NodeFacts]) -> bool:
    """A running member shares the history master was promoted from: master had synced with their master."""
    was = master.promoted_at
    return was is not None and any((h := o.history) is not None and h[0] == was[0] for o in others)


def _held(name: str, layout: Layout, facts: Facts) -> str:
    """What a node holds, for a refusal: keys, replication offset, whom it follows."""
    f = facts[name]
    parts = [f"{f.keys} keys"]
    if f.promoted_at is not None:
        parts.append(f"promoted at offset {f.promoted_at[1]}")
    elif f.history is not None:
        parts.append(f"offset {f.history[1]}")
    if f.role is not None and f.role.kind == "replica" and f.role.master:
        upstream = layout.find(endpoint(*f.role.master))
        parts.append(f"a replica of {upstream.name if upstream else endpoint(*f.role.master)}")
    return ", ".join(parts)


def live_masters(shard: Shard, facts: Facts) -> list[str]:
    """Members that answer as masters now."""
    return [m for m in shard.members if (r := facts[m].role) and r.kind == "master"]


def _serves(master: str, shard: Shard, layout: Layout, facts: Facts) -> bool:
    """Has slots, or replicas: listed by its ROLE (online ones), or naming it in theirs, whatever their link's
    state (a replica pointed at it a moment ago is still in its handshake or waiting for its sync)."""
    f = facts[master]
    if has_slots(f) or (f.role is not None and f.role.replicas):
        return True
    node = layout.node(master)
    return any((r := facts[m].role) and r.kind == "replica" and r.master == (node.address, node.port)
               for m in shard.members if m != master)


def shard_master(layout: Layout, shard: Shard, facts: Facts) -> str:
    """Where nodes are pointed, sentinels too: the master the sentinels agree on, unless another node runs as
    master and it does not (right after a promotion the sentinels may still name the dead one); else
    current_master."""
    agreed = sentinel_agreed_master(layout, facts)
    live = live_masters(shard, facts)
    if agreed is not None and (agreed in live or not live):
        return agreed
    return current_master(shard, layout, facts)


def writer_now(layout: Layout, shard: Shard, facts: Facts) -> str | None:
    """The member that takes the shard's writes now: its master (shard_master, as every step that points at it),
    once it answers as one; in a cluster, once it serves slots. A master that is down counts (the rolling order
    starts it last). None: no member takes writes (the decided master runs as a replica, or a new cluster shard)."""
    master = shard_master(layout, shard, facts)
    f = facts[master]
    if f.role is None:
        return master
    return master if f.role.kind == "master" and (f.cluster_nodes is None or has_slots(f)) else None


def writes_moved_from(layout: Layout, shard: Shard, node: str, facts: Facts) -> str | None:
    """Who took node's writes since the plan named node the master, when a step that fails node over runs: the
    member that takes them now (writer_now), answering, when that is another node (an operator's failover, or
    Sentinel's or the cluster's own). None: node still takes them, or the look cannot tell (a failover in flight,
    the master down): the failover runbook's checks decide."""
    writer = writer_now(layout, shard, facts)
    return writer if writer is not None and writer != node and facts[writer].role is not None else None


def takes_writes(layout: Layout, shard: Shard, node: str, facts: Facts) -> bool:
    """node answers as the member taking the shard's writes now (writer_now): restarting it stops them, whatever
    the plan said node was (a failover since the plan may have promoted it)."""
    return writer_now(layout, shard, facts) == node and facts[node].role is not None


def start_master(layout: Layout, shard: Shard, facts: Facts) -> str | None:
    """Whom a stopped node of a replication/Sentinel shard starts as a replica of (itself: it starts as the
    master): the shard's master, or None when no master runs and no sentinels agree on one (each file says what
    its node was). A node that starts as a master next to another one takes writes its conversion throws away."""
    if not live_masters(shard, facts):
        return sentinel_agreed_master(layout, facts)
    return shard_master(layout, shard, facts)


def follow_target(layout: Layout, shard: Shard, node: str, facts: Facts) -> str | None:
    """Whom a running node is pointed at when its step runs: the shard's master in that look (shard_master), not the one
    the plan named, which the plan's own failover may have moved. None: node is that master itself.
    Refused when the look has no master to follow: two serving, or the one decided on does not answer as a master."""
    master = shard_master(layout, shard, facts)
    if master == node:
        return None
    role = facts[master].role
    if role is None or role.kind != "master":
        what = "does not answer" if role is None else f"answers as a {role.kind}"
        raise RefusedError(f"shard {shard.index} has no master to point {node} at: {master}, its master from what "
                           f"the nodes say now, {what}", f"{node} is left as it is: the shard's roles changed "
                           "since the plan was made (a failover in flight, or its master stopped)",
                           "apply again once a master answers (opsctl status shows the roles)")
    return master


def sentinel_agreed_master(layout: Layout, facts: Facts) -> str | None:
    """The master the sentinels agree on, if they agree and it is one of our nodes."""
    seen = {f.sentinel_master[1:] for n in layout.sentinels if (f := facts[n.name]).sentinel_master}
    if len(seen) != 1:
        return None
    address, port = next(iter(seen))
    node = layout.find(f"{address}:{port}")
    return node.name if node and not node.is_sentinel else None


def cluster_endpoints(facts: Facts) -> set[str] | None:
    """The endpoints the cluster knows: every line of the views of the running nodes that serve slots (a node a
    scale-in removed serves none, its old view does not count). None when no node serving slots answers."""
    views = [f.cluster_nodes for f in facts.values() if f.running and f.cluster_nodes and has_slots(f)]
    return {line.endpoint for view in views for line in view} if views else None


def has_slots(f: NodeFacts) -> bool:
    """Whether the node serves slots (its own line of CLUSTER NODES lists some)."""
    me = f.myself
    return bool(me and me.slots)
