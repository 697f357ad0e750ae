"""Placement from (spec, what is deployed): deployed nodes keep name, host, port and shard; new ones get new names,
free ports and hosts that keep a shard's members apart (issue 22, stable identity). Pure."""

from __future__ import annotations

from opsctl.spec.layout import Layout, cluster_layout, deployed_as
from opsctl.spec.model import Spec
from opsctl.spec.placement import Deployed, placed_layout, surplus_members
from tests.support import make_spec
from tests.test_planner import load_dict

BASE = make_spec("cluster", hosts=3)


def spec_with(**cluster: int) -> dict:
    """One spec (one name, one set of hosts) with cluster settings changed."""
    return {**BASE, "cluster": {**BASE["cluster"], "base_port": 7101, **cluster}}


def records_of(layout: Layout) -> list[Deployed]:
    return [Deployed(n.name, n.host, n.port, n.role, n.shard) for n in layout.servers]


def with_fourth_host(spec: dict) -> dict:
    return {**spec, "hosts": [*spec["hosts"], {"name": "h4", "address": spec["hosts"][0]["address"][:-1] + "4"}]}


def test_nothing_deployed_or_all_in_place_is_the_positional_layout() -> None:
    spec = load_dict(spec_with()).spec
    assert placed_layout(spec, []) == cluster_layout(spec)
    assert placed_layout(spec, records_of(cluster_layout(spec))) == cluster_layout(spec)
    grown = load_dict(spec_with(masters=4)).spec  # scale-out: shard 4 as today (names 7, 8)
    assert placed_layout(grown, records_of(cluster_layout(spec))) == cluster_layout(grown)


def test_scale_in_retires_the_deployed_shard() -> None:
    spec = load_dict(spec_with()).spec
    wide = cluster_layout(load_dict(spec_with(masters=4)).spec)
    placed = placed_layout(spec, records_of(wide))
    assert placed.nodes == cluster_layout(spec).nodes
    assert [n.name for n in placed.retired] == [f"{spec.name}-7", f"{spec.name}-8"]


def test_more_replicas_a_host_and_a_shard_keep_every_deployed_node() -> None:
    before = load_dict(spec_with()).spec
    deployed = records_of(cluster_layout(before))
    after = load_dict(with_fourth_host(spec_with(masters=4, replicas_per_master=2))).spec
    placed = placed_layout(after, deployed)
    for d in deployed:
        assert deployed_as(placed.node(d.name)) == {"host": d.host, "port": d.port, "role": d.role, "shard": d.shard}
    assert len(placed.servers) == 12 and len(placed.shards) == 4
    new = [n for n in placed.servers if n.name not in {d.name for d in deployed}]
    assert sorted(int(n.name.rsplit("-", 1)[1]) for n in new) == list(range(7, 13))  # above every used name
    for shard in placed.shards:
        hosts = [placed.node(m).host for m in shard.members]
        assert len(hosts) == len(set(hosts)), shard
    masters = [placed.node(s.master).host for s in placed.shards]
    assert len(set(masters)) == 4  # spread: the new shard's master on the new host
    ports = [(n.address, n.port) for n in placed.servers]
    assert len(ports) == len(set(ports))
    loads = [sum(n.host == h.name for n in placed.servers) for h in after.hosts]
    assert max(loads) - min(loads) <= 1, loads
    assert "new replica of shard 2 (replicas_per_master 1 -> 2)" in (placed.reason(f"{after.name}-8") or "")


def test_fewer_replicas_retire_the_newest_and_names_are_never_reused() -> None:
    spec2 = load_dict(with_fourth_host(spec_with(masters=4, replicas_per_master=2))).spec
    deployed = records_of(placed_layout(spec2, records_of(cluster_layout(load_dict(spec_with()).spec))))
    spec1 = load_dict(with_fourth_host(spec_with(masters=4, replicas_per_master=1))).spec
    placed = placed_layout(spec1, deployed)
    assert len(placed.servers) == 8 and len(placed.retired) == 4
    assert all("surplus replica" in (placed.reason(n.name) or "") for n in placed.retired)
    kept = {n.name for n in placed.servers}
    tomb = [Deployed(n.name, n.host, n.port, n.role, n.shard, retired=True) for n in placed.retired]
    back = placed_layout(spec2, [d for d in deployed if d.name in kept] + tomb)
    new = {n.name for n in back.servers} - kept
    assert not new & {n.name for n in placed.retired}  # a retired node's name is not given again
    assert min(int(n.rsplit("-", 1)[1]) for n in new) == 13


def test_the_shards_master_now_is_never_the_surplus_member_retired() -> None:
    """After a failover a recorded replica serves: lowering replicas_per_master retires another member, never it."""
    spec2 = load_dict(with_fourth_host(spec_with(masters=4, replicas_per_master=2))).spec
    deployed = records_of(placed_layout(spec2, records_of(cluster_layout(load_dict(spec_with()).spec))))
    spec1 = load_dict(with_fourth_host(spec_with(masters=4, replicas_per_master=1))).spec
    blind = placed_layout(spec1, deployed)
    retired = {n.name for n in blind.retired}
    serving = sorted(retired)[:1]  # one of them was promoted by hand
    assert surplus_members(blind) == list(blind.retired)
    placed = placed_layout(spec1, deployed, serving)
    assert serving[0] in {n.name for n in placed.servers}
    assert serving[0] not in {n.name for n in placed.retired} and len(placed.retired) == 4
    shard = placed.shard_of(serving[0])
    assert shard is not None and len(shard.members) == 2
    kept = {n.name: n for n in placed.servers}
    assert deployed_as(kept[serving[0]])["role"] == "replica"  # its record stays as deployed: roles are not drift
    assert placed_layout(spec1, deployed, [n.name for n in blind.servers]) == blind  # the recorded masters serve


def drained_spec() -> tuple[Spec, list[Deployed], Spec]:
    """3 hosts deployed (records with addresses), then h4 added and h2 removed."""
    before = load_dict(spec_with()).spec
    deployed = [Deployed(n.name, n.host, n.port, n.role, n.shard, address=n.address)
                for n in cluster_layout(before).servers]
    data = with_fourth_host(spec_with())
    after = load_dict({**data, "hosts": [h for h in data["hosts"] if h["name"] != "h2"]}).spec
    return before, deployed, after


def test_a_removed_host_is_drained_its_nodes_replaced_elsewhere_by_new_names() -> None:
    before, deployed, after = drained_spec()
    placed = placed_layout(after, deployed)
    on_h2 = {d.name for d in deployed if d.host == "h2"}
    assert {n.name for n in placed.retired} == on_h2 and not placed.orphans
    assert all(n.address == before.hosts[1].address for n in placed.retired)  # stopped and forgotten by address
    for d in deployed:
        if d.host != "h2":
            assert deployed_as(placed.node(d.name)) == {"host": d.host, "port": d.port, "role": d.role,
                                                        "shard": d.shard}
    new = [n for n in placed.servers if n.name not in {d.name for d in deployed}]
    assert len(new) == len(on_h2) and all(n.host != "h2" for n in new)
    assert sorted(int(n.name.rsplit("-", 1)[1]) for n in new) == [7, 8]
    for shard in placed.shards:
        hosts = [placed.node(m).host for m in shard.members]
        assert len(hosts) == len(set(hosts)) == 2, shard
    for name in on_h2:
        why = placed.reason(name) or ""
        assert "h2 removed from the spec" in why and "replaced by" in why, why


def test_a_removed_host_without_addresses_in_its_records_is_an_orphan() -> None:
    _before, deployed, after = drained_spec()
    placed = placed_layout(after, [Deployed(d.name, d.host, d.port, d.role, d.shard) for d in deployed])
    assert set(placed.orphans) == {d.name for d in deployed if d.host == "h2"}
