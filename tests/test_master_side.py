"""A master's own account of its replicas counts in every convergence check: a replica reports its link up before its
master puts it online (its first REPLCONF ACK), and writes under min-replicas-to-write wait for the master's count.
Seen as CI failures: NOREPLICAS on the first write after apply, and `failover --to` a replica apply had just added
refused because its master still listed it wait_bgsave. Pure."""

from __future__ import annotations

from opsctl.observe.cluster_state import cluster_problems
from opsctl.observe.replies import RoleInfo, listed_replicas, master_side_problems
from opsctl.plan.facts import NodeFacts
from opsctl.plan.health import node_problem, replication_problem
from tests.support import make_spec
from tests.test_planner import load_dict

ONLINE = "ip=127.0.0.2,port=7001,state=online,offset=100,lag=0"


def test_the_masters_list_is_read_in_order() -> None:
    info = {"role": "master", "slave1": "ip=127.0.0.3,port=7002,state=wait_bgsave,offset=0,lag=0", "slave0": ONLINE}
    assert [r["port"] for r in listed_replicas(info)] == ["7001", "7002"]
    assert master_side_problems(info) == ["lists replica 127.0.0.3:7002 as wait_bgsave (its sync is not done)"]


def test_online_replicas_not_counted_good_are_a_problem() -> None:
    assert master_side_problems({"role": "master", "slave0": ONLINE, "min_slaves_good_slaves": "0"}) == [
        "counts 0 of 1 online replica(s) as acking within min-replicas-max-lag"]
    assert master_side_problems({"role": "master", "slave0": ONLINE, "min_slaves_good_slaves": "1"}) == []
    assert master_side_problems({"role": "master", "slave0": ONLINE}) == []  # no min-replicas-to-write: no count
    assert master_side_problems({"role": "slave", "slave0": ONLINE.replace("online", "send_bulk")}) == []


def test_replication_waits_for_the_master_to_put_each_replica_online() -> None:
    loaded = load_dict(make_spec("replication", hosts=2))
    master, replica = (loaded.layout.node(n) for n in loaded.layout.shards[0].members)

    def facts(state: str) -> dict[str, NodeFacts]:
        listed = f"ip={replica.address},port={replica.port},state={state},offset=100,lag=0"
        return {master.name: NodeFacts(master.name, True, reachable=True, role=RoleInfo("master", 100),
                                       info={"role": "master", "slave0": listed}),
                replica.name: NodeFacts(replica.name, True, reachable=True, info={"role": "slave"},
                                        role=RoleInfo("replica", 100, (master.address, master.port), "connected"))}

    assert replication_problem(loaded.layout, facts("online")) is None
    assert replication_problem(loaded.layout, facts("wait_bgsave")) == (
        f"{master.name} lists replica {replica.address}:{replica.port} as wait_bgsave (its sync is not done)")
    assert node_problem(loaded, facts("online"), replica) is None
    assert node_problem(loaded, facts("send_bulk"), replica) == (
        f"{master.name} lists {replica.name} as send_bulk (its sync is not done)")


def test_a_cluster_is_not_converged_while_a_master_waits_for_a_replica() -> None:
    info = {"role": "master", "cluster_state": "ok", "slave0": ONLINE.replace("online", "wait_bgsave")}
    assert [p.render() for p in cluster_problems({}, {"a": info})] == [
        "a: lists replica 127.0.0.2:7001 as wait_bgsave (its sync is not done)"]
