"""Dead cluster nodes, the pure parts (issue 22, item 4): which ids are forgotten after a host is replaced at a new
address, and the refusal when slots are held only by failed nodes the spec no longer has."""

from __future__ import annotations

import pytest

from opsctl.base.errors import RefusedError
from opsctl.cluster.deadnodes import dead_nodes, forget_dead, promote_orphans
from opsctl.observe.replies import ClusterNodeLine
from opsctl.plan.facts import NodeFacts
from tests.support import make_spec
from tests.test_planner import load_dict


def line(node_id: str, endpoint: str, *flags: str, slots: tuple[tuple[int, int], ...] = ()) -> ClusterNodeLine:
    address, port = endpoint.rsplit(":", 1)
    return ClusterNodeLine(node_id, address, int(port), int(port) + 10000, frozenset(flags), None, 0, "connected",
                           slots)


def test_failed_nodes_at_an_address_the_spec_lost_are_forgotten_once() -> None:
    loaded = load_dict(make_spec("cluster", hosts=3))
    first = loaded.layout.servers[0]
    view = (line("me", first.endpoint, "myself", "master", slots=((0, 5460),)),
            line("dead1", "127.9.9.9:7001", "master", "fail"), line("dead2", "127.9.9.9:7002", "slave", "fail"),
            line("flaky", "127.9.9.9:7003", "slave", "fail?"), line("ours", loaded.layout.servers[1].endpoint,
                                                                    "slave", "fail"))
    facts = {first.name: NodeFacts(first.name, True, reachable=True, cluster_nodes=view)}
    assert dead_nodes(loaded.layout, facts) == {"dead1": "127.9.9.9:7001", "dead2": "127.9.9.9:7002",
                                                "flaky": "127.9.9.9:7003"}
    assert [s.ids for s in forget_dead(loaded.layout, facts)] == [("dead1", "dead2", "flaky")]
    assert promote_orphans(loaded, facts) == []  # no slot is held by a failed node


def test_slots_held_only_by_a_failed_node_are_refused_with_the_way_on() -> None:
    loaded = load_dict(make_spec("cluster", hosts=3))
    first = loaded.layout.servers[0]
    view = (line("me", first.endpoint, "myself", "master", slots=((0, 5460),)),
            line("dead", "127.9.9.9:7001", "master", "fail?", slots=((5461, 10922),)))
    facts = {first.name: NodeFacts(first.name, True, reachable=True, cluster_nodes=view)}
    with pytest.raises(RefusedError) as refused:
        promote_orphans(loaded, facts)
    assert refused.value.exit_code == 3 and "restore that shard from a backup" in refused.value.hint
    assert dead_nodes(loaded.layout, facts) == {}  # never forgotten while it holds slots


def test_an_unlinked_node_at_an_address_the_spec_lost_is_forgotten_before_it_is_flagged() -> None:
    """A killed host's members go failing one by one (each after node_timeout without a PONG): one that no node has
    flagged yet when apply looks, but that nothing links to, is forgotten with the rest (else the closing wait timed
    out on it). A linked, unflagged node there is not, nor an unlinked one at a spec node's address."""
    loaded = load_dict(make_spec("cluster", hosts=3))
    first, second = loaded.layout.servers[:2]
    unlinked = ClusterNodeLine("late", "127.9.9.9", 7002, 17002, frozenset({"slave"}), None, 0, "disconnected", ())
    answering = ClusterNodeLine("live", "127.9.9.9", 7003, 17003, frozenset({"slave"}), None, 0, "connected", ())
    restarting = ClusterNodeLine("ours", second.address, second.port, second.port + 10000, frozenset({"slave"}),
                                 None, 0, "disconnected", ())
    view = (line("me", first.endpoint, "myself", "master", slots=((0, 5460),)),
            line("dead", "127.9.9.9:7001", "slave", "fail"), unlinked, answering, restarting)
    facts = {first.name: NodeFacts(first.name, True, reachable=True, cluster_nodes=view)}
    assert dead_nodes(loaded.layout, facts) == {"dead": "127.9.9.9:7001", "late": "127.9.9.9:7002"}
    lost = ClusterNodeLine("gone", "127.9.9.9", 7004, 17004, frozenset({"master"}), None, 0, "disconnected",
                           ((5461, 10922),))
    with pytest.raises(RefusedError):
        promote_orphans(loaded, {first.name: NodeFacts(first.name, True, reachable=True,
                                                                 cluster_nodes=(*view, lost))})
