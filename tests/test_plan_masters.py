"""Who a replication shard's master is now (plan.masters.current_master), and that every step of one plan names
the same master: the write-config that makes a stopped node follow it, the replicate steps, the wait. Pure."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from opsctl.base.errors import RefusedError
from opsctl.observe.replies import RoleInfo
from opsctl.plan.facts import FENCE, TO_WRITE, NodeFacts
from opsctl.plan.masters import current_master, follow_target, start_master, takes_writes, writes_moved_from
from opsctl.plan.planner import make_plan
from opsctl.plan.steps import Failover, FinishFailover, Replicate, RestartNode, StartNode, WaitConverged, WriteConfig
from opsctl.spec.layout import sentinel_master_name
from opsctl.spec.load import LoadedSpec
from tests.test_planner import desired, live_config, loaded_spec, recorded

OLD_HISTORY = "c6ffc17231791ae879c0eecc23479c6269134b7c"  # old's replication id, which its replicas took


def promoted(at: int = 0) -> dict[str, str]:
    """INFO of a replica of old promoted after it had processed old's stream up to offset `at`."""
    return {"master_replid2": OLD_HISTORY, "second_repl_offset": str(at + 1)}


PROMOTED = promoted()
NEVER_PROMOTED = {"master_replid2": "0" * 40, "second_repl_offset": "-1"}


class Shard:
    """Facts of the 3-node replication shard old (declared master, down), new and other."""

    def __init__(self, topology: str = "replication", **sections: object) -> None:
        self.loaded: LoadedSpec = loaded_spec(topology, **sections)
        self.want = desired(self.loaded)
        self.old, self.new, *more = self.loaded.layout.shards[0].members
        self.other, *self.more = more or [""]
        self.facts = {self.old: NodeFacts(self.old, False, "pidfile names dead pid 31611",
                                          recorded(self.want[self.old]))}

    def address(self, name: str) -> tuple[str, int]:
        node = self.loaded.layout.node(name)
        return node.address, node.port

    def live(self, name: str, role: RoleInfo, keys: int = 0, **info: str) -> None:
        info |= {"db0": f"keys={keys},expires=0,avg_ttl=0"} if keys else {}
        self.facts[name] = NodeFacts(name, True, record=recorded(self.want[name]), reachable=True, info=info,
                                     role=role, config=live_config(self.want[name]))

    def master(self, name: str, keys: int = 0, replicas: tuple[str, ...] = (), **info: str) -> None:
        self.live(name, RoleInfo("master", 0, replicas=tuple((*self.address(r), 0) for r in replicas)), keys,
                  **info)

    def replica(self, name: str, of: str, link: str = "connected", keys: int = 300, offset: int | None = None
                ) -> None:
        """offset: how far into old's history it got (INFO master_replid, master_repl_offset); None: unknown."""
        history = {"master_replid": OLD_HISTORY, "master_repl_offset": str(offset)} if offset is not None else {}
        self.live(name, RoleInfo("replica", -1 if link != "connected" else 9984, self.address(of), link), keys,
                  master_link_status="up" if link == "connected" else "down", **history)

    def down(self, name: str) -> None:
        self.facts[name] = NodeFacts(name, False, "pidfile names dead pid 31612", recorded(self.want[name]))

    def plan(self):
        return make_plan(self.loaded, self.want, self.facts, "d")


def followed(plan) -> set[str]:
    """Every master a step of the plan names: replicate targets, and whom a stopped node starts as a replica of."""
    named = {s.master for s in plan.steps if isinstance(s, Replicate)}
    return named | {m[1] for s in plan.steps if isinstance(s, WriteConfig)
                    if (m := re.match(r"starts as a replica of (\S+?),", s.reason))}


def test_the_crashed_master_follows_the_hand_promoted_replica_its_sibling_is_still_syncing_from() -> None:
    """The state CI observed (test_replication_apply_starts_the_crashed_master_as_a_replica): old was SIGKILLed,
    new was promoted by hand before it had received a write (offset 0, no keys: after its diskless sync, old
    waited for new's next REPLCONF ACK, up to a second, to stream to it), other was pointed at it and is still in
    its handshake, so new's ROLE lists no replica. The plan started old as a replica of new, then made new and
    other replicas of old: a loop in which no node takes writes."""
    shard = Shard()
    shard.master(shard.new, connected_slaves="1", **PROMOTED)
    shard.replica(shard.other, of=shard.new, link="handshake", keys=303)
    plan = shard.plan()
    assert followed(plan) == {shard.new}, plan.steps
    assert [(type(s), s.node) for s in plan.steps] == [
        (WriteConfig, shard.old), (StartNode, shard.old), (Replicate, shard.old), (WaitConverged, shard.old)]
    assert current_master(shard.loaded.layout.shards[0], shard.loaded.layout, shard.facts) == shard.new


@pytest.mark.parametrize("moment", ["before other is pointed", "other linked", "other named, not listed"])
def test_every_step_follows_the_promoted_replica_whatever_the_moment(moment: str) -> None:
    """The operator's failover, seen at any moment after new answers as master: roles are not drift."""
    shard = Shard()
    if moment == "before other is pointed":  # other took no more of old's stream than new had
        shard.master(shard.new, keys=300, **promoted(at=9984))
        shard.replica(shard.other, of=shard.old, link="connect", offset=9984)
    elif moment == "other linked":
        shard.master(shard.new, keys=300, replicas=(shard.other,), **PROMOTED)
        shard.replica(shard.other, of=shard.new)
    else:
        shard.master(shard.new, keys=300, **PROMOTED)
        shard.replica(shard.other, of=shard.new, link="sync")
    plan = shard.plan()
    assert followed(plan) == {shard.new}, plan.steps
    assert start_master(shard.loaded.layout, shard.loaded.layout.shards[0], shard.facts) == shard.new


def test_without_persistence_the_crashed_master_restarts_empty_behind_a_promoted_replica_even_an_empty_one() -> None:
    """Refused before only while no other node had taken over: a node promoted before it held a key counted as
    none, though the crashed master starts as its replica, not as an empty master the others copy."""
    shard = Shard(persistence={"aof": "off", "rdb": []})
    shard.master(shard.new, **PROMOTED)
    shard.replica(shard.other, of=shard.new, link="handshake", keys=303)
    assert followed(shard.plan()) == {shard.new}
    shard.master(shard.new, **NEVER_PROMOTED)
    shard.replica(shard.other, of=shard.old, link="connect", keys=303)
    with pytest.raises(RefusedError, match="come back empty"):
        shard.plan()


def test_before_the_promotion_the_crashed_master_starts_as_the_master_it_was() -> None:
    """No node answers as master yet (new is still a replica of the dead one): old starts from its file."""
    shard = Shard()
    shard.replica(shard.new, of=shard.old, link="connect")
    shard.replica(shard.other, of=shard.old, link="connect")
    plan = shard.plan()
    assert [(type(s), s.node) for s in plan.steps] == [(StartNode, shard.old), (WaitConverged, shard.old)]


def test_an_empty_master_that_was_never_a_replica_does_not_take_over_from_the_declared_one() -> None:
    """A node re-created empty while the declared master is down (its data on disk) is no promotion: following
    it would have the declared master's data replaced by nothing."""
    shard = Shard()
    shard.master(shard.new, **NEVER_PROMOTED)
    shard.replica(shard.other, of=shard.old, link="connect")
    plan = shard.plan()
    assert followed(plan) == {shard.old}, plan.steps
    assert not any(isinstance(s, WriteConfig) for s in plan.steps)


def test_two_promoted_masters_that_nothing_tells_apart_are_refused_not_guessed() -> None:
    shard = Shard()
    shard.master(shard.new, **PROMOTED)
    shard.master(shard.other, **PROMOTED)
    with pytest.raises(RefusedError, match="cannot tell") as refused:
        shard.plan()
    assert shard.new in str(refused.value) and shard.other in str(refused.value)


def refusal(shard: Shard) -> str:
    with pytest.raises(RefusedError) as refused:
        shard.plan()
    return f"{refused.value.summary}\n{refused.value.detail}\n{refused.value.hint}"


@pytest.mark.parametrize("history", ["same, other further", "unknown"])
def test_a_promoted_replica_that_lacks_the_data_its_sibling_holds_is_refused_not_followed(history: str) -> None:
    """old crashed (its data on disk), new was promoted by hand before it held a key, other still follows old
    with 300 keys. Following new made old and other its replicas: both emptied by a full sync from a master
    with nothing, and nothing refused. Other got further into old's history than new had when promoted (or,
    where the histories cannot be compared, holds more keys): refused, naming both and how to go on."""
    shard = Shard()
    shard.master(shard.new, **PROMOTED)
    shard.replica(shard.other, of=shard.old, link="connect", offset=9984 if history != "unknown" else None)
    text = refusal(shard)
    assert f"{shard.new} would take over as master (0 keys" in text, text
    assert f"{shard.other} (300 keys" in text and f"a replica of {shard.old}" in text, text
    assert "REPLICAOF NO ONE" in text and f"REPLICAOF {' '.join(map(str, shard.address(shard.new)))}" in text
    with pytest.raises(RefusedError):
        current_master(shard.loaded.layout.shards[0], shard.loaded.layout, shard.facts)


@pytest.mark.parametrize(("other_offset", "refused"), [(9984, False), (9998, False), (10012, True), (10020, True)])
def test_on_one_history_offsets_decide_not_key_counts(other_offset: int, refused: bool) -> None:
    """Sentinel (or an operator) promoted new after old's death, before other was pointed at it: key counts of two
    copies of one history differ by expiries and by what each had taken, so they decide nothing. other is only a
    loss when it took writes past new's promotion point: one heartbeat further (a PING, 14 bytes, no write is that
    short) is none; two (28) cannot be told from a write."""
    shard = Shard()
    shard.master(shard.new, keys=298, **promoted(at=9984))
    shard.replica(shard.other, of=shard.old, link="connect", keys=300 if not refused else 290, offset=other_offset)
    if refused:
        assert f"{shard.other} (290 keys, offset {other_offset}" in refusal(shard)
    else:
        assert followed(shard.plan()) == {shard.new}


def test_a_master_never_promoted_with_fewer_keys_than_the_old_masters_replica_is_refused() -> None:
    """A master that was never a replica holds keys of its own: no history to compare, and the replica of the
    crashed declared master holds more."""
    shard = Shard()
    shard.master(shard.new, keys=50, **NEVER_PROMOTED)
    shard.replica(shard.other, of=shard.old, link="connect", offset=9984)
    assert f"{shard.other} (300 keys" in refusal(shard)


@pytest.mark.parametrize("other", ["down", "never synced"])
def test_an_empty_promoted_replica_nothing_vouches_for_is_refused(other: str) -> None:
    """new holds no keys and no running node shares the history it was promoted from: it may have been promoted
    before its first sync, and old, down, may hold the data on its disk."""
    shard = Shard()
    shard.master(shard.new, **PROMOTED)
    if other == "down":
        shard.down(shard.other)
    else:
        shard.replica(shard.other, of=shard.old, link="connect", keys=0)
    text = refusal(shard)
    assert "holds no keys" in text and f"make {shard.new} its replica again" in text, text
    assert f"apply then starts {shard.old} as the master" in text, text
    if other == "down":  # one replica per master: no replica to point at new
        assert "no other node runs to follow it" in text and "point " not in text, text
    else:
        assert f"point {shard.other} at it (REPLICAOF {' '.join(map(str, shard.address(shard.new)))} on each)" \
            in text, text


def test_an_empty_shard_follows_the_empty_promoted_replica() -> None:
    """Nothing was written: other took old's history as far as new had (offset 0), so nothing is lost."""
    shard = Shard()
    shard.master(shard.new, **PROMOTED)
    shard.replica(shard.other, of=shard.old, link="connect", keys=0, offset=0)
    assert followed(shard.plan()) == {shard.new}


def test_rolling_order_and_the_failover_before_a_restart_ask_the_same_decision() -> None:
    """Rolling order and the failover before a master's restart asked on their own who is master (any member
    answering as one): a stray empty master beside the serving one got a failover step, which the runbook
    refuses ('not a master now') until the step times out, while replication_steps made it a replica."""
    shard = Shard()
    shard.master(shard.old, keys=300, replicas=(shard.new,))
    shard.replica(shard.new, of=shard.old)
    shard.master(shard.other, **NEVER_PROMOTED)
    shard.facts = {n: replace(f, record=replace(f.record, pending_restart=True)) for n, f in shard.facts.items()}
    plan = shard.plan()
    assert [(s.kind, s.node) for s in plan.steps if isinstance(s, (Failover, RestartNode, Replicate))] == [
        ("restart", shard.new), ("restart", shard.other), ("failover", shard.old), ("restart", shard.old),
        ("replicate", shard.other)]
    assert [s.needs_downtime for s in plan.steps if isinstance(s, RestartNode)] == [False, False, False]


def test_a_step_follows_the_master_it_finds_when_it_runs_not_the_one_the_plan_named() -> None:
    """A replicate step runs after a failover the same plan made (a restart-only change beside a new replica):
    the master it was planned towards is a replica now. It follows the shard's master of its own look; the
    master itself has nothing to follow; with no master answering it refuses."""
    shard = Shard()
    layout, members = shard.loaded.layout, shard.loaded.layout.shards[0]
    shard.master(shard.new, keys=300, replicas=(shard.old, shard.other), **promoted(at=9984))
    shard.replica(shard.old, of=shard.new)
    shard.replica(shard.other, of=shard.new)
    assert follow_target(layout, members, shard.other, shard.facts) == shard.new
    assert follow_target(layout, members, shard.new, shard.facts) is None
    shard.down(shard.new)
    with pytest.raises(RefusedError, match=f"no master to point {shard.other} at: {shard.old}, .* answers as a "
                                           "replica"):
        follow_target(layout, members, shard.other, shard.facts)
    shard.down(shard.old)
    with pytest.raises(RefusedError, match=f"no master to point {shard.other} at: {shard.old}, .* does not answer"):
        follow_target(layout, members, shard.other, shard.facts)


def test_a_failover_or_restart_step_asks_who_takes_the_writes_when_it_runs() -> None:
    """A plan's failover away from old, run after old was failed over by someone else: it waited for the runbook's
    pre-checks ('old is not a master now') until its 60 s ran out. The step asks who took old's writes: new, so
    there is nothing to fail over; while the look cannot tell (no member answers as the master), the runbook
    decides. A restart planned for new as a replica finds that new takes the writes now."""
    shard = Shard()
    layout, members = shard.loaded.layout, shard.loaded.layout.shards[0]
    shard.master(shard.old, keys=300, replicas=(shard.new, shard.other))
    shard.replica(shard.new, of=shard.old)
    shard.replica(shard.other, of=shard.old)
    assert writes_moved_from(layout, members, shard.old, shard.facts) is None
    assert [takes_writes(layout, members, n, shard.facts) for n in members.members] == [True, False, False]
    shard.master(shard.new, keys=300, replicas=(shard.old, shard.other), **promoted(at=9984))
    shard.replica(shard.old, of=shard.new)
    shard.replica(shard.other, of=shard.new)
    assert writes_moved_from(layout, members, shard.old, shard.facts) == shard.new
    assert writes_moved_from(layout, members, shard.new, shard.facts) is None
    assert [takes_writes(layout, members, n, shard.facts) for n in members.members] == [False, True, False]
    shard.down(shard.new)  # the look cannot tell: old, the declared master, answers as a replica
    assert writes_moved_from(layout, members, shard.old, shard.facts) is None
    assert not any(takes_writes(layout, members, n, shard.facts) for n in members.members)


def test_a_step_planned_towards_a_master_this_plan_fails_over_says_so() -> None:
    """The plan shape of that case: failover, restart, then the replicate step of the new node, whose reason says
    it follows the master it finds when it runs."""
    shard = Shard()
    shard.master(shard.old, keys=300, replicas=(shard.new,))
    shard.replica(shard.new, of=shard.old)
    shard.facts = {n: replace(f, record=replace(f.record, pending_restart=True)) for n, f in shard.facts.items()}
    shard.facts[shard.other] = NodeFacts(shard.other, False)  # new: no record
    plan = shard.plan()
    steps = [(s.kind, s.node) for s in plan.steps]
    assert steps.index(("failover", shard.old)) < steps.index(("replicate", shard.other)), steps
    replicate = next(s for s in plan.steps if isinstance(s, Replicate))
    assert replicate.reason == (f"should replicate the shard's master when the step runs ({shard.old} now, which "
                                "this plan fails over first)")


def test_with_a_failover_in_the_plan_the_sentinels_it_needs_start_before_it() -> None:
    """The failover's pre-check wants every sentinel's CKQUORUM OK: a new sentinel (one on a new host) started
    after it, as sentinel steps were, timed out the failover step after 60 s."""
    shard = Shard("sentinel")
    shard.master(shard.old, keys=300, replicas=(shard.new, shard.other))
    shard.replica(shard.new, of=shard.old)
    shard.replica(shard.other, of=shard.old)
    shard.facts = {n: replace(f, record=replace(f.record, pending_restart=True)) for n, f in shard.facts.items()}
    name, (address, port) = sentinel_master_name(shard.loaded.spec), shard.address(shard.old)
    *running, new = [n.name for n in shard.loaded.layout.sentinels]
    for sentinel in running:
        shard.facts[sentinel] = NodeFacts(sentinel, True, record=recorded(shard.want[sentinel]), reachable=True,
                                          info={"master0": f"name={name},status=ok,address={address}:{port},"
                                                           "slaves=2,sentinels=3"},
                                          role=RoleInfo("sentinel", monitors=(name,)))
    shard.facts[new] = NodeFacts(new, False)
    steps = [(s.kind, s.node) for s in shard.plan().steps]
    assert steps.index(("start", new)) < steps.index(("failover", shard.old)), steps


def test_the_node_to_promote_is_the_one_furthest_into_the_history_and_renamed_replicaof_is_explained() -> None:
    """The refusal is decided by replication offsets, so the node it suggests promoting is the one furthest into
    old's history, not the one with most keys (expiries make a copy that got further hold fewer). In password mode
    REPLICAOF is renamed (hardening.rename_takeover_commands): the hint says where its name is, not the name."""
    shard = Shard(hosts=4)
    fourth = shard.more[0]
    shard.master(shard.new, **promoted(at=9984))
    shard.replica(shard.other, of=shard.old, link="connect", keys=300, offset=10100)
    shard.replica(fourth, of=shard.old, link="connect", keys=250, offset=10200)
    text = refusal(shard)
    address, port = shard.address(fourth)
    assert f"{fourth}'s (REPLICAOF NO ONE on {fourth}, then REPLICAOF {address} {port} on {shard.new})" in text, text
    assert f"on {shard.other}, {fourth}), or" in text, text
    assert "`opsctl render -f SPEC --dir -` prints it" in text and "OPS_REPLICAOF" not in text, text
    assert "heartbeats" in text and f"{shard.old} once it starts" in text, text


def fenced(shard: Shard, name: str, seen: str) -> None:
    """name refuses writes behind an interrupted failover's fence, as a look sees it: in the whole config (a plan's
    look), or in the fence's own read (a look without the config: a step's)."""
    f = shard.facts[name]
    shard.facts[name] = replace(f, config={**(f.config or {}), TO_WRITE: FENCE}) if seen == "config" else \
        replace(f, config=None, fence={TO_WRITE: FENCE})


@pytest.mark.parametrize("heartbeats", [0, 2])
@pytest.mark.parametrize("seen", ["config", "fence read"])
def test_a_fenced_old_master_is_not_the_master_a_plan_or_a_step_follows(seen: str, heartbeats: int) -> None:
    """An interrupted failover (opsctl killed after REPLICAOF NO ONE on new): old, fenced, is still a master with
    300 keys and other still follows it; new was promoted where old's stream was. Every look that sees the fence
    follows new; a step's look read no config, so fenced() was always False there and steps pointed other at the
    fenced old master. The fenced master keeps streaming heartbeats to other (28 bytes after 20 s): past the
    promotion that stream carries no write (the fence refuses them), so those offsets are no data new lacks."""
    shard = Shard()
    at = 9984 + 14 * heartbeats
    shard.master(shard.old, keys=300, replicas=(shard.other,), master_replid=OLD_HISTORY, master_repl_offset=str(at))
    shard.replica(shard.other, of=shard.old, offset=at)
    shard.master(shard.new, keys=300, **promoted(at=9984))
    fenced(shard, shard.old, seen)
    layout, members = shard.loaded.layout, shard.loaded.layout.shards[0]
    assert current_master(members, layout, shard.facts) == shard.new
    assert follow_target(layout, members, shard.other, shard.facts) == shard.new
    assert start_master(layout, members, shard.facts) == shard.new
    if seen == "config":
        assert [type(s) for s in shard.plan().steps][:2] == [FinishFailover, Replicate]


def test_an_interrupted_failover_is_finished_alone_before_a_restart() -> None:
    """Killed after the promotion (old fenced, other still following it), then a restart-only change: the plan
    restarted old first, which came back unfenced and took writes again ('t-2 is no longer shard 1's master: t-1
    took its writes'), failed nothing over, and finish-failover found no fence: two masters, and the wait for the
    replicas timed out after 60 s. The failover is finished alone; apply then plans the restarts."""
    shard = Shard()
    shard.master(shard.old, keys=300, replicas=(shard.other,), master_replid=OLD_HISTORY, master_repl_offset="9984")
    shard.replica(shard.other, of=shard.old, offset=9984)
    shard.master(shard.new, keys=300, **promoted(at=9984))
    fenced(shard, shard.old, "config")
    shard.facts = {n: replace(f, record=replace(f.record, pending_restart=True)) for n, f in shard.facts.items()}
    plan = shard.plan()
    assert [(s.kind, s.node) for s in plan.steps] == [("finish-failover", shard.old)] and plan.replan, plan.steps
    assert "finished first" in plan.notes[0]


def test_a_fenced_old_master_holding_more_keys_than_the_promoted_one_is_refused() -> None:
    """Past the promotion the fenced master's offsets tell nothing, so keys do: a replica promoted before it had
    caught up (by hand, beside the interrupted failover) lacks keys the old master holds."""
    shard = Shard()
    shard.master(shard.old, keys=300, replicas=(shard.other,), master_replid=OLD_HISTORY, master_repl_offset="10012")
    shard.replica(shard.other, of=shard.old, offset=10012)
    shard.master(shard.new, keys=250, **promoted(at=9984))
    fenced(shard, shard.old, "config")
    text = refusal(shard)
    assert f"but {shard.old} (300 keys, offset 10012), {shard.other} (300 keys" in text, text
    assert "once it starts" not in text and "heartbeats" not in text, text
