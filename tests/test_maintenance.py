"""hosts[].maintenance: true (issue 22, item 6): the host keeps its nodes but serves no master; its masters fail over
gracefully to members elsewhere, apply keeps it so until the mark is removed, and a shard with no member elsewhere is
refused (exit 3) before anything changes. Real servers on loopback, a concurrent writer."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import yaml

from opsctl.state.specfile import read_spec
from tests.lifecycle import deployed, plan_json, run
from tests.support import cluster_check
from tests.test_fleet_shape_sentinel import live, node_client, preload, sentinel_client
from tests.writer import Writer, cluster_client

pytestmark = pytest.mark.integration

FLAVORS = ["valkey", "redis"]


def marked(data: dict, *hosts: str) -> dict:
    return {**data, "hosts": [{**h, "maintenance": True} if h["name"] in hosts else
                              {k: v for k, v in h.items() if k != "maintenance"} for h in data["hosts"]]}


def masters_on(spec: Path, host: str) -> list[str]:
    """The servers on host that answer ROLE master."""
    return [name for name, r in live(spec).items() if r["host"] == host and r["role"] != "sentinel"
            and node_client(r["address"], r["port"]).execute_command("ROLE")[0] == "master"]


def node_config(spec: Path, name: str, directive: str) -> str:
    record = live(spec)[name]
    reply = node_client(record["address"], record["port"]).execute_command("OPS_CONFIG_T3ST", "GET", directive)
    return str(reply[directive] if isinstance(reply, dict) else reply[1])


def apply(capsys: pytest.CaptureFixture[str], spec: Path, data: dict) -> tuple[int, str, float]:
    spec.write_text(yaml.safe_dump(data))
    started = time.monotonic()
    code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
    return code, err + out, time.monotonic() - started


@pytest.mark.parametrize("flavor", FLAVORS)
def test_a_cluster_host_in_maintenance_serves_no_master(tmp_path, capsys, flavor) -> None:
    with deployed(tmp_path, capsys, "cluster", flavor) as (spec, loaded):
        data = yaml.safe_load(spec.read_text())
        code, out, _ = apply(capsys, spec, marked(data, "h1", "h2"))  # shard 1 lives on h1 and h2 only
        assert code == 3 and "maintenance rule" in out and "shard(s) 1" in out, out
        assert masters_on(spec, "h1")
        spec.write_text(yaml.safe_dump(data))
        assert plan_json(capsys, spec)["steps"] == []  # nothing changed by the refusal
        preload(cluster_client(loaded), 2000)
        with Writer(lambda: cluster_client(read_spec(spec))) as writer:
            writer.wait_for_writes(100)
            code, out, took = apply(capsys, spec, marked(data, "h1"))
            assert code == 0 and "] failover " in out, out
            assert masters_on(spec, "h1") == []
            assert plan_json(capsys, spec)["steps"] == []  # kept so
            writer.wait_for_writes(len(writer.acked) + 100)
        assert writer.verify(cluster_client(read_spec(spec))) == []
        on_h1 = [n for n, r in live(spec).items() if r["host"] == "h1"]
        assert {node_config(spec, n, "cluster-replica-no-failover") for n in on_h1} == {"yes"}
        check = cluster_check(read_spec(spec).layout.servers[0].endpoint)
        assert check.returncode == 0 and "3 masters" in check.stdout, check.stdout
        code, out, _ = apply(capsys, spec, data)  # the mark removed: nothing moves back
        assert code == 0 and "] failover " not in out, out
        assert masters_on(spec, "h1") == [] and plan_json(capsys, spec)["steps"] == []
        assert {node_config(spec, n, "cluster-replica-no-failover") for n in on_h1} == {"no"}
        with capsys.disabled():
            print(f"\nmaintenance cluster {flavor}: keys 2000, writes acknowledged {len(writer.acked)}, lost 0, "
                  f"apply {took:.1f} s, longest write gap {writer.max_gap_ms:.0f} ms", file=sys.stderr)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_a_sentinel_master_host_in_maintenance_fails_over(tmp_path, capsys, flavor) -> None:
    with deployed(tmp_path, capsys, "sentinel", flavor) as (spec, _loaded):
        data = yaml.safe_load(spec.read_text())
        assert masters_on(spec, "h1")
        preload(sentinel_client(spec), 2000)
        with Writer(lambda: sentinel_client(spec)) as writer:
            writer.wait_for_writes(100)
            code, out, took = apply(capsys, spec, marked(data, "h1"))
            assert code == 0 and "] failover " in out, out
            assert masters_on(spec, "h1") == []
            assert plan_json(capsys, spec)["steps"] == []
            writer.wait_for_writes(len(writer.acked) + 100)
        assert writer.verify(sentinel_client(spec)) == []
        first = next(n for n, r in live(spec).items() if r["host"] == "h1" and r["role"] != "sentinel")
        assert node_config(spec, first, "replica-priority") == "0"
        code, out, _ = apply(capsys, spec, data)
        assert code == 0 and "] failover " not in out and masters_on(spec, "h1") == [], out
        assert node_config(spec, first, "replica-priority") == "100"
        with capsys.disabled():
            print(f"\nmaintenance sentinel {flavor}: keys 2000, writes acknowledged {len(writer.acked)}, lost 0, "
                  f"apply {took:.1f} s, longest write gap {writer.max_gap_ms:.0f} ms", file=sys.stderr)


def master_client(spec: Path):  # type: ignore[no-untyped-def]
    """A client of whichever server answers ROLE master now (a replication topology has no discovery)."""
    for record in live(spec).values():
        client = node_client(record["address"], record["port"])
        if client.execute_command("ROLE")[0] == "master":
            return client
    raise RuntimeError("no master")


@pytest.mark.parametrize("flavor", FLAVORS)
def test_a_replication_master_host_in_maintenance_fails_over_to_a_replica_elsewhere(tmp_path, capsys, flavor) -> None:
    with deployed(tmp_path, capsys, "replication", flavor) as (spec, _loaded):
        data = yaml.safe_load(spec.read_text())
        preload(master_client(spec), 2000)
        with Writer(lambda: master_client(spec)) as writer:
            writer.wait_for_writes(100)
            code, out, took = apply(capsys, spec, marked(data, "h1"))
            assert code == 0 and "] failover " in out, out
            assert masters_on(spec, "h1") == []
            assert plan_json(capsys, spec)["steps"] == []
            writer.wait_for_writes(len(writer.acked) + 100)
        assert writer.verify(master_client(spec)) == []
        with capsys.disabled():
            print(f"\nmaintenance replication {flavor}: keys 2000, writes acknowledged {len(writer.acked)}, lost 0, "
                  f"apply {took:.1f} s, longest write gap {writer.max_gap_ms:.0f} ms", file=sys.stderr)
