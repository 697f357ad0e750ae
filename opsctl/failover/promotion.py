"""The forced promotion's judging, with the master gone: who the master was, whether it is gone, and which
replica holds the most of its stream. Pure; opsctl.failover.checks uses it for resolve_target and the cluster's
forced pre-checks, the planner for the promotion of a replica whose master went with its host (cluster.deadnodes)."""

from __future__ import annotations

from opsctl.base.errors import AUTH_HINT, auth_failed, is_auth_failure, not_answering
from opsctl.failover.verdicts import Check, Target, role_text
from opsctl.plan.facts import Facts, NodeFacts
from opsctl.spec.layout import Layout, Shard, endpoint


def followed_master(layout: Layout, shard: Shard, facts: Facts) -> str | None:
    """With no member answering as master (the master gone): the member the answering replicas all follow, else
    None. The declared master, which shard_master falls back to, may be a replica since an earlier failover (the
    second incident on a shard)."""
    if any(facts[n].reachable and (role := facts[n].role) is not None and role.kind == "master"
           for n in shard.members):
        return None
    followed = {found.name for n in shard.members if (role := facts[n].role) is not None and role.kind == "replica"
                and facts[n].reachable and role.master is not None
                and (found := layout.find(endpoint(*role.master))) is not None}
    return next(iter(followed)) if len(followed) == 1 and followed <= set(shard.members) else None


def promotion_prechecks(layout: Layout, facts: Facts, target: Target, ping_period: float = 10.0) -> list[Check]:
    """A forced promotion in a replication topology (the master is gone): the master must not answer (else two
    masters take writes), and the replica promoted must hold the most data of the replicas (every one answering:
    one that does not may hold more). ping_period: the master's repl-ping-replica-period, how often a live master
    that takes no writes is still heard by its replicas."""
    return [_master_down_check(layout, facts, target, ping_period), promotable_check(layout, facts, target)]


def _master_down_check(layout: Layout, facts: Facts, target: Target, ping_period: float) -> Check:
    """Binding: a master that answers opsctl, or that a replica heard from within its ping period, runs (silent to
    opsctl is not gone: a cut link between them, while its clients and replicas still reach it)."""
    m, threshold = facts[target.master], "the master does not answer, and no replica has heard from it lately"
    if m.reachable:
        role = m.role.kind if m.role else "a node that does not say its role"
        return Check("master-down", False, f"{target.master} answers as {role}", threshold,
                     "a promotion beside a running master makes two masters taking writes: use the default "
                     "graceful mode, which loses nothing (a forced promotion cut short left this one promoted: "
                     "`opsctl apply` points the others at it)", binding=True)
    if is_auth_failure(m.error):
        return Check("master-down", False, f"{auth_failed(target.master)}: it runs", threshold, AUTH_HINT,
                     binding=True)
    members = [n for n in layout.shards[target.shard - 1].members if n != target.master and facts[n].reachable]
    heard = [f"{n} heard from it {info.get('master_last_io_seconds_ago')} s ago" for n in members
             if _hears(layout, facts[n], target.master, ping_period) and (info := facts[n].info)]
    if heard:
        return Check("master-down", False, f"{not_answering(target.master, m.error)}, but {', '.join(heard)}",
                     threshold, "it runs, cut off from opsctl only: two masters would take writes. Restore the "
                     "link and use the graceful mode; a master that has stopped is heard of no more within "
                     f"{ping_period + PING_GRACE_S:g} s of its last word (repl-ping-replica-period), then run again",
                     binding=True)
    down = [f"{n} lost it {since} s ago" for n in members
            if (since := facts[n].info.get("master_link_down_since_seconds"))]
    lost = f"; {', '.join(down)}" if down else ""
    return Check("master-down", True, not_answering(target.master, m.error) + lost, threshold)


PING_PERIOD = "repl-ping-replica-period"  # how often a master pings its replicas: master-down's "heard lately"
PING_GRACE_S = 2.0  # beyond the ping period: the master's cron and the replica's read are not on the second


def _hears(layout: Layout, replica: NodeFacts, master: str, ping_period: float) -> bool:
    """replica's link to master is up and carried something within the ping period (a live master pings its
    replicas every period; a stopped or stalled one leaves the link up until repl-timeout, silent)."""
    m, role, info = layout.node(master), replica.role, replica.info
    if role is None or role.kind != "replica" or role.master != (m.address, m.port):
        return False
    last_io = info.get("master_last_io_seconds_ago", "")
    return info.get("master_link_status") == "up" and last_io.lstrip("-").isdigit() and \
        float(last_io) <= ping_period + PING_GRACE_S


def promotable_check(layout: Layout, facts: Facts, target: Target) -> Check:
    threshold = "a replica of the master, and no other replica holds more of its stream"
    if target.replica is None:
        return Check("most-data", False, target.no_replica or "no replica to promote", threshold,
                     "start a replica of the shard (opsctl status shows which run)")
    shard = layout.shards[target.shard - 1]
    offsets = promotable_offsets(layout, shard, facts, target.master)
    if target.replica not in offsets:
        return Check("most-data", False, f"{target.replica} is not a replica of {target.master} "
                     f"({role_text(facts[target.replica])})", threshold, "pick another one with --to")
    silent = [n for n in shard.members if n not in offsets and n != target.master and not facts[n].reachable]
    best = max(offsets.values())
    value = "; ".join([*(f"{n} at offset {o}" for n, o in sorted(offsets.items(), key=lambda i: -i[1])),
                       *(f"{n} does not answer" for n in silent)])
    if offsets[target.replica] < best:
        leader = max(offsets, key=lambda n: offsets[n])
        return Check("most-data", False, value, threshold, f"promote {leader} (--to {leader}): promoting "
                     f"{target.replica} would drop the {best - offsets[target.replica]} bytes of writes it lacks")
    return Check("most-data", not silent, value, threshold,
                 "start the replicas that do not answer first (one of them may hold more), or pass --force-checks "
                 "to promote without them")


def promotable_offsets(layout: Layout, shard: Shard, facts: Facts, master: str) -> dict[str, int]:
    """Each answering replica of master (link up or not) with how far into its stream it got (INFO
    master_repl_offset: kept while the link is down, where ROLE says -1)."""
    m = layout.node(master)
    return {n: history[1] for n in shard.members if n != master
            and (f := facts[n]).reachable and (role := f.role) is not None and role.kind == "replica"
            and role.master == (m.address, m.port) and (history := f.history) is not None}


def choose_promotable(layout: Layout, shard: Shard, master: str, facts: Facts) -> str | None:
    """The replica holding the most of master's stream, preferring one on another host; None: no replica answers."""
    offsets = promotable_offsets(layout, shard, facts, master)
    host = layout.node(master).host
    return min(offsets, key=lambda n: (-offsets[n], layout.node(n).host == host, n)) if offsets else None
