"""Placement and shape steps of replication and Sentinel topologies (issue 22, item 5): deployed servers and
sentinels keep name, host and port; new ones get new names; the ones on hosts the spec no longer gives one retire,
a master among them fails over first, sentinels forget them, a quorum is raised only after the new sentinels
start. Pure."""

from __future__ import annotations

import pytest

from opsctl.base.errors import RefusedError
from opsctl.observe.replies import RoleInfo
from opsctl.plan.facts import NodeFacts
from opsctl.plan.replication import raises_quorum
from opsctl.plan.replshape import drain_failovers, retire_steps, stale_sentinels
from opsctl.plan.steps import Failover, RemoveNode, SentinelReset, SentinelSet, StartNode, WaitConverged
from opsctl.spec.deployed import Deployed, NodeRecord
from opsctl.spec.layout import Layout, deployed_as, replication_layout
from opsctl.spec.placement import placed_layout
from tests.support import make_spec
from tests.test_planner import load_dict

BASE = make_spec("sentinel", hosts=3)


def records_of(layout: Layout) -> list[Deployed]:
    return [Deployed(n.name, n.host, n.port, n.role, n.shard, address=n.address) for n in layout.nodes]


def moved() -> dict:
    """h1 (the master's host) removed; h4, h5 added; servers on h2-h4, sentinels on every host."""
    prefix = BASE["hosts"][0]["address"].rsplit(".", 1)[0]
    hosts = [*BASE["hosts"][1:], *({"name": f"h{i}", "address": f"{prefix}.{i}"} for i in (4, 5))]
    return {**BASE, "hosts": hosts, "replication": {**BASE["replication"], "master": "h2", "replicas": ["h3", "h4"]}}


def test_nothing_deployed_or_all_in_place_is_the_positional_layout() -> None:
    spec = load_dict(BASE).spec
    assert placed_layout(spec, []) == replication_layout(spec)
    assert placed_layout(spec, records_of(replication_layout(spec))) == replication_layout(spec)


def test_a_removed_host_retires_its_nodes_and_new_hosts_get_new_names() -> None:
    was = replication_layout(load_dict(BASE).spec)
    spec = load_dict(moved()).spec
    placed = placed_layout(spec, records_of(was))
    name = spec.name
    base = spec.replication_or_default().base_port
    for node in placed.nodes:  # deployed nodes stand where they stood
        if (old := was.find(node.name)) is not None:
            assert deployed_as(node) == deployed_as(old)
    assert placed.shards[0].master == f"{name}-2"  # on the declared master host, though recorded a replica
    assert placed.shards[0].replicas == (f"{name}-3", f"{name}-4")
    assert (placed.node(f"{name}-4").host, placed.node(f"{name}-4").port) == ("h4", base + 3)
    assert sorted(n.name for n in placed.sentinels) == [f"{name}-sentinel-{i}" for i in (2, 3, 4, 5)]
    assert sorted(n.name for n in placed.retired) == [f"{name}-1", f"{name}-sentinel-1"]
    assert all(n.address == BASE["hosts"][0]["address"] for n in placed.retired)
    assert "h1 removed from the spec" in (placed.reason(f"{name}-1") or "")


def test_a_retired_name_is_never_given_again_and_a_record_without_address_is_an_orphan() -> None:
    was = records_of(replication_layout(load_dict(BASE).spec))
    spec = load_dict(moved()).spec
    tombstone = Deployed(f"{spec.name}-7", "h9", 9999, "replica", 1, retired=True)
    assert placed_layout(spec, [*was, tombstone]).shards[0].replicas[-1] == f"{spec.name}-8"
    bare = [Deployed(d.name, d.host, d.port, d.role, d.shard) for d in was]
    assert placed_layout(spec, bare).orphans == (f"{spec.name}-1", f"{spec.name}-sentinel-1")


def role(kind: str, master: tuple[str, int] | None = None) -> RoleInfo:
    return RoleInfo(kind, master=master, link="connected" if master else None)


def test_a_retired_master_fails_over_first_or_is_refused_without_a_follower() -> None:
    spec = load_dict(moved()).spec
    placed = placed_layout(spec, records_of(replication_layout(load_dict(BASE).spec)))
    old = Layout(placed.retired).node(f"{spec.name}-1")
    facts = {f"{spec.name}-1": NodeFacts(old.name, True, reachable=True, role=role("master")),
             f"{spec.name}-2": NodeFacts(f"{spec.name}-2", True, reachable=True,
                                         role=role("replica", (old.address, old.port)))}
    assert [type(s) for s in drain_failovers(placed, facts)] == [Failover]
    facts[f"{spec.name}-2"] = NodeFacts(f"{spec.name}-2", False)
    with pytest.raises(RefusedError) as refused:
        drain_failovers(placed, facts)
    assert refused.value.exit_code == 3 and "no server the spec keeps replicates it" in refused.value.summary


def test_retired_nodes_go_after_the_new_replicas_synced_then_the_sentinels_reset() -> None:
    spec = load_dict(moved()).spec
    placed = placed_layout(spec, records_of(replication_layout(load_dict(BASE).spec)))
    steps = retire_steps(placed, {}, [StartNode(f"{spec.name}-4", "new")])
    assert [type(s) for s in steps] == [WaitConverged, RemoveNode, RemoveNode, SentinelReset]
    assert [s.node for s in steps if isinstance(s, RemoveNode)] == [f"{spec.name}-1", f"{spec.name}-sentinel-1"]
    assert retire_steps(replication_layout(spec), {}, []) == []


def test_a_sentinel_counting_more_than_the_layout_has_is_reset() -> None:
    spec = load_dict(BASE).spec
    layout = replication_layout(spec)
    first = layout.sentinels[0].name
    stale = {"master0": "name=x,status=ok,slaves=3,sentinels=3"}
    counting = {first: NodeFacts(first, True, reachable=True, info=stale)}
    assert stale_sentinels(layout, counting) == [first]
    assert [type(s) for s in retire_steps(layout, counting, [])] == [SentinelReset]
    counting[first] = NodeFacts(first, True, info={"master0": "name=x,status=ok,slaves=2,sentinels=2"})
    assert stale_sentinels(layout, counting) == []  # fewer: still discovering, not stale


def test_a_raised_quorum_waits_for_the_new_sentinels() -> None:
    name = "s"
    had = NodeFacts(name, True, record=NodeRecord(directives=(("sentinel monitor", "t 127.0.0.1 7000 2"),)))
    assert raises_quorum(SentinelSet(name, "spec", (("quorum", "3"),)), {name: had})
    assert not raises_quorum(SentinelSet(name, "spec", (("quorum", "2"),)), {name: had})
    assert not raises_quorum(SentinelSet(name, "spec", (("down-after-milliseconds", "9"),)), {name: had})


def test_a_replacement_at_a_new_address_makes_the_dead_one_stale() -> None:
    """A dead host's server replaced at a new address: the sentinels still count the dead one at the old address,
    so once the replacement joins they count one too many; the plan resets them. A plain scale-up does not."""
    spec = load_dict(BASE).spec
    layout = replication_layout(spec)
    first, replica = layout.sentinels[0].name, layout.shards[0].replicas[0]
    two, one = ({"master0": f"name=x,status=ok,slaves={n},sentinels=3"} for n in (2, 1))
    facts = {first: NodeFacts(first, True, reachable=True, info=two), replica: NodeFacts(replica, False)}
    assert [type(s) for s in retire_steps(layout, facts, [StartNode(replica, "new node")])] == [SentinelReset]
    counting = {first: NodeFacts(first, True, reachable=True, info=one), replica: NodeFacts(replica, False)}
    assert retire_steps(layout, counting, [StartNode(replica, "new node")]) == []
