"""On one Valkey 9.1 cluster: `cluster fix` decides from masters only (Valkey replicates MIGRATING/IMPORTING
to replicas) and `cluster check` lists an open slot once; two opsctl runs from different state dirs never
interleave (the topology lock), a killed holder frees it at once, a hung one when its lease expires."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import redis
from redis.crc import key_slot

from opsctl.base.errors import RefusedError
from opsctl.net.connector import Connector
from opsctl.net.topolock import TopologyLock, topology_lock
from opsctl.observe.replies import parse_cluster_nodes, parse_info
from opsctl.slots.ranges import expand
from tests.lifecycle import deployed, plan_json, run
from tests.support import PASSWORD, PASSWORD_ENV, admin_for, lease_lapsed
from tests.test_slots_reshard import preload, referee_ok
from tests.writer import cluster_client, dataset_checksum

pytestmark = pytest.mark.integration

HOLD = """
import sys, time
from opsctl.net.connector import Connector
from opsctl.state.specfile import read_spec
from opsctl.net.topolock import topology_lock
with topology_lock(Connector(read_spec(sys.argv[1]))):
    print("held", flush=True)
    time.sleep(60)
"""
SKEWED = "import time\n_now = time.time\ntime.time = lambda: _now() - 3600\n" + HOLD  # a host an hour behind


def test_fix_uses_masters_only_and_the_topology_lock_keeps_runs_apart(tmp_path, capsys) -> None:
    with deployed(tmp_path, capsys, "cluster", "valkey") as (spec, loaded):
        preload(loaded, 2000)
        client = cluster_client(loaded)
        before = dataset_checksum(client, "pre:*")
        source, target = (loaded.layout.node(s.master) for s in loaded.layout.shards[:2])
        replica = loaded.layout.node(loaded.layout.shards[1].replicas[0])
        with admin_for(loaded, source) as src, admin_for(loaded, target) as tgt, \
                admin_for(loaded, replica) as rep:
            source_id, target_id = src.call("CLUSTER", "MYID"), tgt.call("CLUSTER", "MYID")
            tgt.call("CLUSTER", "SETSLOT", 100, "IMPORTING", source_id)
            src.call("CLUSTER", "SETSLOT", 100, "MIGRATING", target_id)
            deadline = time.monotonic() + 10
            while "100-<-" not in rep.call("CLUSTER", "NODES") and time.monotonic() < deadline:
                time.sleep(0.05)
            code, out, _ = run(capsys, "cluster", "check", "-f", str(spec))
            assert code == 1
            open_lines = [ln for ln in out.splitlines() if " is open: " in ln]
            assert len(open_lines) == len(set(open_lines)) >= 1, out

            code, out, err = run(capsys, "cluster", "fix", "-f", str(spec), "--state-dir", str(tmp_path / "a"))
            assert code == 0 and "found open" in out, err + out
            referee_ok(loaded)
            code, out, err = run(capsys, "cluster", "fix", "-f", str(spec), "--state-dir", str(tmp_path / "a"))
            assert code == 0 and "nothing to fix" in out, err + out

        env = {**os.environ, PASSWORD_ENV: PASSWORD}
        holder = subprocess.Popen([sys.executable, "-c", HOLD, str(spec)], env=env, stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            code, out, err = run(capsys, "cluster", "reshard", "--auto-approve", "-f", str(spec), "--from", source.name,
                                 "--to", target.name, "--slots", "10", "--state-dir", str(tmp_path / "b"))
            assert code == 3 and "another opsctl run holds this topology" in err and f"pid{holder.pid}" in err, err
            holder.send_signal(signal.SIGKILL)
            holder.wait()
        finally:
            holder.kill()
        code, out, err = run(capsys, "cluster", "reshard", "--auto-approve", "-f", str(spec), "--from", source.name,
                             "--to", target.name, "--slots", "10", "--state-dir", str(tmp_path / "b"))
        assert code == 0 and "moved 10 slots" in out, err + out

        hung = TopologyLock(Connector(loaded), loaded.layout.servers, lease=1.0)
        hung.acquire()
        hung._stop.set()  # stops renewing, keeps its connections: a run that hangs
        try:
            with pytest.raises(RefusedError, match="holds this topology"), topology_lock(Connector(loaded)):
                pass
            lease_lapsed(loaded, 30)  # the hung run's 1 s lease (rounded up to the second) ran out
            with topology_lock(Connector(loaded)) as lock:
                assert len(lock.held) == 6
        finally:
            hung.release()
        assert dataset_checksum(client) == before  # the lock wrote no key anywhere

        # a shard with two masters serving different slots (what a stalled master that woke up after its
        # failover can leave): apply refuses and names `cluster fix`, which merges the shard
        with admin_for(loaded, replica) as rep:
            rep.call("CLUSTER", "RESET", "SOFT")
            rep.call("CLUSTER", "MEET", target.address, target.port)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            code, out, err = run(capsys, "cluster", "reshard", "--auto-approve", "-f", str(spec), "--from", source.name,
                                 "--to", replica.name, "--slots", "5", "--state-dir", str(tmp_path / "b"))
            if code == 0:
                break
            time.sleep(0.5)
        assert code == 0, err + out
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 3 and "cluster fix" in err, err + out
        code, out, err = run(capsys, "cluster", "fix", "-f", str(spec))
        assert code == 0 and "now replicates" in out, err + out
        assert plan_json(capsys, spec)["steps"] == []
        assert dataset_checksum(cluster_client(loaded), "pre:*") == before
        referee_ok(loaded)

        # a merge stopped before its CLUSTER REPLICATE: a master without slots holding a key of a slot its
        # shard's master serves (possibly that key's only copy; REPLICATE refuses such a node): apply cannot
        # make it a replica, `cluster fix` hands the key over, then demotes it
        _half_merged(loaded, replica, target, "stray:1")
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
        assert code == 3 and "serves no slot but holds keys" in err and "cluster fix" in err, err + out
        code, out, err = run(capsys, "cluster", "fix", "-f", str(spec))
        assert code == 0 and f"{replica.name} now replicates {target.name}" in out, err + out
        assert cluster_client(loaded).get("stray:1") == "only copy"
        assert plan_json(capsys, spec)["steps"] == []
        assert dataset_checksum(cluster_client(loaded), "pre:*") == before
        referee_ok(loaded)


def test_fix_gives_an_unreachable_masters_slots_away_only_on_consent(tmp_path, capsys) -> None:
    """Shard 3's master killed with no replica: `cluster fix` refuses to give its slots away (their keys are
    lost) until --reassign-unreachable; then every live master unassigns them (only the ones its view assigns:
    shard 1's master lost one already, and DELSLOTSRANGE of a range with an unassigned slot fails as a whole), the
    master with the fewest slots takes them with BUMPEPOCH, and every live node sees all 16384 served."""
    with deployed(tmp_path, capsys, "cluster", "valkey", cluster={"replicas_per_master": 0}) as (spec, loaded):
        first, fewest, lost = (loaded.layout.node(s.master) for s in loaded.layout.shards)
        with admin_for(loaded, first) as admin:
            admin.call("CLUSTER", "DELSLOTS", 16383)
        os.kill(int((spec.parent / ".opsctl" / loaded.spec.name / lost.name / "server.pid").read_text()),
                signal.SIGKILL)
        code, out, err = run(capsys, "cluster", "fix", "-f", str(spec))
        assert code == 3 and "belong to unreachable master" in err and "--reassign-unreachable" in err, err + out
        code, out, err = run(capsys, "cluster", "fix", "-f", str(spec), "--reassign-unreachable", "--auto-approve")
        assert code == 0 and f"gave 5461 slots of unreachable master(s) to {fewest.name}" in out, err + out
        deadline = time.monotonic() + 10  # the first master learns the new owner from its pings (node timeout 2 s)
        for node in (first, fewest):
            with admin_for(loaded, node) as admin:
                while (info := parse_info(admin.call("CLUSTER", "INFO")))["cluster_state"] != "ok":
                    assert time.monotonic() < deadline, f"{node.name}: {info}"
                    time.sleep(0.1)
                assert info["cluster_slots_assigned"] == "16384", info


def test_a_live_lock_holds_whatever_the_holders_clock_says(tmp_path, capsys) -> None:
    """The holder's machine runs an hour behind: its live lock is still refused (staleness is the server's idle
    of the marker connection, not a wall clock), and still freed at once when the holder dies."""
    with deployed(tmp_path, capsys, "standalone", "valkey") as (spec, loaded):
        env = {**os.environ, PASSWORD_ENV: PASSWORD}
        holder = subprocess.Popen([sys.executable, "-c", SKEWED, str(spec)], env=env, stdout=subprocess.PIPE,
                                  text=True)
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            with pytest.raises(RefusedError, match="holds this topology") as refused, \
                    topology_lock(Connector(loaded)):
                pass
            assert f"pid{holder.pid}" in refused.value.summary
            holder.send_signal(signal.SIGKILL)
            holder.wait()
        finally:
            holder.kill()
        with topology_lock(Connector(loaded)) as lock:
            assert list(lock.held) == [loaded.layout.servers[0].name]



def _half_merged(loaded, node, master, key: str) -> None:
    """node: a replica of master made a master without slots that holds key (a slot master serves)."""
    with admin_for(loaded, node) as admin, admin_for(loaded, master) as owner:
        admin.call("CLUSTER", "RESET", "SOFT")
        admin.call("CLUSTER", "MEET", master.address, master.port)
        node_id, master_id = admin.call("CLUSTER", "MYID"), owner.call("CLUSTER", "MYID")
        def met() -> bool:
            return (any(ln.startswith(node_id) and " master " in ln for ln in owner.call("CLUSTER", "NODES")
                        .splitlines()) and "cluster_state:ok" in admin.call("CLUSTER", "INFO"))

        deadline = time.monotonic() + 20
        while not met():  # the master sees a master, the node sees every slot served again
            assert time.monotonic() < deadline, "the node and its master never met again"
            time.sleep(0.05)
        slot = key_slot(key.encode())
        (mine,) = [ln for ln in parse_cluster_nodes(owner.call("CLUSTER", "NODES")) if ln.is_myself]
        assert slot in expand(mine.slots), f"{key} is not in a slot {master.name} serves"
        direct = redis.Redis(host=node.address, port=node.port, password=PASSWORD, single_connection_client=True,
                             decode_responses=True)
        direct.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", master_id)
        direct.execute_command("ASKING")
        direct.set(key, "only copy")
        direct.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
        direct.close()
