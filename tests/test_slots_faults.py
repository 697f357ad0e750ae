"""Servers misbehaving under a key-by-key reshard (Redis 7.0): the target stalls (SIGSTOP shorter and longer
than the node timeout, so the cluster fails it over), the source is SIGKILLed (its replica is promoted).
Referees: a concurrent writer recording acknowledged writes, a count + checksum of the preloaded keys,
redis-cli --cluster check, one master with its replica per shard, and an empty plan."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opsctl.base.poll import wait_for
from opsctl.spec.load import LoadedSpec
from tests.lifecycle import deployed, plan_json, run
from tests.support import CONDITION_BOUND, PASSWORD, PASSWORD_ENV
from tests.test_slots_reshard import preload, referee_ok
from tests.test_slots_signals import open_slots
from tests.writer import Writer, cluster_client, dataset_checksum

pytestmark = pytest.mark.integration
NODE_TIMEOUT_MS = 2000


def pid_of(spec: Path, loaded: LoadedSpec, name: str) -> int:
    return int((spec.parent / ".opsctl" / loaded.spec.name / name / "server.pid").read_text())


def reshard(spec: Path, source: str, target: str, slots: int, rate: int) -> subprocess.Popen[str]:
    env = {**os.environ, PASSWORD_ENV: PASSWORD}
    return subprocess.Popen([sys.executable, "-m", "opsctl.cli.main", "cluster", "reshard", "-f", str(spec),
                             "--auto-approve", "--from", source, "--to", target, "--slots", str(slots),
                             "--max-keys-per-sec", str(rate)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def serving(loaded: LoadedSpec, slot: int) -> str:
    """The node serving slot now (on a loaded machine a short node timeout may have failed a master over
    before the test begins: kill or stall the node that really moves the slots)."""
    client = cluster_client(loaded)
    node = client.nodes_manager.get_node_from_slot(slot)
    client.close()
    found = loaded.layout.find(f"{node.host}:{node.port}")
    assert found is not None, node
    return found.name


def wait_moving(spec: Path, loaded: LoadedSpec) -> None:
    journal = spec.parent / ".opsctl" / loaded.spec.name / "slots-journal.jsonl"
    deadline = time.monotonic() + 90
    while not journal.exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert journal.exists(), "the reshard did not start moving"
    wait_for(lambda: open_slots(loaded) or None, CONDITION_BOUND,
             "a slot open on the servers (the move under way)", 0.01)


def one_master_and_replica_per_shard(loaded: LoadedSpec) -> None:
    client = cluster_client(loaded)
    masters = client.get_primaries()
    assert len(masters) == 3, masters
    for node in masters:
        role = client.get_redis_connection(node).execute_command("ROLE")
        assert len(role[2]) == 1, (node, role)
    client.close()


def converge(capsys: pytest.CaptureFixture[str], spec: Path) -> None:
    """What an operator runs after the fault: `apply` until the plan is empty. A node that was down comes
    back with what its nodes.conf kept (e.g. a stale MIGRATING flag): the apply that starts it sees that
    only once it runs, so a second apply may be needed, never more."""
    for _ in range(2):
        if not plan_json(capsys, spec)["steps"]:
            return
        code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
    assert code == 0, err + out
    assert plan_json(capsys, spec)["steps"] == []


@pytest.mark.parametrize("stall", [1.0, 5.0], ids=["shorter-than-node-timeout", "longer-than-node-timeout"])
def test_target_stalls_mid_reshard(tmp_path, capsys, stall) -> None:
    cluster = {"node_timeout_ms": NODE_TIMEOUT_MS}
    with deployed(tmp_path, capsys, "cluster", "redis", cluster=cluster) as (spec, loaded):
        preload(loaded, 20000)
        client = cluster_client(loaded)
        before = dataset_checksum(client, "pre:*")
        source, target = serving(loaded, 0), serving(loaded, 6000)
        with Writer(lambda: cluster_client(loaded)) as writer:
            writer.wait_for_writes(100)
            proc = reshard(spec, source, target, 3000, 1000)
            wait_moving(spec, loaded)
            pid = pid_of(spec, loaded, target)
            os.kill(pid, signal.SIGSTOP)
            time.sleep(stall)  # the fault's duration (under or over the node timeout): a sleep
            os.kill(pid, signal.SIGCONT)
            out, err = proc.communicate(timeout=120)
            sys.__stderr__.write(f"RESHARD {proc.returncode} {out} {err}\n")
            assert "internal error" not in err and "Traceback" not in err, err
            if proc.returncode == 1 and "failed over in the middle of a slot move" in err:
                # Seen once in three CI runs: after following the first failover, a second one was seen (stale
                # gossip while the stalled node came back) and the run stopped with its documented hint. The
                # guarantee is unchanged: `cluster fix` closes what is open, and nothing acknowledged is lost.
                # (The frequent case under load, the woken target keeping the wave it was given just before its
                # failover, is merged by the run itself: see opsctl/slots/moveguard.py and merge_split_shards.)
                code, fixed, fix_err = run(capsys, "cluster", "fix", "-f", str(spec))
                assert code == 0, fix_err + fixed
            else:
                assert proc.returncode == 0 and "moved 3000 slots" in out, err + out  # followed the failover
            converge(capsys, spec)
            writer.wait_for_writes(len(writer.acked) + 100)
        assert writer.verify(client) == []
        assert dataset_checksum(client, "pre:*") == before
        one_master_and_replica_per_shard(loaded)
        referee_ok(loaded)


def test_source_killed_mid_reshard(tmp_path, capsys) -> None:
    cluster = {"node_timeout_ms": NODE_TIMEOUT_MS}
    with deployed(tmp_path, capsys, "cluster", "redis", cluster=cluster) as (spec, loaded):
        preload(loaded, 20000)
        client = cluster_client(loaded)
        before = dataset_checksum(client, "pre:*")
        source, target = serving(loaded, 0), serving(loaded, 6000)
        with Writer(lambda: cluster_client(loaded)) as writer:
            writer.wait_for_writes(100)
            proc = reshard(spec, source, target, 3000, 1000)
            wait_moving(spec, loaded)
            os.kill(pid_of(spec, loaded, source), signal.SIGKILL)
            killed_at = time.monotonic()
            out, err = proc.communicate(timeout=120)
            sys.__stderr__.write(f"RESHARD {proc.returncode} {out} {err}\n")
            assert "internal error" not in err and "Traceback" not in err, err
            assert proc.returncode == 0 and "moved 3000 slots" in out, err + out  # followed the failover
            converge(capsys, spec)
            writer.wait_for_writes(len(writer.acked) + 100)
        lost = writer.verify(client)
        window = [t for t in writer.ack_times if killed_at - 0.5 <= t <= killed_at]
        sys.__stderr__.write(f"acknowledged writes lost at the SIGKILL of the source: {len(lost)} "
                             f"(acknowledged in the 0.5 s before it: {len(window)})\n")
        assert len(lost) <= len(window), lost  # only the asynchronous replication window at the kill
        assert dataset_checksum(client, "pre:*") == before
        one_master_and_replica_per_shard(loaded)
        referee_ok(loaded)
