"""Restore faults: SIGKILLed at random points and re-run; refusals that leave the target untouched."""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from tests.lifecycle import run
from tests.support import PASSWORD, admin_for
from tests.test_restore_live import backup_dir, clients, cluster, restore, topologies

pytestmark = pytest.mark.integration

KEYS = 150_000


def load(client: redis.Redis, count: int, db: int = 0, prefix: str = "k") -> None:
    if db:
        client = redis.Redis(host=client.connection_pool.connection_kwargs["host"],
                             port=client.connection_pool.connection_kwargs["port"], password=PASSWORD, db=db)
    for at in range(0, count, 5000):
        pipe = client.pipeline(transaction=False)
        for i in range(at, min(count, at + 5000)):
            pipe.set(f"{prefix}:{i}", i, px=3_600_000 if i % 7 == 0 else None)
        pipe.execute()


def target_keys(loaded) -> int:
    return sum(client.dbsize() for client in clients(loaded))


def keys_of(loaded) -> set[bytes]:
    out: set[bytes] = set()
    for client in clients(loaded):
        out.update(client.scan_iter(count=5000))
    return out


def test_killed_restore_finishes_on_rerun(tmp_path, capsys) -> None:
    with topologies(tmp_path, capsys, "valkey", ("standalone", {}), cluster(3)) as deployed_:
        (s, s_loaded), (c, c_loaded) = deployed_
        load(clients(s_loaded)[0], KEYS)
        folder = backup_dir(capsys, s, tmp_path / "backups")
        argv = [sys.executable, "-m", "opsctl.cli.main", "restore", "-f", str(c), "--from", str(folder)]
        kills, written = 0, 0
        for _ in range(3):  # each run killed at a random point after it wrote more keys than the last
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy())
            while proc.poll() is None and target_keys(c_loaded) <= written:
                time.sleep(0.02)
            if kills == 0 and proc.poll() is None:  # another run on the same target, from another state dir
                code, _, err = restore(capsys, c, "--from", str(folder), "--state-dir", str(tmp_path / "other"))
                assert code == 3 and "lock" in err.lower(), err
            time.sleep(random.uniform(0, 1.0))
            if proc.poll() is not None:
                break
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
            written = target_keys(c_loaded)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stderr + done.stdout
        assert kills == 0 or "(resumed)" in done.stdout or "already restored" in done.stdout, done.stdout
        assert keys_of(c_loaded) == {f"k:{i}".encode() for i in range(KEYS)}
        assert not list(Path("/tmp").glob(f"opsctl-scratch-{proc.pid}-*"))  # the killed run's scratch is gone


def test_a_restore_killed_after_its_checks_is_not_refused_when_run_again(tmp_path, capsys) -> None:
    """A run killed in its last steps (its checks passed, the scratch servers and locks still being let go) left a
    finished journal: the same command again checks the target and succeeds instead of refusing the keys it
    restored itself. Anything else about the target (a changed key, another source) is judged as before."""
    with topologies(tmp_path, capsys, "valkey", ("standalone", {}), cluster(3)) as deployed_:
        (s, s_loaded), (c, c_loaded) = deployed_
        load(clients(s_loaded)[0], 3000)
        folder = backup_dir(capsys, s, tmp_path / "backups")
        code, out, err = restore(capsys, c, "--from", str(folder))
        assert code == 0, err + out
        code, out, err = restore(capsys, c, "--from", str(folder), "--dry-run")  # checks, reads only
        assert code == 0 and "already restored" in out, err + out
        code, out, err = restore(capsys, c, "--from", str(folder))  # the state a kill after the checks leaves
        assert code == 0 and "already restored" in out and "all equal" in out, err + out
        assert keys_of(c_loaded) == {f"k:{i}".encode() for i in range(3000)}

        writer = redis.RedisCluster(host=c_loaded.layout.servers[0].address, port=c_loaded.layout.servers[0].port,
                                    password=PASSWORD)
        writer.set("k:1", "changed")
        code, out, err = restore(capsys, c, "--from", str(folder), "--verify", "full")
        assert code == 3 and "k:1" in err and "already exist" in err and "finished here before" in err, err + out
        assert writer.get("k:1") == b"changed"  # refused as a fresh run is: nothing written
        code, out, err = restore(capsys, c, "--from", str(folder), "--mode", "skip-existing")
        assert code == 0 and "already restored" not in out and "1 skipped" in out, err + out  # a run of its own
        assert writer.get("k:1") == b"changed"

        for client in clients(c_loaded):  # FLUSHALL is disabled: each master's own keys, one by one
            pipe = client.pipeline(transaction=False)
            for key in client.scan_iter(count=1000):
                pipe.unlink(key)
            pipe.execute()
        code, out, err = restore(capsys, c, "--from", str(folder))  # an emptied target is restored again
        assert code == 0 and "(resumed)" not in out, err + out
        assert keys_of(c_loaded) == {f"k:{i}".encode() for i in range(3000)}


def test_refusals_write_nothing(tmp_path, capsys) -> None:
    with topologies(tmp_path, capsys, "valkey", ("standalone", {}), cluster(3)) as deployed_:
        (s, s_loaded), (c, c_loaded) = deployed_
        source = clients(s_loaded)[0]
        load(source, 200)
        load(source, 10, db=2, prefix="other")
        source.set("blob", b"x" * (3 << 20))
        with_db2 = backup_dir(capsys, s, tmp_path / "backups")

        def untouched() -> None:
            assert sum(client.dbsize() for client in clients(c_loaded)) == 0

        code, _, err = restore(capsys, c, "--from", str(with_db2))
        assert code == 3 and "databases [2]" in err and "nothing was written" in err, err
        untouched()

        damaged = tmp_path / "damaged"
        shutil.copytree(with_db2, damaged)
        raw = bytearray((damaged / "shard-1.rdb").read_bytes())
        raw[100] ^= 0x01
        (damaged / "shard-1.rdb").write_bytes(bytes(raw))
        code, _, err = restore(capsys, c, "--from", str(damaged))
        assert code == 1 and "shard-1.rdb" in err and "corrupt" in err, err
        untouched()
        (damaged / "manifest.json").write_text("{}")
        code, _, err = restore(capsys, c, "--from", str(damaged))
        assert code == 1 and "manifest.json: format is missing" in err, err

        redis_db2 = redis.Redis(host=s_loaded.layout.servers[0].address, port=s_loaded.layout.servers[0].port,
                                password=PASSWORD, db=2)
        redis_db2.delete(*[f"other:{i}" for i in range(10)])
        db0 = backup_dir(capsys, s, tmp_path / "backups")
        masters = [n for n in c_loaded.layout.servers if n.role == "master"]
        for node in masters:
            with admin_for(c_loaded, node) as admin:
                admin.config_set("maxmemory", str(2 << 20))
        code, _, err = restore(capsys, c, "--from", str(db0))
        assert code == 3 and "no room" in err and "maxmemory" in err, err
        untouched()
        for node in masters:
            with admin_for(c_loaded, node) as admin:
                admin.config_set("maxmemory", "64mb")

        with admin_for(c_loaded, masters[0]) as first, admin_for(c_loaded, masters[1]) as second:
            target_id = second.call("CLUSTER", "MYID")
            first.call("CLUSTER", "SETSLOT", 100, "MIGRATING", target_id)
            code, _, err = restore(capsys, c, "--from", str(db0))
            first.call("CLUSTER", "SETSLOT", 100, "STABLE")
        assert code == 3 and "not ready" in err and "open slot" in err.lower(), err
        untouched()

        code, out, err = restore(capsys, c, "--from", str(db0))
        assert code == 0 and "verified" in out, err + out
        assert sum(client.dbsize() for client in clients(c_loaded)) == 201


def test_valkey_backup_refused_by_redis_target(tmp_path, capsys) -> None:
    """Valkey 9.1 backups (format 80 on disk; 11 when served to a replica, as backups are now copied) and DUMP
    payloads Redis 7.0 cannot read: refused up front."""
    with topologies(tmp_path, capsys, "valkey", ("standalone", {})) as [(s, s_loaded)], \
            topologies(tmp_path / "r", capsys, "redis", ("standalone", {})) as [(r, r_loaded)]:
        load(clients(s_loaded)[0], 50)
        folder = backup_dir(capsys, s, tmp_path / "backups")
        code, _, err = restore(capsys, r, "--from", str(folder))
        assert code == 3 and "redis 7.0 cannot read" in err and re.search(r"RDB format (80|11);", err), err
        code, _, err = run(capsys, "restore", "-f", str(r), "--from-live", str(s))
        assert code == 3 and "cannot RESTORE" in err, err
        assert clients(r_loaded)[0].dbsize() == 0


def test_redis_backup_restores_into_valkey(tmp_path, capsys) -> None:
    """Redis 7.0 writes RDB format 10, which Valkey 9.1 reads: the backup loads into a Valkey scratch server
    whose DUMP payloads the Valkey target takes; every type and TTL arrives."""
    from tests.test_restore_live import fill, same_data, snapshot

    with topologies(tmp_path, capsys, "redis", ("standalone", {})) as [(r, r_loaded)], \
            topologies(tmp_path / "v", capsys, "valkey", ("standalone", {})) as [(v, v_loaded)]:
        fill(r_loaded, strings=500)
        folder = backup_dir(capsys, r, tmp_path / "backups")
        code, out, err = restore(capsys, v, "--from", str(folder), "--verify", "full")
        assert code == 0 and "verified" in out, err + out
        same_data(snapshot(r_loaded), snapshot(v_loaded))


def test_target_killed_mid_restore_then_rerun(tmp_path, capsys) -> None:
    """The target's server SIGKILLed while keys stream in: opsctl stops with an error naming the restore (no
    traceback); once `opsctl apply` restarted the node, the same command resumes and every key is there."""
    with topologies(tmp_path, capsys, "valkey", ("standalone", {}), ("standalone", {})) as deployed_:
        (s, s_loaded), (t, t_loaded) = deployed_
        load(clients(s_loaded)[0], KEYS)
        folder = backup_dir(capsys, s, tmp_path / "backups")
        argv = [sys.executable, "-m", "opsctl.cli.main", "restore", "-f", str(t), "--from", str(folder)]
        target = clients(t_loaded)[0]
        pid = int(target.info("server")["process_id"])
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy())
        while proc.poll() is None and target.dbsize() == 0:
            time.sleep(0.02)
        os.kill(pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 1 and "stopped" in err and "internal error" not in err, err
        code, out, err = run(capsys, "apply", "-f", str(t), "--auto-approve")
        assert code == 0, err + out
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0 and "(resumed)" in done.stdout, done.stderr + done.stdout
        assert keys_of(t_loaded) == {f"k:{i}".encode() for i in range(KEYS)}
