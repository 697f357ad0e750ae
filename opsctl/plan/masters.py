"""Which node is a shard's master now, from observed facts: for the planner, status and failover checks. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from opsctl.errors import RefusedError
from opsctl.failover.fencing import fenced
from opsctl.plan.facts import NodeFacts
from opsctl.spec.layout import Layout, Shard

Facts = Mapping[str, NodeFacts]


def current_master(shard: Shard, layout: Layout, facts: Facts) -> str:
    """The shard's master now: the one answer for every step and check that points at it. Roles move (a
    failover, an operator's REPLICAOF NO ONE) and that is fine; when the facts cannot tell, it refuses.
    In order: the master that serves (replicas, slots), the one holding keys, the declared one if it runs as a
    master, the one promoted from a replica, the declared one. A master fenced by an interrupted failover is not
    it while another master exists."""
    masters = live_masters(shard, facts)
    masters = [m for m in masters if not fenced(facts[m].config)] or masters
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
    if with_keys:
        return shard.master if shard.master in with_keys else max(with_keys, key=lambda m: facts[m].keys)
    if shard.master in masters:
        return shard.master
    return _promoted_master(shard, masters, facts)


def _promoted_master(shard: Shard, masters: list[str], facts: Facts) -> str:
    """No master serves or holds keys, and the declared one is not among them. One promoted from a replica is the
    master (a replica promoted before its master streamed it a write is empty; whoever promoted it chose it). A
    master never promoted does not take over from the declared one: that may be down with its data on disk."""
    promoted = [m for m in masters if facts[m].promoted]
    if len(promoted) > 1:
        raise RefusedError(f"shard {shard.index}: opsctl cannot tell which master is the shard's master now: "
                           f"{', '.join(promoted)} were promoted from replicas, and none serves a replica or "
                           "holds keys", "making the others replicas of a guess may drop writes they took",
                           "point the others at the one you want (REPLICAOF host port), then apply again")
    return promoted[0] if promoted else shard.master


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


def start_master(layout: Layout, shard: Shard, facts: Facts) -> str | None:
    """Whom a stopped node of a replication/Sentinel shard starts as a replica of (itself: it starts as the
    master): the shard's master, or None when no master runs and no sentinels agree on one (each file says what
    its node was). A node that starts as a master next to another one takes writes its conversion throws away."""
    if not live_masters(shard, facts):
        return sentinel_agreed_master(layout, facts)
    return shard_master(layout, shard, facts)


def sentinel_agreed_master(layout: Layout, facts: Facts) -> str | None:
    """The master the sentinels agree on, if they agree and it is one of our nodes."""
    seen = {f.sentinel_master[1:] for n in layout.sentinels if (f := facts[n.name]).sentinel_master}
    if len(seen) != 1:
        return None
    address, port = next(iter(seen))
    node = layout.find(f"{address}:{port}")
    return node.name if node and not node.is_sentinel else None


def has_slots(f: NodeFacts) -> bool:
    """Whether the node serves slots (its own line of CLUSTER NODES lists some)."""
    me = f.myself
    return bool(me and me.slots)
