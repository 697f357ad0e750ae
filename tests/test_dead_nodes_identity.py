"""Dead cluster ids at a spec node's own endpoint (issue 22, item 4: a dead host replaced by a new machine at the
same address): an id there is gone when the node at that endpoint has another identity now (runs with another id,
or is down without a record: its folder went with its machine); a node down with its record comes back with its
nodes.conf and is never forgotten. Pure."""

from __future__ import annotations

import pytest

from opsctl.base.errors import RefusedError
from opsctl.cluster.deadnodes import dead_nodes, promote_orphans
from opsctl.plan.facts import NodeFacts
from opsctl.spec.deployed import DeployedAs, NodeRecord
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
    stopped = NodeFacts(other.name, False, record=NodeRecord("abc"))  # down with its folder: it comes back
    assert dead_nodes(layout, _facts(stopped, failed)) == {}
    me = line("new", other.endpoint, "myself", "slave")
    replaced = NodeFacts(other.name, True, reachable=True, cluster_nodes=(me,))  # runs with a new id
    assert dead_nodes(layout, _facts(replaced, failed)) == {"old": other.endpoint}
    itself = NodeFacts(other.name, True, reachable=True, cluster_nodes=(line("old", other.endpoint, "myself"),))
    assert dead_nodes(layout, _facts(itself, failed)) == {}  # flagged by a peer, but it is this very node


def test_slots_held_only_by_a_dead_id_at_a_replaced_endpoint_are_refused() -> None:
    loaded = load_dict(make_spec("cluster", hosts=3))
    other = loaded.layout.servers[1]
    failed = line("old", other.endpoint, "master", "fail", slots=((5461, 10922),))
    with pytest.raises(RefusedError):
        promote_orphans(loaded, _facts(NodeFacts(other.name, False), failed))
    assert promote_orphans(loaded, _facts(NodeFacts(other.name, False, record=NodeRecord("abc")), failed)) == []


def test_a_replication_master_without_its_folder_is_not_started_empty_over_the_data() -> None:
    """The master's host died and was replaced (no record, not running) while the replicas hold the data and none is
    the master: refused. Not refused when a master runs (a retired one too: it fails over first), when the master
    comes back from its files, or when no running replica holds a key."""
    from opsctl.observe.replies import RoleInfo
    from opsctl.plan.refusals import refuse_empty_master_start

    loaded = load_dict(make_spec("replication", hosts=3))
    shard = loaded.layout.shards[0]
    dead = ("127.9.9.9", 7000)  # the dead master's old address

    def facts(master: NodeFacts, keys: int = 5) -> dict[str, NodeFacts]:
        out = {shard.master: master}
        for name in shard.replicas:
            out[name] = NodeFacts(name, True, record=NodeRecord("d"), reachable=True, info={"db0": f"keys={keys}"},
                                  role=RoleInfo("replica", master=dead, link="connect"))
        return out

    with pytest.raises(RefusedError) as refused:
        refuse_empty_master_start(loaded, facts(NodeFacts(shard.master, False)))
    assert refused.value.exit_code == 3 and "REPLICAOF NO ONE" in refused.value.hint
    was_master = DeployedAs.of(loaded.layout.node(shard.master))
    returning = NodeFacts(shard.master, False, record=NodeRecord("d", deployed=was_master))
    refuse_empty_master_start(loaded, facts(returning))  # it comes back with its data
    refuse_empty_master_start(loaded, facts(NodeFacts(shard.master, False), keys=0))  # nothing to lose
    running = NodeFacts(shard.master, True, reachable=True, role=RoleInfo("master"))
    refuse_empty_master_start(loaded, facts(running))
