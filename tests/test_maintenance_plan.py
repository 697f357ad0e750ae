"""hosts[].maintenance, the pure parts (issue 22, item 6): which masters fail over and to whom, the refusal when a
shard has no member elsewhere, and the directive that keeps the held hosts' replicas from being promoted."""

from __future__ import annotations

import pytest

from opsctl.base.errors import RefusedError
from opsctl.observe.replies import RoleInfo
from opsctl.plan.facts import NodeFacts
from opsctl.plan.rolling import maintenance_failovers, refuse_unmovable
from opsctl.render.directives import maintenance
from tests.support import make_spec
from tests.test_planner import load_dict


def held(topology: str, *hosts: str, **sections: object) -> dict:
    spec = make_spec(topology, hosts=3, **sections)
    return {**spec, "hosts": [{**h, "maintenance": h["name"] in hosts} for h in spec["hosts"]]}


def running(layout, master: str) -> dict[str, NodeFacts]:  # type: ignore[no-untyped-def]
    node = layout.node(master)
    return {n.name: NodeFacts(n.name, True, reachable=True,
                              role=RoleInfo("master") if n.name == master else
                              RoleInfo("replica", master=(node.address, node.port), link="connected"))
            for n in layout.servers}


def test_a_cluster_master_on_a_held_host_fails_over_to_its_replica_elsewhere() -> None:
    loaded = load_dict(held("cluster", "h1"))
    layout = loaded.layout
    facts: dict[str, NodeFacts] = {}
    for shard in layout.shards:
        facts |= {k: v for k, v in running(layout, shard.master).items() if k in shard.members}
    steps = maintenance_failovers(loaded.spec, layout, facts, ())
    on_h1 = [s.master for s in layout.shards if layout.node(s.master).host == "h1"]
    assert [(s.node, layout.node(s.to).host != "h1") for s in steps] == [(m, True) for m in on_h1]
    assert maintenance_failovers(loaded.spec, layout, facts, set(on_h1)) == []  # already moving


def test_sentinel_chooses_and_a_shard_without_a_member_elsewhere_is_refused() -> None:
    loaded = load_dict(held("sentinel", "h1"))
    steps = maintenance_failovers(loaded.spec, loaded.layout, running(loaded.layout, f"{loaded.spec.name}-1"), ())
    assert [(s.node, s.to) for s in steps] == [(f"{loaded.spec.name}-1", "")]
    refuse_unmovable(loaded.spec, loaded.layout)
    both = load_dict(held("cluster", "h1", "h2"))
    with pytest.raises(RefusedError) as refused:
        refuse_unmovable(both.spec, both.layout)
    assert refused.value.exit_code == 3 and "maintenance rule" in refused.value.summary


def test_the_held_hosts_servers_are_never_promoted() -> None:
    cluster, sentinel = load_dict(held("cluster", "h1")), load_dict(held("sentinel", "h1"))
    on = {n.host: maintenance(cluster.spec, n) for n in cluster.layout.servers}
    assert on["h1"] == [("cluster-replica-no-failover", "yes")] and on["h2"] == []
    assert maintenance(sentinel.spec, sentinel.layout.servers[0]) == [("replica-priority", "0")]


def test_a_new_shard_master_is_not_placed_on_a_held_host() -> None:
    from opsctl.spec.placement import Deployed, placed_layout

    base = make_spec("cluster", hosts=3)
    deployed = [Deployed(n.name, n.host, n.port, n.role, n.shard) for n in load_dict(base).layout.servers]
    spec = {**base, "hosts": [*base["hosts"], {"name": "h4", "address": base["hosts"][0]["address"][:-1] + "4",
                                               "maintenance": True}],
            "cluster": {**base["cluster"], "masters": 4, "replicas_per_master": 2}}
    placed = placed_layout(load_dict(spec).spec, deployed)
    assert placed.node(placed.shards[3].master).host != "h4"  # h4, with no master, would win without the mark
