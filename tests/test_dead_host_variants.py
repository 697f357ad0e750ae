"""Dead host variants (issue 22, item 4): the host replaced by a new machine at the same address (empty), the dead
host removed from the spec instead of readdressed, a replication topology without Sentinel losing a replica's host
or the master's, and a cluster shard that lost every member on Redis 7.0. Real servers on loopback."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml

from opsctl.state.specfile import read_spec
from tests.lifecycle import deployed, plan_json, run
from tests.test_dead_host import kill_host, known_endpoints, served_again
from tests.test_drain_host import record_files
from tests.test_shape_killed import cluster_kept, cluster_writer
from tests.writer import Writer

pytestmark = pytest.mark.integration


def hosts_of(spec: Path) -> dict[str, str]:
    return {n: json.loads(p.read_text())["deployed"]["host"] for n, p in record_files(spec).items()
            if not json.loads(p.read_text()).get("retired")}


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_dead_host_replaced_at_the_same_address_is_healed(tmp_path, capsys, flavor) -> None:
    """h2 dies (SIGKILL, folders deleted) and a new, empty machine takes its address: the spec is unchanged. Apply
    starts the replacements under the dead nodes' names and ports as replicas of the promoted masters; the dead ids
    (same endpoints, other ids) are forgotten; nothing acknowledged after the kill is lost."""
    with deployed(tmp_path, capsys, "cluster", flavor) as (spec, loaded):
        data = yaml.safe_load(spec.read_text())
        address = next(h["address"] for h in data["hosts"] if h["name"] == "h2")
        with cluster_writer(spec, loaded) as (writer, before):
            dead, dead_at = kill_host(spec, "h2")
            served_again(spec, address)
            started = time.monotonic()
            code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
            took = time.monotonic() - started
            assert code == 0, err + out
            assert plan_json(capsys, spec)["steps"] == []
            writer.wait_for_writes(len(writer.acked) + 100)
        lost = cluster_kept(spec, writer, before, dead_at)
        assert sorted(n for n, h in hosts_of(spec).items() if h == "h2") == dead
        _only_live_ids_known(spec)
        _say("same address", flavor, writer, lost, took)


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_dead_host_removed_from_the_spec_is_replaced_elsewhere(tmp_path, capsys, flavor) -> None:
    """h3 dies (SIGKILL, folders deleted) and is removed from the spec, h4 added: its records went with it, so
    placement only sees each shard short of a member; apply places one on a host without a member of the shard,
    joins it as a replica of the shard's master now, and forgets the dead ids (at an address the spec no longer
    has). Nothing acknowledged after the kill is lost."""
    with deployed(tmp_path, capsys, "cluster", flavor) as (spec, loaded):
        data = yaml.safe_load(spec.read_text())
        address = next(h["address"] for h in data["hosts"] if h["name"] == "h3")
        fourth = address.rsplit(".", 1)[0] + ".4"
        with cluster_writer(spec, loaded) as (writer, before):
            dead, dead_at = kill_host(spec, "h3")
            served_again(spec, address)
            spec.write_text(yaml.safe_dump({**data, "hosts": [*(h for h in data["hosts"] if h["name"] != "h3"),
                                                               {"name": "h4", "address": fourth}]}))
            started = time.monotonic()
            code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
            took = time.monotonic() - started
            assert code == 0, err + out
            assert plan_json(capsys, spec)["steps"] == []
            writer.wait_for_writes(len(writer.acked) + 100)
        lost = cluster_kept(spec, writer, before, dead_at)
        assert "h3" not in hosts_of(spec).values() and len(hosts_of(spec)) == 6
        assert not any(e.startswith(address + ":") for e in known_endpoints(spec))
        _only_live_ids_known(spec)
        reused = sorted(set(dead) & set(hosts_of(spec)))
        _say(f"removed from the spec (dead names {dead}, given again: {reused})", flavor, writer, lost, took)


def _only_live_ids_known(spec: Path) -> None:
    """Every id any node lists belongs to a node that answers (no dead id left at a reused endpoint)."""
    import redis

    from tests.support import PASSWORD

    servers = read_spec(spec).layout.servers
    mine = set()
    listed = set()
    for node in servers:
        client = redis.Redis(host=node.address, port=node.port, password=PASSWORD, decode_responses=True)
        mine.add(client.execute_command("CLUSTER", "MYID"))
        listed |= {line.split()[0] for line in str(client.execute_command("CLUSTER", "NODES")).splitlines()}
    assert listed == mine, listed - mine


def _say(what: str, flavor: str, writer: Writer, lost: int, took: float) -> None:
    with os.fdopen(os.dup(2), "w") as err:
        print(f"\ndead host, {what} [{flavor}]: writes acknowledged {len(writer.acked)}, lost {lost}, apply "
              f"{took:.1f} s, longest write gap {writer.max_gap_ms:.0f} ms", file=err)


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_dead_replication_master_host_is_refused_until_a_replica_is_promoted(tmp_path, capsys, flavor) -> None:
    """Replication without Sentinel: h1 (the master) dies and gets a new address. Nothing promotes a replica by
    itself; apply started an empty master at the new address and made the replicas copy it (every key lost, seen
    here): it now refuses (exit 3) naming the way on, and changes nothing. Once the replica holding the data is
    promoted by hand (REPLICAOF NO ONE: `opsctl failover` needs the master), apply starts the replacement as its
    replica: every key kept, the next plan empty."""
    from opsctl.spec.load import command_renames
    from tests.test_fleet_shape_sentinel import live, node_client, preload, synced

    with deployed(tmp_path, capsys, "replication", flavor) as (spec, _loaded):
        data = yaml.safe_load(spec.read_text())
        master = next(r for r in live(spec).values() if r["host"] == "h1")
        client = node_client(master["address"], master["port"])
        preload(client, 2000)
        # the premise: both replicas hold every key (a clean-checkout run at load found one still without its first
        # sync half a second later, and apply rightly refused to promote it)
        assert client.execute_command("WAIT", 2, 30_000) == 2
        address = next(h["address"] for h in data["hosts"] if h["name"] == "h1")
        dead, _ = kill_host(spec, "h1")
        spec.write_text(yaml.safe_dump({**data, "hosts": [{**h, "address": address.rsplit(".", 1)[0] + ".4"}
                                                          if h["name"] == "h1" else h for h in data["hosts"]]}))
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 3 and "would start empty as the master" in err and "REPLICAOF NO ONE" in err, err + out
        assert "Traceback" not in err and not set(dead) & set(hosts_of(spec))  # nothing started
        replica = next(r for r in live(spec).values() if r["host"] == "h2")
        replicaof = command_renames(read_spec(spec).spec, None).get("REPLICAOF", "REPLICAOF")
        node_client(replica["address"], replica["port"]).execute_command(replicaof, "NO", "ONE")  # the runbook's way
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0, err + out
        assert plan_json(capsys, spec)["steps"] == []
        synced(spec, 2000)


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_dead_replication_replica_host_is_healed(tmp_path, capsys, flavor) -> None:
    """Replication without Sentinel: h3 (a replica) dies and gets a new address: apply starts its replacement as a
    replica of the master, synced; the master untouched."""
    from tests.test_fleet_shape_sentinel import live, node_client, preload, synced

    with deployed(tmp_path, capsys, "replication", flavor) as (spec, _loaded):
        data = yaml.safe_load(spec.read_text())
        master = next(r for r in live(spec).values() if r["host"] == "h1")
        preload(node_client(master["address"], master["port"]), 2000)
        address = next(h["address"] for h in data["hosts"] if h["name"] == "h3")
        dead, _ = kill_host(spec, "h3")
        spec.write_text(yaml.safe_dump({**data, "hosts": [{**h, "address": address.rsplit(".", 1)[0] + ".4"}
                                                          if h["name"] == "h3" else h for h in data["hosts"]]}))
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 0, err + out
        assert plan_json(capsys, spec)["steps"] == []
        synced(spec, 2000)
        assert sorted(n for n, h in hosts_of(spec).items() if h == "h3") == dead
