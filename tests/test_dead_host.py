"""A dead host replaced (issue 22, item 4): every node on it SIGKILLed and its folders deleted (the machine and its
disk gone), then its address edited in the spec, same host name. Apply forgets the dead nodes everywhere, creates
the replacements as replicas of the shards' current masters, synced, anti-affinity back. Acknowledged writes are lost
only within the asynchronous replication window of the kill (measured and printed). Real servers on loopback."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest
import redis
import yaml

from opsctl.base.poll import Pending, wait_for
from opsctl.spec.load import LoadedSpec
from opsctl.state.specfile import read_spec
from tests.lifecycle import deployed, plan_json, run
from tests.support import CONDITION_BOUND, PASSWORD, cluster_check
from tests.test_drain_host import live_members_apart, record_files
from tests.test_slots_reshard import preload
from tests.writer import Writer, cluster_client, dataset_checksum

pytestmark = pytest.mark.integration


def kill_host(spec: Path, host: str) -> tuple[list[str], float]:
    """SIGKILL every node on host and delete its folders; the names, and when the first kill landed."""
    folders = {name: path.parent for name, path in record_files(spec).items()
               if json.loads(path.read_text())["deployed"]["host"] == host}
    killed_at = time.monotonic()
    for folder in folders.values():
        os.kill(int((folder / "server.pid").read_text()), signal.SIGKILL)
    for folder in folders.values():
        shutil.rmtree(folder)
    return sorted(folders), killed_at


def known_endpoints(spec: Path) -> set[str]:
    """Every endpoint any live node's CLUSTER NODES lists."""
    seen = set()
    loaded = read_spec(spec)
    for node in loaded.layout.servers:
        for line in str(node_client(loaded, node.name).execute_command("CLUSTER", "NODES")).splitlines():
            seen.add(line.split()[1].split("@")[0])
    return seen


def node_client(loaded: LoadedSpec, name: str) -> redis.Redis:
    node = loaded.layout.node(name)
    return redis.Redis(host=node.address, port=node.port, password=PASSWORD, decode_responses=True)


def flagged(loaded: LoadedSpec, survivors: list[str], *addresses: str) -> bool | Pending:
    """Every survivor counts the nodes at the dead addresses as failing (fail?; fail only where a majority of masters
    agrees): the premise of a plan about a dead host."""
    for name in survivors:
        lines = str(node_client(loaded, name).execute_command("CLUSTER", "NODES")).splitlines()
        dead = [w for w in (line.split() for line in lines) if any(w[1].startswith(a + ":") for a in addresses)]
        if not dead or not all("fail" in w[2] for w in dead):
            return Pending(f"{name} does not flag every node at {', '.join(addresses)} yet")
    return True


def served_again(spec: Path, dead_address: str) -> None:
    """Wait until the cluster promoted the dead masters' replicas: no master at the dead address serves slots."""
    loaded = read_spec(spec)
    client = node_client(loaded, loaded.layout.servers[0].name)

    def served() -> bool | Pending:
        lines = [line.split() for line in str(client.execute_command("CLUSTER", "NODES")).splitlines()]
        if any(w[1].startswith(dead_address + ":") and "master" in w[2] and len(w) > 8 for w in lines):
            return Pending(f"a master at {dead_address} still serves slots")
        state = client.cluster("INFO")["cluster_state"]
        return True if state == "ok" else Pending(f"cluster_state {state}")

    wait_for(served, CONDITION_BOUND, "the cluster to fail over the dead masters", interval=0.05)


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_dead_host_given_a_new_address_is_healed(tmp_path, capsys, flavor) -> None:
    with deployed(tmp_path, capsys, "cluster", flavor) as (spec, loaded):
        data = yaml.safe_load(spec.read_text())
        preload(loaded, 4000)
        before = dataset_checksum(cluster_client(loaded), "pre:*")
        old_address = next(h["address"] for h in data["hosts"] if h["name"] == "h2")
        new_address = old_address.rsplit(".", 1)[0] + ".4"
        with Writer(lambda: cluster_client(read_spec(spec))) as writer:
            writer.wait_for_writes(2000)
            dead, killed_at = kill_host(spec, "h2")
            served_again(spec, old_address)
            spec.write_text(yaml.safe_dump({**data, "hosts": [{**h, "address": new_address} if h["name"] == "h2"
                                                              else h for h in data["hosts"]]}))
            started = time.monotonic()
            code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
            took = time.monotonic() - started
            assert code == 0, err + out
            assert plan_json(capsys, spec)["steps"] == []
            writer.wait_for_writes(len(writer.acked) + 200)
        when = dict(zip(writer.acked, writer.ack_times, strict=True))
        lost = [key for key, _ in writer.lost(cluster_client(read_spec(spec)))]
        assert [k for k in lost if when[k] > killed_at] == []  # only the kill's window
        window_ms = (killed_at - min((when[k] for k in lost), default=killed_at)) * 1000
        assert not any(e.startswith(old_address + ":") for e in known_endpoints(spec))  # forgotten everywhere
        check = cluster_check(read_spec(spec).layout.servers[0].endpoint)
        assert check.returncode == 0 and "3 masters" in check.stdout, check.stdout
        live_members_apart(spec)
        assert dataset_checksum(cluster_client(read_spec(spec)), "pre:*") == before
        assert sorted(n.name for n in read_spec(spec).layout.servers if n.host == "h2") == dead
        with capsys.disabled():
            print(f"\ndead host replaced {flavor}: keys {before[0]}, writes acknowledged {len(writer.acked)}, "
                  f"lost {len(lost)}{f' (acknowledged within {window_ms:.0f} ms before the SIGKILL)' if lost else ''}, "
                  f"apply {took:.1f} s, longest write gap {writer.max_gap_ms:.0f} ms", file=sys.stderr)


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_dead_sentinel_master_host_given_a_new_address_is_healed(tmp_path, capsys, flavor) -> None:
    """h1 (the master and a sentinel) dies; Sentinel promotes a replica; h1 gets a new address: its server comes back
    as a replica of the promoted master, its sentinel monitors it, and SENTINEL RESET makes the others forget the
    dead ones."""
    from tests.test_fleet_shape_sentinel import live, sentinel_client, sentinels_know, synced
    from tests.test_fleet_shape_sentinel import preload as preload_master

    with deployed(tmp_path, capsys, "sentinel", flavor) as (spec, _loaded):
        data = yaml.safe_load(spec.read_text())
        old_address = next(h["address"] for h in data["hosts"] if h["name"] == "h1")
        new_address = old_address.rsplit(".", 1)[0] + ".4"
        preload_master(sentinel_client(spec), 2000)
        with Writer(lambda: sentinel_client(spec)) as writer:
            writer.wait_for_writes(2000)
            dead, killed_at = kill_host(spec, "h1")
            deadline = time.monotonic() + CONDITION_BOUND
            while not any(r["role"] != "sentinel" and r["host"] != "h1" and
                          redis.Redis(host=r["address"], port=r["port"], password=PASSWORD).execute_command("ROLE")[0]
                          == b"master" for r in live(spec).values()):
                assert time.monotonic() < deadline, "Sentinel did not fail over"
                time.sleep(0.05)
            spec.write_text(yaml.safe_dump({**data, "hosts": [{**h, "address": new_address} if h["name"] == "h1"
                                                              else h for h in data["hosts"]]}))
            started = time.monotonic()
            code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
            took = time.monotonic() - started
            assert code == 0, err + out
            assert plan_json(capsys, spec)["steps"] == []
            writer.wait_for_writes(len(writer.acked) + 200)
        when = dict(zip(writer.acked, writer.ack_times, strict=True))
        lost = [key for key, _ in writer.lost(sentinel_client(spec))]
        assert [k for k in lost if when[k] > killed_at] == []  # only the kill's window
        window_ms = (killed_at - min((when[k] for k in lost), default=killed_at)) * 1000
        synced(spec, 2000)
        sentinels_know(spec, 2, 3)
        assert sorted(n for n, r in live(spec).items() if r["host"] == "h1") == dead
        with capsys.disabled():
            print(f"\ndead sentinel master host replaced {flavor}: keys 2000, writes acknowledged {len(writer.acked)}, "
                  f"lost {len(lost)}{f' (acknowledged within {window_ms:.0f} ms before the SIGKILL)' if lost else ''}"
                  f", apply {took:.1f} s, longest write gap {writer.max_gap_ms:.0f} ms", file=sys.stderr)


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_shard_that_lost_every_member_is_refused_with_the_way_on(tmp_path, capsys, flavor) -> None:
    """h1 and h2 die (shard 1's master and replica, and shard 2's master): both get new addresses. No replica of
    shard 1 is left to promote, so apply refuses (exit 3) naming the shard and the way on; nothing is started."""
    with deployed(tmp_path, capsys, "cluster", flavor) as (spec, loaded):
        data = yaml.safe_load(spec.read_text())
        dead = kill_host(spec, "h1")[0] + kill_host(spec, "h2")[0]
        survivors = [n.name for n in loaded.layout.servers if n.name not in dead]
        addresses = [h["address"] for h in data["hosts"] if h["name"] in ("h1", "h2")]
        wait_for(lambda: flagged(loaded, survivors, *addresses), CONDITION_BOUND,
                 "the survivors to flag the dead hosts' nodes",
                 interval=0.05)
        moved = {h["name"]: h["address"].rsplit(".", 1)[0] + (".4" if h["name"] == "h1" else ".5") for h in
                 data["hosts"] if h["name"] in ("h1", "h2")}
        spec.write_text(yaml.safe_dump({**data, "hosts": [{**h, "address": moved.get(h["name"], h["address"])}
                                                          for h in data["hosts"]]}))
        # 2 of 6 servers answer; the 4 at the new addresses run nowhere yet (the provider finds no process there):
        # they grant no run anything, so the lock is the 2's and apply goes as far as the refusal
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 3 and "--force-lock" not in err, err + out
        assert "restore that shard from a backup" in err and "Traceback" not in err, err + out
        assert "shard 1: slots 0-5461" in err and "hint: restore that shard" in err, err
        assert not any(name in record_files(spec) for name in dead)  # nothing started in their place
