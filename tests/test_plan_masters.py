"""Who a replication shard's master is now (plan.masters.current_master), and that every step of one plan names
the same master: the write-config that makes a stopped node follow it, the replicate steps, the wait. Pure."""

from __future__ import annotations

import re

import pytest

from opsctl.errors import RefusedError
from opsctl.observe.parse import RoleInfo
from opsctl.plan.facts import NodeFacts
from opsctl.plan.masters import current_master, start_master
from opsctl.plan.planner import make_plan
from opsctl.plan.steps import Replicate, StartNode, WaitConverged, WriteConfig
from opsctl.spec.load import LoadedSpec
from tests.test_planner import desired, live_config, loaded_spec, recorded

PROMOTED = {"master_replid2": "c6ffc17231791ae879c0eecc23479c6269134b7c", "second_repl_offset": "1"}
NEVER_PROMOTED = {"master_replid2": "0" * 40, "second_repl_offset": "-1"}


class Shard:
    """Facts of the 3-node replication shard old (declared master, down), new and other."""

    def __init__(self, **sections: object) -> None:
        self.loaded: LoadedSpec = loaded_spec("replication", **sections)
        self.want = desired(self.loaded)
        self.old, self.new, self.other = self.loaded.layout.shards[0].members
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

    def replica(self, name: str, of: str, link: str = "connected", keys: int = 300) -> None:
        self.live(name, RoleInfo("replica", -1 if link != "connected" else 9984, self.address(of), link), keys,
                  master_link_status="up" if link == "connected" else "down")

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
    if moment == "before other is pointed":
        shard.master(shard.new, **PROMOTED)
        shard.replica(shard.other, of=shard.old, link="connect")
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
