"""Which node is a shard's master now, from observed facts: for the planner, status and failover checks. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from opsctl.errors import RefusedError
from opsctl.failover.fencing import fenced
from opsctl.plan.facts import NodeFacts
from opsctl.spec.layout import Layout, Shard

Facts = Mapping[str, NodeFacts]


def current_master(shard: Shard, layout: Layout, facts: Facts) -> str:
    """The shard's master now: the one with replicas or slots, else the declared one. Roles move; that is fine.
    A master fenced by an interrupted failover is not it while another master exists."""
    masters = [m for m in shard.members if (r := facts[m].role) and r.kind == "master"]
    masters = [m for m in masters if not fenced(facts[m].config)] or masters
    active = [m for m in masters if facts[m].role.replicas or has_slots(facts[m])]  # type: ignore[union-attr]
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
    if not with_keys or shard.master in with_keys:
        return shard.master
    return max(with_keys, key=lambda m: facts[m].keys)


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
