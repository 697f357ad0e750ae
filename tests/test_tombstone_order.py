"""A retired node's tombstone is written before its folder is purged (issue 22, item 1: a retired name is never
given again): the tombstone says `purging` until the purge is done, placement retires such a node again (so the
next plan finishes the purge) and never gives its name to a new node. The providers purge down to the record.
Pure, plus the Ansible purge command run by a real sh and the local provider's folder."""

from __future__ import annotations

import subprocess

from opsctl.providers.ansible import purge_command
from opsctl.providers.localfiles import RECORD, empty_but_record
from opsctl.spec.deployed import Deployed, NodeRecord, deployed_from_records
from opsctl.spec.layout import replication_layout
from opsctl.spec.placement import placed_layout, surplus_members
from tests.support import make_spec
from tests.test_placement import records_of, spec_with, with_fourth_host
from tests.test_planner import load_dict


def _grown_then_shrunk() -> tuple[list[Deployed], list[str]]:
    """Records of a 4 x 2 cluster on 4 hosts, and the names placement retires once replicas_per_master is 1."""
    from opsctl.spec.layout import cluster_layout

    spec2 = load_dict(with_fourth_host(spec_with(masters=4, replicas_per_master=2))).spec
    deployed = records_of(placed_layout(spec2, records_of(cluster_layout(load_dict(spec_with()).spec))))
    spec1 = load_dict(with_fourth_host(spec_with(masters=4, replicas_per_master=1))).spec
    return deployed, [n.name for n in placed_layout(spec1, deployed).retired]


def test_a_tombstone_left_purging_is_retired_again_and_its_name_never_given() -> None:
    deployed, retired = _grown_then_shrunk()
    gone = retired[0]
    spec1 = load_dict(with_fourth_host(spec_with(masters=4, replicas_per_master=1))).spec
    spec2 = load_dict(with_fourth_host(spec_with(masters=4, replicas_per_master=2))).spec
    tomb = [Deployed(d.name, d.host, d.port, d.role, d.shard, retired=True, purging=True) if d.name == gone else d
            for d in deployed]
    placed = placed_layout(spec1, tomb)
    assert gone in {n.name for n in surplus_members(placed)}  # the plan purges it (remove-node with purge)
    assert "purge was left undone" in (placed.reason(gone) or "")
    assert gone not in {n.name for n in placed.servers}
    done = [Deployed(d.name, d.host, d.port, d.role, d.shard, retired=True) if d.name == gone else d
            for d in deployed]
    assert gone not in {n.name for n in placed_layout(spec1, done).retired}  # purged: nothing left to do
    for records in (tomb, done):  # replicas back up: the tombstone's name is never given to a new node
        back = placed_layout(spec2, [d for d in records if d.name not in retired or d.name == gone])
        assert gone not in {n.name for n in back.servers}


def test_a_replication_tombstone_left_purging_is_retired_again() -> None:
    base = make_spec("sentinel", hosts=3)
    spec = load_dict(base).spec
    deployed = [Deployed(n.name, n.host, n.port, n.role, n.shard, address=n.address)
                for n in replication_layout(spec).nodes]
    replica = next(d for d in deployed if d.role == "replica" and d.host == "h3")
    fewer = load_dict({**base, "replication": {**base["replication"], "replicas": ["h2"]}}).spec
    tomb = [Deployed(d.name, d.host, d.port, d.role, d.shard, retired=True, address=d.address, purging=True)
            if d is replica else d for d in deployed]
    placed = placed_layout(fewer, tomb)
    assert [n.name for n in placed.retired] == [replica.name]
    assert "purge was left undone" in (placed.reason(replica.name) or "")
    back = placed_layout(spec, tomb)  # h3 holds a replica again: a new name, never the tombstone's
    assert replica.name not in {n.name for n in back.servers}
    assert replica.name in {n.name for n in back.retired}


def test_records_say_purging_only_for_a_tombstone() -> None:
    was = {"host": "h1", "port": 7000, "role": "replica", "shard": 1}
    records = {"t-1": {"deployed": was, "retired": True, "purging": True}, "t-2": {"deployed": was, "retired": True},
               "t-3": {"deployed": was, "purging": True}}
    found = deployed_from_records({name: NodeRecord.from_json(record) for name, record in records.items()})
    assert [(d.retired, d.purging) for d in found] == [(True, True), (True, False), (False, False)]


def test_purges_keep_the_record_when_asked(tmp_path) -> None:
    root = tmp_path / "spec root"
    for node in ("n-1", "n-2"):
        (root / node / "data").mkdir(parents=True)
        (root / node / "redis.conf").write_text("port 1\n")
        (root / node / RECORD).write_text("{}\n")
    (root / "nodes").mkdir()
    (root / "nodes" / "n-1.env").write_text("")
    command = purge_command(str(root), str(root / "n-1"), "n-1", "opsctl-n-1", keep=RECORD)
    assert subprocess.run(["sh", "-c", command], capture_output=True, check=False).returncode == 0
    assert sorted(p.name for p in (root / "n-1").iterdir()) == [RECORD]
    assert not (root / "nodes" / "n-1.env").exists() and (root / "nodes").is_dir()
    again = subprocess.run(["sh", "-c", purge_command(str(root), str(root / "n-9"), "n-9", "opsctl-n-9", keep=RECORD)],
                           capture_output=True, check=False)
    assert again.returncode == 0  # a folder already gone is purged
    (root / "n-2" / "link").symlink_to(root / "n-2" / "redis.conf")
    empty_but_record(root / "n-2")
    assert sorted(p.name for p in (root / "n-2").iterdir()) == [RECORD]


def test_a_parked_shard_comes_back_as_the_same_placement_and_its_names_go_to_no_other_node() -> None:
    """cluster.masters down parks the last shard (records kept, no tombstone); up again, the same names, hosts, ports
    and shard; a replica added meanwhile to the other shards gets a name above the parked ones."""
    from opsctl.spec.layout import cluster_layout, deployed_as

    four = load_dict(with_fourth_host(spec_with(masters=4))).spec
    deployed = records_of(cluster_layout(four))
    parked = {n.name: deployed_as(n) for n in cluster_layout(four).servers if n.shard == 4}
    three_wider = load_dict(with_fourth_host(spec_with(masters=3, replicas_per_master=2))).spec
    down = placed_layout(three_wider, deployed)
    assert set(parked) <= {n.name for n in down.retired}  # parked: drained and stopped, never a member
    new = {n.name for n in down.servers} - {d.name for d in deployed}
    assert not new & set(parked) and min(int(n.rsplit("-", 1)[1]) for n in new) > max(
        int(n.rsplit("-", 1)[1]) for n in parked)
    now = [*records_of(down), *(d for d in deployed if d.name in parked)]  # the servers run, the parked kept
    back = placed_layout(load_dict(with_fourth_host(spec_with(masters=4, replicas_per_master=2))).spec, now)
    assert {n: deployed_as(back.node(n)) for n in parked} == parked
