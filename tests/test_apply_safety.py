"""Safety regressions found in review: each scenario was reproduced against real servers first."""

from __future__ import annotations

import os
import signal

import pytest
import redis
import yaml

from opsctl.connector import Connector
from opsctl.errors import RefusedError
from opsctl.executor import execute
from opsctl.plan.steps import Plan, Replicate
from opsctl.runtime import make_runtime
from tests.lifecycle import deployed, plan_json, read_spec, run
from tests.support import PASSWORD

pytestmark = pytest.mark.integration


def test_a_master_without_persistence_is_not_restarted_over_its_replicas(tmp_path, capsys) -> None:
    with deployed(tmp_path, capsys, "replication", "valkey",
                  persistence={"aof": "off", "rdb": []}) as (spec, loaded):
        master = loaded.layout.node(loaded.layout.shards[0].master)
        client = redis.Redis(host=master.address, port=master.port, password=PASSWORD)
        for i in range(100):
            client.set(f"k:{i}", i)
        client.execute_command("WAIT", 2, 2000)
        os.kill(int((tmp_path / ".opsctl" / loaded.spec.name / master.name / "server.pid").read_text()),
                signal.SIGKILL)
        code, _, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 3 and "come back empty" in err
        for name in loaded.layout.shards[0].replicas:
            node = loaded.layout.node(name)
            assert redis.Redis(host=node.address, port=node.port, password=PASSWORD).dbsize() == 100


def test_a_restart_only_change_of_a_replication_master_settles(tmp_path, capsys) -> None:
    with deployed(tmp_path, capsys, "replication", "redis") as (spec, loaded):
        data = yaml.safe_load(spec.read_text())
        spec.write_text(yaml.safe_dump({**data, "config": {"io-threads": 2}}))
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0, err + out
        assert plan_json(capsys, spec)["steps"] == []
        for node in loaded.layout.servers:
            with Connector(loaded).admin(node) as admin:
                assert admin.config_get("io-threads")["io-threads"] == "2"


def test_a_rename_change_in_a_sentinel_topology_switches_everything_together(tmp_path, capsys) -> None:
    with deployed(tmp_path, capsys, "sentinel", "valkey") as (spec, loaded):
        spec.write_text(spec.read_text().replace("OPS_CONFIG_T3ST", "OPS_CONFIG_N3W1"))
        plan = plan_json(capsys, spec)
        kinds = [s["kind"] for s in plan["steps"]]
        assert kinds[:3] == ["sentinel-set"] * 3 and "failover" not in kinds
        code, _, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 3 and "--allow-downtime" in err
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve", "--allow-downtime")
        assert code == 0, err + out
        assert plan_json(capsys, spec)["steps"] == []
        for node in loaded.layout.sentinels:
            sentinel = redis.Redis(host=node.address, port=node.port, password=PASSWORD, decode_responses=True)
            config = sentinel.execute_command("SENTINEL", "MASTER", loaded.spec.name)
            assert config  # still monitoring
        code, out, err = run(capsys, "failover", "-f", str(spec), "--shard", "1", "--yes")
        assert code == 0, err + out
        assert plan_json(capsys, spec)["steps"] == []


def test_a_replicate_step_whose_master_became_a_replica_is_refused(tmp_path, capsys) -> None:
    """A plan made before the roles changed (a failover, an operator's REPLICAOF): its replicate step would
    point the master at a replica that follows it, a loop in which neither takes writes. The step checks its
    master's role right before REPLICAOF and leaves the node as it is."""
    with deployed(tmp_path, capsys, "replication", "redis") as (spec, loaded):
        master, replica = loaded.layout.shards[0].master, loaded.layout.shards[0].replicas[0]
        rt = make_runtime(read_spec(spec))
        stale = Plan(loaded.spec.name, "d", "f", (Replicate(master, f"should replicate {replica}", replica),))
        try:
            with pytest.raises(RefusedError, match=f"{replica} is a replica of .* now, not a master"):
                execute(rt, stale, lambda _event: None)
        finally:
            rt.provider.close()
        with Connector(loaded).admin(loaded.layout.node(master)) as admin:
            assert admin.call("ROLE")[0] == "master"
