"""`opsctl cluster reshard|rebalance|fix` on real Valkey 9.1 (atomic) and Redis 7.0 (key by key), judged by a
concurrent RedisCluster writer, a full count + checksum, and redis-cli --cluster check."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opsctl.slots.journal import JOURNAL
from opsctl.spec.load import LoadedSpec
from tests.lifecycle import deployed, plan_json, run
from tests.support import CONDITION_BOUND, PASSWORD, PASSWORD_ENV, NodeClient, admin_for, cluster_check
from tests.writer import Writer, cluster_client, dataset_checksum

pytestmark = pytest.mark.integration


def preload(loaded: LoadedSpec, count: int, prefix: str = "pre") -> None:
    client = cluster_client(loaded)
    for start in range(0, count, 1000):
        pipe = client.pipeline()
        for i in range(start, min(count, start + 1000)):
            pipe.set(f"{prefix}:{i}", f"v{i}")
        pipe.execute()
    client.close()


def referee_ok(loaded: LoadedSpec) -> None:
    check = cluster_check(loaded.layout.servers[0].endpoint)
    assert check.returncode == 0 and "[ERR]" not in check.stdout, check.stdout + check.stderr


def master_slots(spec: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, int]:
    _code, out, _ = run(capsys, "cluster", "check", "-f", str(spec), "--output", "json")
    return {s["master"]: s["slot_count"] for s in json.loads(out)["shards"]}


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_reshard_and_rebalance_with_a_concurrent_writer(tmp_path, capsys, flavor) -> None:
    with deployed(tmp_path, capsys, "cluster", flavor) as (spec, loaded):
        preload(loaded, 6000)
        client = cluster_client(loaded)
        before = dataset_checksum(client, "pre:*")
        a, b = loaded.layout.shards[0].master, loaded.layout.shards[1]
        code, out, err = run(capsys, "cluster", "reshard", "--auto-approve", "-f", str(spec), "--from", a,
                             "--to", loaded.layout.node(b.master).endpoint, "--slots", "1500", "--dry-run")
        assert code == 0 and "Would move: 1" in out and "1500 slots" in out, err
        with Writer(lambda: cluster_client(loaded)) as writer:
            writer.wait_for_writes(200)
            code, out, err = run(capsys, "cluster", "reshard", "-f", str(spec), "--from", a, "--to", b.master,
                                 "--auto-approve", "--slots", "1500", "--output", "json")
            assert code == 0, err
            events = [json.loads(line) for line in err.splitlines()]
            mode = "atomic" if flavor == "valkey" else "key-by-key"
            assert events[0]["event"] == "slots-start" and events[0]["mode"] == mode
            assert events[-1]["event"] == "slots-done" and events[-1]["slots_done"] == 1500
            code, out, err = run(capsys, "cluster", "rebalance", "--auto-approve", "-f", str(spec), "--threshold", "1")
            assert code == 0 and "moved 1500 slots" in out, err + out
            writer.wait_for_writes(len(writer.acked) + 200)
        assert writer.verify(client) == []
        assert dataset_checksum(client, "pre:*") == before
        assert sorted(master_slots(spec, capsys).values()) == [5461, 5461, 5462]
        referee_ok(loaded)
        assert not (spec.parent / ".opsctl" / loaded.spec.name / JOURNAL).exists()


def _slot_key(client: object, slot: int, prefix: str) -> str:
    return next(f"{prefix}:{i}" for i in range(10**6) if client.keyslot(f"{prefix}:{i}") == slot)  # type: ignore[attr-defined]


def _ask_set(admin: NodeClient, source_id: str, slot: int, key: str, value: str | None) -> None:
    """Put (or delete) a copy of key on a node that does not own its slot: IMPORTING + ASKING."""
    admin.call("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
    pipe = admin.client.pipeline(transaction=False)
    pipe.execute_command("ASKING")
    pipe.set(key, value) if value is not None else pipe.delete(key)
    pipe.execute()


def test_busykey_equal_replaced_different_refused_then_fix_and_a_big_hash(tmp_path, capsys) -> None:
    # EVAL disabled: keys are sized by MEMORY USAGE one by one (the fallback of the size script)
    no_eval = {"disabled_commands": ["FLUSHALL", "FLUSHDB", "KEYS", "EVAL"]}
    with deployed(tmp_path, capsys, "cluster", "redis", hardening=no_eval) as (spec, loaded):
        client = cluster_client(loaded)
        source, target = (loaded.layout.node(s.master) for s in loaded.layout.shards[:2])
        with admin_for(loaded, source) as src, admin_for(loaded, target) as tgt:
            source_id = src.call("CLUSTER", "MYID")
            top = 5461  # the first shard's highest slot: reshard --slots 1 takes the highest
            same, differ, big = (_slot_key(client, top - i, f"k{i}") for i in range(3))
            client.set(same, "equal")
            client.set(differ, "source-value")
            for field in range(0, 100_000, 5000):
                client.hset(big, mapping={f"f{j}": "x" * 20 for j in range(field, field + 5000)})
            _ask_set(tgt, source_id, top, same, "equal")
            code, out, err = run(capsys, "cluster", "fix", "-f", str(spec))
            assert code == 0 and "busy-key-equal" in err and "found open" in out, err + out
            _ask_set(tgt, source_id, top - 1, differ, "target-value")
            code, out, err = run(capsys, "cluster", "reshard", "--auto-approve", "-f", str(spec), "--from", source.name,
                                 "--to", target.name, "--slots", "1")
            assert code == 3 and "different values" in err and differ in err, err
            assert src.client.get(differ) == "source-value"
            plan = plan_json(capsys, spec)
            assert [s["kind"] for s in plan["steps"]][:1] == ["close-slots"]
            _ask_set(tgt, source_id, top - 1, differ, None)
            code, out, err = run(capsys, "cluster", "fix", "-f", str(spec))
            assert code == 0, err + out
            code, out, err = run(capsys, "cluster", "reshard", "--auto-approve", "-f", str(spec), "--from", source.name,
                                 "--to", target.name, "--slots", "1")
            assert code == 0 and "moved 1 slots, 1 keys" in out, err + out
        assert client.get(same) == "equal" and client.get(differ) == "source-value"
        assert client.hlen(big) == 100_000
        referee_ok(loaded)


def test_sigkill_mid_reshard_then_apply_recovers(tmp_path, capsys) -> None:
    with deployed(tmp_path, capsys, "cluster", "redis") as (spec, loaded):
        preload(loaded, 20000)
        client = cluster_client(loaded)
        before = dataset_checksum(client, "pre:*")
        a, b = loaded.layout.shards[0].master, loaded.layout.shards[2].master
        env = {**os.environ, PASSWORD_ENV: PASSWORD}
        journal = spec.parent / ".opsctl" / loaded.spec.name / JOURNAL
        with Writer(lambda: cluster_client(loaded)) as writer:
            for source, target in ((a, b), (b, a)):
                proc = subprocess.Popen(
                    # ~2.4k keys: >2 s
                    [sys.executable, "-m", "opsctl.cli.main", "cluster", "reshard", "-f", str(spec), "--from", source,
                     "--to", target, "--slots", "2000", "--max-keys-per-sec", "1000", "--auto-approve"],
                    env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                deadline = time.monotonic() + CONDITION_BOUND
                while not journal.exists() and time.monotonic() < deadline:
                    time.sleep(0.005)
                time.sleep(random.uniform(0.0, 1.0))  # a random point of the move, after it began
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                assert journal.exists()
                code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
                assert code == 0, err + out
                assert plan_json(capsys, spec)["steps"] == []
            writer.wait_for_writes(len(writer.acked) + 100)
        # a kill between journaling a wave and opening it leaves an entry with nothing open: fix drops it
        code, out, err = run(capsys, "cluster", "fix", "-f", str(spec))
        assert code == 0 and not journal.exists(), err + out
        assert writer.verify(client) == []
        assert dataset_checksum(client, "pre:*") == before
        referee_ok(loaded)
