"""Pure failover logic: which replica to promote, and pre/post-checks from observed facts.

Every check is a verdicts.Check(name, passed, value, threshold, hint): the value is what was measured, so a report
says not only "failed" but "lag 2.1 MB, limit 1 MB". No I/O here; opsctl.failover.runbook observes and acts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace

from opsctl.base.errors import AUTH_HINT, OpsctlError, RefusedError, auth_failed, is_auth_failure, not_answering
from opsctl.failover.promotion import choose_promotable, followed_master, promotable_check
from opsctl.failover.verdicts import Check, PastFailover, Target, Thresholds, role_text
from opsctl.observe.cluster_state import cluster_problems, voting_masters
from opsctl.observe.replies import listed_replicas
from opsctl.plan.facts import Facts
from opsctl.plan.health import MAX_LAG_BYTES
from opsctl.plan.masters import cluster_endpoints, sentinel_agreed_master, shard_master
from opsctl.slots.ranges import key_slot
from opsctl.slots.slotplan import retired
from opsctl.spec.layout import Layout, Shard, endpoint
from opsctl.spec.load import LoadedSpec

MODES = ("graceful", "force", "takeover")


def thresholds_for(loaded: LoadedSpec, max_lag_bytes: int = MAX_LAG_BYTES, max_lag_seconds: int = 3) -> Thresholds:
    timeout = loaded.spec.cluster_or_default().node_timeout_ms / 1000
    return Thresholds(max_lag_bytes, max_lag_seconds, 2 * timeout, 2 * max(2.0, 2 * timeout))


# --- whom to promote -----------------------------------------------------------------------------


def _listed(layout: Layout, facts: Facts, master: str, replica: str) -> dict[str, str] | None:
    """The master's INFO replication entry for the replica (ip, port, state, offset, lag); None: not listed."""
    node = layout.node(replica)
    return next((fields for fields in listed_replicas(facts[master].info)
                 if fields.get("ip") == node.address and fields.get("port") == str(node.port)), None)


def replica_lag(layout: Layout, facts: Facts, master: str, replica: str) -> tuple[int | None, int | None]:
    """(bytes, seconds) the replica is behind, from the master's INFO replication (None: master does not list it)."""
    fields = _listed(layout, facts, master, replica)
    if fields is None:
        return None, None
    offset = int(facts[master].info.get("master_repl_offset", "0"))
    return max(0, offset - int(fields.get("offset", "0"))), int(fields.get("lag", "0"))


def master_side_state(layout: Layout, facts: Facts, master: str, replica: str) -> str | None:
    """The replica's state as its master lists it (online, wait_bgsave, send_bulk, ...): a replica can report its
    link up while its master still waits for its first ACK (Redis 7.0), and FAILOVER refuses a replica that is
    not online. None: the master's replication section was not read (nothing to say)."""
    if "connected_slaves" not in facts[master].info:
        return None
    fields = _listed(layout, facts, master, replica)
    return "not listed" if fields is None else fields.get("state", "unknown")


def bus_link_to_master(facts: Facts, replica: str) -> str | None:
    """The cluster-bus links between the replica and its master, each as its sender sees it (connected, disconnected,
    unknown; the worse one); None outside a cluster or when the replica's view was not read.
    Why: CLUSTER FAILOVER needs both links (the request goes over the replica's, the paused offset back over the
    master's); with either down it only times out."""
    lines = facts[replica].cluster_nodes
    me = next((line for line in lines or [] if line.is_myself), None)
    if me is None or me.master_id is None:
        return None
    master_line = next((line for line in lines or [] if line.id == me.master_id), None)
    if master_line is None or master_line.link_state != "connected":
        return "unknown" if master_line is None else master_line.link_state
    master_view = next((f.cluster_nodes for f in facts.values()
                        if f.myself is not None and f.myself.id == me.master_id), None)
    if master_view is None:
        return "connected"  # the master's view was not read: nothing more to say
    back = next((line for line in master_view if line.id == me.id), None)
    return "unknown" if back is None else back.link_state


def linked_to(layout: Layout, facts: Facts, replica: str, master: str) -> bool:
    role = facts[replica].role
    m = layout.node(master)
    return bool(facts[replica].reachable and role and role.kind == "replica"
                and role.master == (m.address, m.port) and role.link == "connected")


def choose_replica(layout: Layout, shard: Shard, master: str, facts: Facts) -> str | None:
    """The healthiest, least-lagging linked replica of master, preferring one on another host."""
    host = layout.node(master).host
    ranked = []
    for name in shard.members:
        if name == master or not linked_to(layout, facts, name, master):
            continue
        lag_bytes, lag_s = replica_lag(layout, facts, master, name)
        ranked.append((layout.node(name).host == host, lag_bytes is None, lag_bytes or 0, lag_s or 0, name))
    return min(ranked)[-1] if ranked else None


def no_replica_reason(shard: Shard, master: str, facts: Facts) -> str:
    """Why choose_replica found nobody, in words that are true whatever state the shard is in."""
    if not any(facts[n].reachable for n in shard.members):
        return "no node answers: cannot choose a replica"
    if len(shard.members) < 2:
        return "the shard has no replica"
    if not facts[master].reachable:
        return f"{master} does not answer and no replica is linked to it"
    return f"no replica is linked to {master}"


def _shard_by_number(layout: Layout, number: int) -> Shard:
    shard = next((s for s in layout.shards if s.index == number), None)
    if shard is None:
        raise OpsctlError(f"there is no shard {number}", f"the spec has shards 1..{len(layout.shards)}",
                          "`opsctl status -f SPEC` shows the shards")
    return shard


def _server(layout: Layout, ref: str) -> tuple[str, Shard]:
    node = layout.find(ref)
    shard = layout.shard_of(node.name) if node else None
    if node is None or shard is None:
        raise OpsctlError(f"no server node named {ref}", "give a node name or address:port of a server",
                          "`opsctl validate -f SPEC` lists the nodes")
    return node.name, shard


def resolve_target(loaded: LoadedSpec, facts: Facts, shard: int | None = None, master: str | None = None,
                   to: str | None = None, promote: bool = False) -> Target:
    """Exactly one of shard, master (a node now master) or to (the replica to promote). promote: a forced mode;
    with the master gone it picks by data held (choose_promotable), not by link and lag."""
    layout = loaded.layout
    sentinel = loaded.spec.topology == "sentinel"
    if to is not None:
        if sentinel:
            raise OpsctlError("Sentinel chooses the replica it promotes; --to is not supported for sentinel",
                              "Sentinel ranks replicas by replica-priority, then replication offset",
                              "set replica-priority under nodes.<name>.config, apply, then failover --shard 1")
        name, found = _server(layout, to)
        now = _master_of(layout, found, facts, promote)
        if name == now:
            raise RefusedError(f"{name} is already the master of shard {found.index}", hint="nothing to do")
        return Target(found.index, now, name)
    if master is not None:
        name, found = _server(layout, master)
        now = _master_of(layout, found, facts, promote)
        if name != now:
            raise RefusedError(f"{name} is not a master now; shard {found.index}'s master is {now}",
                               hint=f"use --master {now}, or --to to pick the replica")
    else:
        found = _shard_by_number(layout, shard or 1)
        now = _master_of(layout, found, facts, promote)
    if sentinel:
        return Target(found.index, now, None)
    by_data = promote and not facts[now].reachable  # no replica is linked to a dead master: none has a lag
    replica = choose_promotable(layout, found, now, facts) if by_data else choose_replica(layout, found, now, facts)
    why = f"no replica of {now} answers" if by_data else no_replica_reason(found, now, facts)
    return Target(found.index, now, replica, "" if replica else why)


def _master_of(layout: Layout, shard: Shard, facts: Facts, promote: bool) -> str:
    """The shard's master now (shard_master); for a forced promotion, the one its replicas follow when no member
    answers as master (promotion.followed_master)."""
    now = shard_master(layout, shard, facts)
    return (followed_master(layout, shard, facts) if promote else None) or now


# --- pre-checks ---------------------------------------------------------------------------------


def link_check(layout: Layout, facts: Facts, replica: str | None, master: str, why: str = "") -> Check:
    if replica is None:
        return Check("target-linked", False, why or f"no replica is linked to {master}", "a replica with link up",
                     "start or repair the replicas (opsctl status, opsctl apply) first")
    f = facts[replica]
    role = f.role
    if not f.reachable or role is None:
        value = not_answering(replica, f.error)
    elif role.kind != "replica":
        value = f"{replica} is a {role.kind}"
    else:
        value = f"{replica} replicates {endpoint(*role.master)}, link {role.link}" if role.master \
            else f"{replica} has no master"
    seen_by_master = master_side_state(layout, facts, master, replica)
    if seen_by_master not in (None, "online"):
        value += f"; its master lists it as {seen_by_master}"
    bus = bus_link_to_master(facts, replica)
    if bus not in (None, "connected"):
        value += f"; a cluster bus link between it and the master is {bus}"
    return Check("target-linked", linked_to(layout, facts, replica, master) and seen_by_master in (None, "online")
                 and bus in (None, "connected"), value,
                 f"replica of {master} ({layout.node(master).endpoint}), link connected, online at the master"
                 + (", cluster bus link connected" if facts[replica].cluster_nodes else ""),
                 "wait for the link (opsctl status shows it) or pick another replica with --to")


def lag_check(layout: Layout, facts: Facts, replica: str | None, master: str, limits: Thresholds) -> Check:
    threshold = f"<= {limits.max_lag_bytes} B and <= {limits.max_lag_seconds} s"
    if replica is None:
        return Check("replication-lag", False, "no replica to measure", threshold,
                     "a failover needs a replica linked to the master")
    if not facts[master].reachable and is_auth_failure(facts[master].error):
        return Check("replication-lag", False, f"{auth_failed(master)}: its replicas' lag is unknown", threshold,
                     AUTH_HINT)
    if not facts[master].reachable:
        return Check("replication-lag", False, f"{master} does not answer: its replicas' lag is unknown", threshold,
                     "the lag is measured on the master; with the master gone only a forced promotion is left")
    lag_bytes, lag_s = replica_lag(layout, facts, master, replica)
    if lag_bytes is None or lag_s is None:
        return Check("replication-lag", False, f"{master} does not list {replica} as a replica", threshold,
                     "the master must see the replica before it can hand over")
    ok = lag_bytes <= limits.max_lag_bytes and lag_s <= limits.max_lag_seconds
    return Check("replication-lag", ok, f"{lag_bytes} B, last ack {lag_s} s ago", threshold,
                 "wait until the replica catches up; a big write burst or a slow link makes it lag")


def serving_endpoints(facts: Facts) -> set[str]:
    """The masters that serve slots, as the nodes that answer see them (voting_masters: the server's cluster_size
    counts them, and an election needs a majority of them), by endpoint. A shard the spec adds (a scale-out not yet
    moved into) has none yet."""
    _, serving = _votes(facts)
    return {line.endpoint for f in facts.values() if f.reachable for line in f.cluster_nodes or ()
            if line.id in serving}


def _votes(facts: Facts) -> tuple[set[str], set[str]]:
    return voting_masters(f.cluster_nodes for f in facts.values() if f.reachable and f.cluster_nodes)


def voters(layout: Layout, facts: Facts) -> dict[int, str | None]:
    """Shard serving slots -> its member that answers as a master with slots (a voter in an election: voting_masters'
    answering ones); None: no such member (its master is down)."""
    answering, _ = _votes(facts)
    serving = serving_endpoints(facts)
    return {shard.index: next((m for m in shard.members if facts[m].reachable and (me := facts[m].myself)
                               and me.id in answering and me.is_master), None) for shard in layout.shards
            if any(layout.node(m).endpoint in serving for m in shard.members)}


def cluster_size(layout: Layout, facts: Facts) -> int:
    """How many masters vote in an election (the spec's shards when no node answers)."""
    return len(_votes(facts)[1]) or len(layout.shards)


def vote_links(layout: Layout, facts: Facts, replica: str) -> dict[str, str]:
    """Each voter -> its own cluster-bus link to the replica as it lists it (connected, disconnected, not listed);
    'shard N' -> 'no master answers'.
    Why: a master sends its vote over that link only and drops it while the link is down, so right after a restart an
    election can expire."""
    me = facts[replica].myself
    links: dict[str, str] = {}
    for shard, voter in voters(layout, facts).items():
        if voter is None:
            links[f"shard {shard}"] = "no master answers"
            continue
        line = next((n for n in facts[voter].cluster_nodes or () if me and n.id == me.id), None)
        links[voter] = line.link_state if line else "not listed"
    return links


def voters_check(layout: Layout, facts: Facts, replica: str | None) -> Check:
    shards = cluster_size(layout, facts)
    threshold = f"> {shards // 2} of {shards} masters with their cluster bus link to the replica connected"
    if replica is None or facts[replica].myself is None:
        return Check("voters-linked", False, f"unknown: {replica} gave no cluster view" if replica else
                     "unknown: no replica to ask", threshold,
                     "a failover needs a replica that answers (see target-linked)")
    links = vote_links(layout, facts, replica)
    linked = [voter for voter, state in links.items() if state == "connected"]
    down = [f"{voter}: {state}" for voter, state in links.items() if state != "connected"]
    return Check("voters-linked", len(linked) > shards // 2,
                 f"{len(linked)}/{shards} masters linked to {replica}" + (f" ({'; '.join(down)})" if down else ""),
                 threshold, "each master reconnects to a restarted node within a moment; if a link stays down, "
                 "`opsctl cluster check -f SPEC` and the masters' logs say why")


def cluster_prechecks(loaded: LoadedSpec, facts: Facts, target: Target, limits: Thresholds,
                      history: Sequence[PastFailover], now: float, forced: bool = False) -> list[Check]:
    """forced (force or takeover) with the master gone: the replica is judged by the data it holds (no link, no lag
    to measure) and the cluster's agreement without the dead master (its slots fail until the promotion)."""
    layout = loaded.layout
    gone = target.master if forced and not facts[target.master].reachable else None
    shards = cluster_size(layout, facts)
    answering = sum(1 for voter in voters(layout, facts).values() if voter)
    linked = link_check(layout, facts, target.replica, target.master, target.no_replica)
    if not facts[target.master].reachable and not linked.passed:
        linked = replace(linked, hint=f"{target.master} does not answer: if the cluster does not fail over by itself "
                         "(its replica cut off too long, or set not to), `--mode force --yes` promotes the replica "
                         "holding the most data" if answering > shards // 2 else f"{target.master} does not answer, "
                         f"and the cluster cannot elect a replica ({answering}/{shards} masters answer): "
                         f"{NO_VOTES_HINT}")
    replica_checks = [promotable_check(layout, facts, target)] if gone else [
        linked, lag_check(layout, facts, target.replica, target.master, limits)]
    open_slots = sorted({f"{n}:{s}" for n, f in facts.items() if (me := f.myself)
                         for s in (*me.migrating, *me.importing)})
    answering_nodes = sum(1 for n in layout.servers if facts[n.name].reachable)
    return [
        *replica_checks,
        Check("masters-reachable", answering > shards // 2, f"{answering}/{shards} masters answer",
              f"> {shards // 2}", f"a failover needs a majority of masters to vote: bring the masters back first; "
              f"if they are gone for good, {NO_VOTES_HINT}"),
        voters_check(layout, facts, target.replica),
        Check("no-open-slots", not open_slots and answering_nodes > 0,
              ", ".join(open_slots[:5]) or ("none" if answering_nodes else "unknown: no node answers"), "none",
              "finish or roll back the slot migration (opsctl plan shows it) before failing over"),
        agreement_check(facts, layout, gone, before=True),
        cooldown_check(target, history, now, limits),
    ]


NO_VOTES_HINT = ("only `--mode takeover --yes --force-checks` promotes without votes (the replica holding the most "
                 "data; what it lacks is lost); a host gone with its disk: give its entry in the spec the new "
                 "machine's address (or remove it) and `opsctl apply` promotes and replaces it")


def agreement_check(facts: Facts, layout: Layout, gone: str | None = None, before: bool = False) -> Check:
    """gone: a dead master a forced failover replaces, left out with what the others say of it (before the
    promotion its slots fail too: before)."""
    members = cluster_members(layout, facts)
    views = {n: list(facts[n].cluster_nodes or []) for n in members if facts[n].reachable}
    infos = {n: facts[n].info for n in views}
    problems = [p for p in cluster_problems(views, infos) if "is open:" not in p.what]
    down = [n for n in members if not facts[n].reachable and n != gone]
    if gone is not None:
        dead = layout.node(gone).endpoint
        problems = [p for p in problems if not about_gone(p.what, dead, before)
                    and not (before and p.what.startswith("cluster_state"))]
    value = "no node answers" if not views else \
        "; ".join([*(f"{n}: unreachable" for n in down), *(p.render() for p in problems[:3])])
    agree = f"all {len(views)} nodes agree" + (f" ({gone} left out: it does not answer)" if gone else "")
    return Check("cluster-agrees", not problems and not down, value or agree,
                 "every node answers, cluster_state ok, one slot map, roles agree",
                 "opsctl cluster check -f SPEC names the node that disagrees; wait for gossip or repair it")


def names_endpoint(text: str, endpoint: str) -> bool:
    """text names endpoint whole: 10.0.0.1:700 is not named by 10.0.0.1:7001 or 110.0.0.1:700, redis-1:7000 not by
    db-redis-1:7000."""
    return re.search(rf"(?<![\w.-]){re.escape(endpoint)}(?!\d)", text) is not None


def about_gone(what: str, endpoint: str, before: bool) -> bool:
    """A disagreement about the gone master's own state (seen failing, not known, not observed; before the
    promotion also its replicas' links to it down): expected while it is gone. One naming it as a slot's owner or
    as someone's master is gossip still to settle, and is kept; so is a replica still linked to it afterwards."""
    label = r"(\S+(?: \([^)]*\))?)"  # observe.cluster_state.Names.label: "endpoint (name)" or "id… (endpoint)"
    subject = re.fullmatch(rf"(?:sees {label} as .*|does not know {label}|knows {label}, which .*)", what)
    if subject is not None:
        return names_endpoint(next(g for g in subject.groups() if g), endpoint)
    return before and what.startswith("replica link to ") and names_endpoint(what, endpoint)


def cluster_members(layout: Layout, facts: Facts) -> list[str]:
    """The nodes in the cluster: the spec's servers it knows (plan.masters.cluster_endpoints; all of them when no node
    serving slots answers), plus the observed ones the spec no longer has (a scale-in's, still known).
    Why: nodes a scale-out adds join after the restarts and must not hold a failover up; a scale-in's still count."""
    known = cluster_endpoints(facts)
    return [*(n.name for n in layout.servers if known is None or n.endpoint in known), *retired(layout, facts)]


def cooldown_check(target: Target, history: Sequence[PastFailover], now: float, limits: Thresholds) -> Check:
    """Refuses a failover of a master opsctl's own reports show replaced, or to a replica they show promoted, within
    its cool-down. Why: the servers would refuse that election (a voter's voted_time) or undo it (a replica keeps its
    last election's state). The windows: docs/runbooks/failover.md, "The pre-checks"."""
    threshold = f"{target.master} not replaced for {limits.cooldown_s:g} s" + (
        f", {target.replica} not promoted for {limits.retry_s:g} s" if target.replica else "")
    waits = [(limits.cooldown_s - (now - p.finished), f"{target.master} was replaced {_ago(p, now)}")
             for p in history if p.old_master == target.master and now - p.finished < limits.cooldown_s]
    waits += [(limits.retry_s - (now - p.finished), f"{target.replica} was promoted {_ago(p, now)}")
              for p in history if p.new_master == target.replica and now - p.finished < limits.retry_s]
    if not waits:
        return Check("cool-down", True, "no recent failover of these nodes", threshold)
    wait, why = max(waits)
    return Check("cool-down", False, why, threshold,
                 f"wait {wait:.1f} s more: the election would be refused or undone")


def _ago(past: PastFailover, now: float) -> str:
    if past.interrupted:
        return f"by a failover whose opsctl was killed (counted as done at its deadline, {past.finished - now:+.2f} s)"
    return f"{now - past.finished:.2f} s ago"


def replication_prechecks(loaded: LoadedSpec, facts: Facts, target: Target, limits: Thresholds) -> list[Check]:
    layout = loaded.layout
    m = facts[target.master]
    gone = "Sentinel promotes a replica by itself once the master is down for down_after_ms" \
        if loaded.spec.topology == "sentinel" else \
        f"if it is gone for good: `opsctl failover --shard {target.shard} --mode force --yes` promotes the replica " \
        "holding the most data"
    checks = [Check("master-reachable", m.reachable and bool(m.role and m.role.kind == "master"),
                    f"{target.master} {'answers as master' if m.reachable else 'does not answer'}",
                    "the master answers", gone)]
    shard = layout.shards[target.shard - 1]
    replicas = [target.replica] if target.replica else [n for n in shard.members if n != target.master]
    for name in replicas:
        checks += [_named(link_check(layout, facts, name, target.master), name),
                   _named(lag_check(layout, facts, name, target.master, limits), name)]
    return checks


def _named(check: Check, node: str | None) -> Check:
    return Check(f"{check.name}({node})", check.passed, check.value, check.threshold, check.hint)


def sentinel_prechecks(loaded: LoadedSpec, facts: Facts, target: Target, limits: Thresholds,
                       quorum: Mapping[str, str]) -> list[Check]:
    ok = [n for n, reply in quorum.items() if reply.startswith("OK")]
    bad = [f"{n}: {reply}" for n, reply in quorum.items() if not reply.startswith("OK")]
    agreed = sentinel_agreed_master(loaded.layout, facts)
    return [*replication_prechecks(loaded, facts, target, limits),
            Check("sentinel-quorum", not bad and bool(ok), f"{len(ok)}/{len(quorum)} sentinels: CKQUORUM OK"
                  + (f"; {'; '.join(bad)}" if bad else ""), "every sentinel OK",
                  "start the missing sentinels (opsctl apply) so a majority can authorise the failover"),
            Check("sentinels-agree", agreed == target.master, f"sentinels see {agreed or 'different masters'}",
                  target.master, "wait until the sentinels agree (opsctl status) before a manual failover")]


# --- post-checks --------------------------------------------------------------------------------


def postchecks(loaded: LoadedSpec, facts: Facts, old_master: str, new_master: str, wrote: str,
               forced: bool = False) -> list[Check]:
    """After the failover: new master serves writes, old master (and every other member) replicates it. forced (a
    failover without the master's handshake): a member that does not answer passes, named: the old master was
    gone, which is why it was forced, and each follows the new master when it runs again."""
    layout = loaded.layout
    new = facts[new_master]
    checks = [Check("new-master-writes", wrote == "OK" and bool(new.role and new.role.kind == "master"),
                    f"{new_master} is a {new.role.kind if new.role else 'node not answering'}; probe write: {wrote}",
                    "master, write acknowledged", "look at the node's log; opsctl status shows the roles")]
    shard = layout.shard_of(new_master)
    for name in shard.members if shard else ():
        if name != new_master:
            label = "old-master-replica" if name == old_master else f"replica-repointed({name})"
            if forced and not facts[name].reachable and not is_auth_failure(facts[name].error):
                checks.append(Check(label, True, f"{role_text(facts[name])}: it follows {new_master} when it runs "
                                    "again (opsctl apply starts it so)", f"replica of {new_master}, or down"))
                continue
            checks.append(Check(label, linked_to(layout, facts, name, new_master), role_text(facts[name]),
                                f"replica of {new_master}, link connected",
                                "it follows the new master within seconds; if not, opsctl apply re-points it"))
    if loaded.spec.topology == "cluster":
        checks.append(agreement_check(facts, layout, old_master if forced and not facts[old_master].reachable
                                      else None))
    if loaded.spec.topology == "sentinel":
        agreed = sentinel_agreed_master(layout, facts)
        checks.append(Check("sentinels-agree", agreed == new_master, f"sentinels see {agreed or 'different masters'}",
                            new_master, "sentinels learn the new master from each other within a second or two"))
    return checks


def failed(checks: Sequence[Check]) -> list[Check]:
    return [c for c in checks if not c.passed]


def probe_key(slots: Sequence[tuple[int, int]]) -> str:
    """A key that hashes into one of these slot ranges (any key when empty): the post-check's probe write."""
    if not slots:
        return "opsctl:failover:probe"
    for n in range(1_000_000):
        key = f"opsctl:failover:{{{n}}}"
        slot = key_slot(key.encode())
        if any(start <= slot <= end for start, end in slots):
            return key
    raise ValueError("no probe key found")  # unreachable: every slot is hit long before
