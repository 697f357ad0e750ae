"""Replication and Sentinel topologies change shape in place (issue 22, item 5): replicas added and removed, the
Sentinel count changed with the quorum valid throughout, the master's host removed = drained by a graceful failover.
Real servers on loopback, a concurrent writer recording acknowledged writes."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from redis.sentinel import Sentinel

from opsctl.base.poll import wait_for
from opsctl.spec.layout import sentinel_master_name
from opsctl.state.specfile import read_spec
from tests.lifecycle import deployed, plan_json, run
from tests.support import CONDITION_BOUND, PASSWORD
from tests.test_drain_host import record_files
from tests.writer import Writer

pytestmark = pytest.mark.integration

FLAVORS = ["valkey", "redis"]


def records(spec: Path) -> dict[str, dict[str, Any]]:
    return {name: json.loads(path.read_text()) for name, path in record_files(spec).items()}


def sentinel_client(spec: Path) -> redis.Redis:
    """redis-py's Sentinel client over every sentinel address the spec names: it discovers the master."""
    loaded = read_spec(spec)
    sentinel = Sentinel([(n.address, n.port) for n in loaded.layout.sentinels],
                        sentinel_kwargs={"password": PASSWORD, "socket_timeout": 1.0},
                        password=PASSWORD, socket_timeout=2.0, decode_responses=True)
    client: redis.Redis = sentinel.master_for(sentinel_master_name(loaded.spec), socket_timeout=2.0)
    return client


def _takes_writes(client: redis.Redis) -> bool | None:
    try:
        client.set("pre:probe", "1")
    except redis.ResponseError as e:  # NOREPLICAS until a replica's first ack (min-replicas-to-write 1 by default)
        if "NOREPLICAS" not in str(e):
            raise
        return None
    client.delete("pre:probe")
    return True


def preload(client: redis.Redis, count: int) -> None:
    wait_for(lambda: _takes_writes(client), CONDITION_BOUND, "the master to take writes")
    pipe = client.pipeline(transaction=False)
    for i in range(count):
        pipe.set(f"pre:{i}", str(i))
    pipe.execute()


def node_client(address: str, port: int) -> redis.Redis:
    return redis.Redis(host=address, port=port, password=PASSWORD, decode_responses=True, socket_timeout=2.0)


def live(spec: Path) -> dict[str, dict[str, Any]]:
    return {n: r["deployed"] for n, r in records(spec).items() if not r.get("retired")}


def synced(spec: Path, keys: int) -> None:
    """Every live server holds the master's keys, and exactly one is a master."""
    roles = []
    for record in live(spec).values():
        if record["role"] == "sentinel":
            continue
        client = node_client(record["address"], record["port"])
        deadline = time.monotonic() + 20
        while client.dbsize() < keys and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.dbsize() >= keys, record
        roles.append(client.execute_command("ROLE")[0])
    assert roles.count("master") == 1, roles


def sentinels_know(spec: Path, replicas: int, sentinels: int) -> None:
    for record in live(spec).values():
        if record["role"] == "sentinel":
            info = node_client(record["address"], record["port"]).info("sentinel")["master0"]
            assert (info["slaves"], info["sentinels"], info["status"]) == (replicas, sentinels, "ok"), (record, info)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_five_sentinels_and_the_masters_host_removed_lose_nothing(tmp_path, capsys, flavor) -> None:
    """hosts h1-h3 (master on h1, 3 sentinels) -> h2-h6, servers on h2-h4, 5 sentinels (quorum 2 -> 3): the
    master fails over gracefully, a replica and 3 sentinels are added, h1's server and sentinel are removed and
    forgotten (SENTINEL RESET), under a writer through redis-py's Sentinel client."""
    with deployed(tmp_path, capsys, "sentinel", flavor) as (spec, loaded):
        data = yaml.safe_load(spec.read_text())
        before = records(spec)
        on_h1 = sorted(n for n, r in before.items() if r["deployed"]["host"] == "h1")
        prefix = data["hosts"][0]["address"].rsplit(".", 1)[0]
        hosts = [*data["hosts"][1:], *({"name": f"h{i}", "address": f"{prefix}.{i}"} for i in (4, 5, 6))]
        moved = {**data, "hosts": hosts, "replication": {**data["replication"], "master": "h2",
                                                          "replicas": ["h3", "h4"]}}
        preload(sentinel_client(spec), 2000)
        with Writer(lambda: sentinel_client(spec)) as writer:
            writer.wait_for_writes(100)
            spec.write_text(yaml.safe_dump(moved))
            code, out, err = run(capsys, "plan", "-f", str(spec))
            assert code == 2 and "failover" in out and "h1 removed from the spec" in out, err + out
            started = time.monotonic()
            code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
            took = time.monotonic() - started
            assert code == 0, err + out
            assert "sentinel-reset" in err + out, err + out
            lines = (err + out).splitlines()
            started_last = max(i for i, line in enumerate(lines) if "] start " in line and "sentinel" in line)
            raised = [i for i, line in enumerate(lines) if "] sentinel-set " in line and "quorum 3" in line]
            assert raised and min(raised) > started_last, lines  # the quorum never exceeds the running sentinels
            assert plan_json(capsys, spec)["steps"] == []
            writer.wait_for_writes(len(writer.acked) + 100)
        assert writer.verify(sentinel_client(spec)) == []
        after = records(spec)
        for name in on_h1:
            assert after[name]["retired"] is True
            assert [p.name for p in record_files(spec)[name].parent.iterdir()] == ["opsctl-node.json"]
        for name, was in before.items():
            if name not in on_h1:
                assert {k: v for k, v in after[name]["deployed"].items() if k != "role"} == \
                    {k: v for k, v in was["deployed"].items() if k != "role"}, name
        kept = live(spec)
        assert sorted(r["host"] for r in kept.values() if r["role"] != "sentinel") == ["h2", "h3", "h4"]
        assert sorted(r["host"] for r in kept.values() if r["role"] == "sentinel") == ["h2", "h3", "h4", "h5", "h6"]
        synced(spec, 2000 + len(writer.acked))
        sentinels_know(spec, 2, 5)
        quorums = {node_client(r["address"], r["port"]).sentinel_master(sentinel_master_name(loaded.spec))["quorum"]
                   for r in kept.values() if r["role"] == "sentinel"}
        assert quorums == {3}, quorums
        with capsys.disabled():  # the figures for the closing note
            print(f"\nsentinel 3->5 + master's host removed {flavor}: keys 2000, writes acknowledged "
                  f"{len(writer.acked)}, lost 0, apply {took:.1f} s, longest write gap {writer.max_gap_ms:.0f} ms",
                  file=sys.stderr)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_replicas_one_two_one_lose_nothing(tmp_path, capsys, flavor) -> None:
    """replication.replicas [h2] -> [h2, h3] -> [h2]: a replica added on h3 and synced, then retired (stopped,
    purged, a tombstone), the master untouched, under a writer."""
    with deployed(tmp_path, capsys, "replication", flavor, replication={"replicas": ["h2"]}) as (spec, loaded):
        data = yaml.safe_load(spec.read_text())
        master = loaded.layout.node(loaded.layout.shards[0].master)
        preload(node_client(master.address, master.port), 2000)
        figures = []
        with Writer(lambda: node_client(master.address, master.port)) as writer:
            for replicas, count in ((["h2", "h3"], 2), (["h2"], 1)):
                writer.wait_for_writes(len(writer.acked) + 100)
                spec.write_text(yaml.safe_dump({**data, "replication": {**data["replication"], "replicas": replicas}}))
                started = time.monotonic()
                code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
                figures.append(time.monotonic() - started)
                assert code == 0, err + out
                assert plan_json(capsys, spec)["steps"] == []
                assert len([r for r in live(spec).values()]) == count + 1
                synced(spec, 2000)
        assert writer.verify(node_client(master.address, master.port)) == []
        after = records(spec)
        third = f"{data['name']}-3"
        assert after[third]["retired"] is True and after[third]["deployed"]["host"] == "h3"
        assert node_client(master.address, master.port).execute_command("ROLE")[0] == "master"
        with capsys.disabled():
            print(f"\nreplication replicas 1->2->1 {flavor}: keys 2000, writes acknowledged {len(writer.acked)}, "
                  f"lost 0, apply {figures[0]:.1f} s + {figures[1]:.1f} s, longest write gap "
                  f"{writer.max_gap_ms:.0f} ms", file=sys.stderr)
