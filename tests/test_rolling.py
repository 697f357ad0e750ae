"""Rolling restarts, rolling config changes and version upgrades, with a writer that must lose nothing."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
import redis
from redis.sentinel import Sentinel

from opsctl.spec.layout import sentinel_master_name
from opsctl.spec.load import LoadedSpec
from opsctl.state.specfile import read_spec
from tests.lifecycle import deployed, plan_json, run
from tests.support import CONDITION_BOUND, PASSWORD, cluster_check
from tests.writer import Writer, cluster_client, dataset_checksum

pytestmark = pytest.mark.integration
MAX_GAP_MS = 1000
# Sentinel confirms a promotion only through INFO, polled every 1000 ms during a failover (hard-coded), and
# answers GET-MASTER-ADDR-BY-NAME with the old master until then; the leading sentinel's SENTINEL MASTERS
# (what redis-py reads) switches one INFO poll later still, after it re-pointed the other replicas.
# `bench/rolling.py --topology sentinel --timeline` shows each step (docs/runbooks/failover.md "What it
# costs"). The bound catches regressions.
MAX_SENTINEL_GAP_MS = 4000  # 0.3-0.4 s measured (2.2 s when sentinels confirm by themselves); loaded-CI room


def sentinel_client(loaded: LoadedSpec) -> redis.Redis:
    sentinels = [(n.address, n.port) for n in loaded.layout.sentinels]
    watcher = Sentinel(sentinels, sentinel_kwargs={"password": PASSWORD}, password=PASSWORD,
                       socket_timeout=1.0, decode_responses=True)
    return watcher.master_for(sentinel_master_name(loaded.spec), socket_timeout=1.0)


def roles(loaded: LoadedSpec) -> dict[str, str]:
    result = {}
    for node in loaded.layout.servers:
        client = redis.Redis(host=node.address, port=node.port, password=PASSWORD, decode_responses=True)
        result[node.name] = client.execute_command("ROLE")[0]
    return result


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_rolling_restart_of_a_cluster_loses_no_acknowledged_write(tmp_path, capsys, flavor) -> None:
    with deployed(tmp_path, capsys, "cluster", flavor) as (spec, loaded):
        before = roles(loaded)
        with Writer(lambda: cluster_client(loaded)) as writer:
            writer.wait_for_writes(200)
            code, out, err = run(capsys, "restart", "-f", str(spec), "--auto-approve")
            assert code == 0, err + out
            writer.wait_for_writes(len(writer.acked) + 200)
        client = cluster_client(loaded)
        assert writer.verify(client) == []
        assert writer.max_gap_ms < MAX_GAP_MS, writer.max_gap_ms
        assert err.count("restart ") >= 6 and err.count("failover shard") == 3
        after = roles(loaded)
        assert all(before[name] != after[name] for name in before)  # every master moved to its replica
        assert cluster_check(loaded.layout.servers[0].endpoint).returncode == 0
        assert plan_json(capsys, spec)["steps"] == []


def test_rolling_restart_of_a_sentinel_topology_loses_no_acknowledged_write(tmp_path, capsys) -> None:
    with deployed(tmp_path, capsys, "sentinel", "valkey") as (spec, loaded):
        with Writer(lambda: sentinel_client(loaded)) as writer:
            writer.wait_for_writes(200)
            code, out, err = run(capsys, "restart", "-f", str(spec), "--auto-approve")
            assert code == 0, err + out
            writer.wait_for_writes(len(writer.acked) + 200)
        assert writer.verify(sentinel_client(loaded)) == []
        assert writer.max_gap_ms < MAX_SENTINEL_GAP_MS, writer.max_gap_ms
        code, out, _ = run(capsys, "status", "-f", str(spec))
        assert code == 0, out
        assert plan_json(capsys, spec)["steps"] == []


def test_a_check_failing_mid_way_stops_the_rollout_with_every_shard_healthy(tmp_path, capsys) -> None:
    with deployed(tmp_path, capsys, "cluster", "valkey") as (spec, loaded):
        shards = loaded.layout.shards
        masters = f"{shards[0].master},{shards[1].master}"
        victim = shards[1].replicas[0]
        state = tmp_path / ".opsctl" / loaded.spec.name
        pid = int((state / victim / "server.pid").read_text())
        stopper = threading.Thread(target=_stop_after_first_failover, args=(state / "failover", pid), daemon=True)
        stopper.start()
        try:
            code, _, err = run(capsys, "restart", "-f", str(spec), "--nodes", masters, "--auto-approve",
                               "--wait-timeout", "3")
        finally:
            stopper.join(timeout=30)
            os.kill(pid, signal.SIGCONT)
        assert code != 0 and "failover" in err
        after = roles(loaded)
        assert after[shards[0].master] == "slave" and after[shards[1].master] == "master"
        assert cluster_check(loaded.layout.servers[0].endpoint).returncode == 0


def _stop_after_first_failover(reports: Path, pid: int) -> None:
    deadline = time.monotonic() + CONDITION_BOUND
    while time.monotonic() < deadline:
        if reports.is_dir() and any(reports.glob("*-succeeded.json")):
            os.kill(pid, signal.SIGSTOP)
            return
        time.sleep(0.005)


def test_upgrade_from_redis_7_0_to_valkey_9_1_keeps_every_key(tmp_path, capsys) -> None:
    with deployed(tmp_path, capsys, "cluster", "redis") as (spec, loaded):
        client = cluster_client(loaded)
        for i in range(2000):
            client.set(f"order:{i}", f"v{i}")
        before = dataset_checksum(client)
        spec.write_text(spec.read_text().replace("flavor: redis", "flavor: valkey")
                        .replace("version: '7.0'", "version: '9.1'"))
        plan = plan_json(capsys, spec)
        reasons = {s["reason"] for s in plan["steps"] if s["kind"] == "restart"}
        assert reasons == {"server redis 7.0 -> valkey 9.1"}
        with Writer(lambda: cluster_client(loaded)) as writer:
            writer.wait_for_writes(100)
            code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
            assert code == 0, err + out
        upgraded = read_spec(spec)
        client = cluster_client(upgraded)
        assert writer.verify(client) == []
        assert dataset_checksum(client, "order:*") == before
        for node in upgraded.layout.servers:
            info = redis.Redis(host=node.address, port=node.port, password=PASSWORD).info("server")
            assert info.get("server_name") == "valkey"
            # the Redis server shut down cleanly on SIGTERM: its folder stayed its user's until the restart (the
            # new config written as valkey's made its last RDB unwritable, and it ran on until a SIGKILL 30 s later)
            log = next(spec.parent.glob(f".opsctl/*/{node.name}/server.log")).read_text()
            assert "Redis is now ready to exit" in log, f"{node.name}: no clean exit of the Redis server"
        assert cluster_check(upgraded.layout.servers[0].endpoint).returncode == 0
        assert plan_json(capsys, spec)["steps"] == []


def test_a_downgrade_is_refused_before_anything_is_touched(tmp_path, capsys) -> None:
    with deployed(tmp_path, capsys, "replication", "valkey") as (spec, loaded):
        before = roles(loaded)
        spec.write_text(spec.read_text().replace("flavor: valkey", "flavor: redis")
                        .replace("version: '9.1'", "version: '7.0'"))
        code, _, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 3 and "cannot load the RDB format 80" in err
        assert roles(loaded) == before
