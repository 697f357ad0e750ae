"""Dead cluster ids at a spec node's own endpoint (issue 22, item 4: a dead host replaced by a new machine at the
same address): an id there is gone when the node at that endpoint has another identity now (runs with another id,
or is down without a record: its folder went with its machine); a node down with its record comes back with its
nodes.conf and is never forgotten. Pure."""

from __future__ import annotations

import pytest

from opsctl.base.errors import RefusedError
from opsctl.plan.deadnodes import dead_nodes, refuse_lost_shards
from opsctl.plan.facts import NodeFacts
from tests.support import make_spec
from tests.test_dead_nodes import line
from tests.test_planner import load_dict


def _facts(second: NodeFacts, *lines: object) -> dict[str, NodeFacts]:
    loaded = load_dict(make_spec("cluster", hosts=3))
    first = loaded.layout.servers[0]
    view = (line("me", first.endpoint, "myself", "master", slots=((0, 5460),)), *lines)
    return {first.name: NodeFacts(first.name, True, reachable=True, cluster_nodes=view), second.name: second}


def test_an_id_at_a_replaced_nodes_endpoint_is_dead_only_when_its_identity_went() -> None:
    layout = load_dict(make_spec("cluster", hosts=3)).layout
    other = layout.servers[1]
    failed = line("old", other.endpoint, "slave", "fail")
    fresh = NodeFacts(other.name, False)  # down, no record: a new machine at the dead host's address
    assert dead_nodes(layout, _facts(fresh, failed)) == {"old": other.endpoint}
    stopped = NodeFacts(other.name, False, record={"digest": "abc"})  # down with its folder: it comes back
    assert dead_nodes(layout, _facts(stopped, failed)) == {}
    me = line("new", other.endpoint, "myself", "slave")
    replaced = NodeFacts(other.name, True, reachable=True, cluster_nodes=(me,))  # runs with a new id
    assert dead_nodes(layout, _facts(replaced, failed)) == {"old": other.endpoint}
    itself = NodeFacts(other.name, True, reachable=True, cluster_nodes=(line("old", other.endpoint, "myself"),))
    assert dead_nodes(layout, _facts(itself, failed)) == {}  # flagged by a peer, but it is this very node


def test_slots_held_only_by_a_dead_id_at_a_replaced_endpoint_are_refused() -> None:
    layout = load_dict(make_spec("cluster", hosts=3)).layout
    other = layout.servers[1]
    failed = line("old", other.endpoint, "master", "fail", slots=((5461, 10922),))
    with pytest.raises(RefusedError):
        refuse_lost_shards(layout, _facts(NodeFacts(other.name, False), failed))
    refuse_lost_shards(layout, _facts(NodeFacts(other.name, False, record={"digest": "abc"}), failed))
