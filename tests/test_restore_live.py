"""opsctl restore into other shapes, on Valkey 9.1 and Redis 7.0: every type, TTLs, a 100k-field hash, every
value compared with the source afterwards; --from-live; keys that exist; refusals that write nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
import redis

from opsctl.spec.load import LoadedSpec
from tests.lifecycle import deployed, run
from tests.support import PASSWORD, cluster_check
from tests.test_slots_lock_and_fix import HOLD

pytestmark = pytest.mark.integration

BIG_HASH_FIELDS = 100_000


def clients(loaded: LoadedSpec) -> list[redis.Redis]:
    """A client per master (as the layout says; these tests do not fail over)."""
    return [redis.Redis(host=n.address, port=n.port, password=PASSWORD) for n in loaded.layout.servers
            if n.role == "master"]


def writer_for(loaded: LoadedSpec) -> redis.Redis | redis.RedisCluster:
    if loaded.spec.topology == "cluster":
        from redis.cluster import ClusterNode
        return redis.RedisCluster(startup_nodes=[ClusterNode(n.address, n.port) for n in loaded.layout.servers],
                                  password=PASSWORD)
    return clients(loaded)[0]


def fill(loaded: LoadedSpec, strings: int = 3000) -> None:
    """Every type, keys with and without TTL, hash tags, binary names, and one 100k-field hash."""
    client = writer_for(loaded)
    pipe = client.pipeline(transaction=False) if loaded.spec.topology != "cluster" else client.pipeline()
    for i in range(strings):
        pipe.set(f"s:{i}", f"value-{i}" * (i % 5 + 1))
        if i % 10 == 0:
            pipe.pexpire(f"s:{i}", 600_000 + i)
    for i in range(50):
        pipe.hset(f"h:{i}", mapping={f"f{j}": j for j in range(i % 20 + 1)})
        pipe.rpush(f"l:{i}", *[f"e{j}" for j in range(i % 30 + 1)])
        pipe.sadd(f"set:{i}", *[f"m{j}" for j in range(i % 40 + 1)])
        pipe.zadd(f"z:{i}", {f"m{j}": j * 1.5 for j in range(i % 25 + 1)})
        pipe.xadd(f"x:{i}", {"a": str(i), "b": "x" * i})
        pipe.set(f"{{tag{i % 3}}}:k:{i}", i)
    pipe.set(b"bin:\x00\xff\r\n key", b"\x00\x01\x02")
    pipe.execute()
    big = {f"field:{j}": f"v{j}" for j in range(BIG_HASH_FIELDS)}
    items = list(big.items())
    for at in range(0, len(items), 10_000):
        client.hset("big:hash", mapping=dict(items[at:at + 10_000]))
    client.close()


READERS = {b"string": lambda p, k: p.get(k), b"hash": lambda p, k: p.hgetall(k),
           b"list": lambda p, k: p.lrange(k, 0, -1), b"set": lambda p, k: p.smembers(k),
           b"zset": lambda p, k: p.zrange(k, 0, -1, withscores=True), b"stream": lambda p, k: p.xrange(k)}


def snapshot(loaded: LoadedSpec) -> tuple[dict[bytes, object], dict[bytes, int]]:
    """Every key's value and absolute expiry in ms (-1: none), from the masters of the layout, db 0."""
    values: dict[bytes, object] = {}
    ttls: dict[bytes, int] = {}
    for client in clients(loaded):
        keys = list(client.scan_iter(count=1000))
        for at in range(0, len(keys), 500):
            batch = keys[at:at + 500]
            pipe = client.pipeline(transaction=False)
            for key in batch:
                pipe.type(key)
            kinds = pipe.execute()
            for key, kind in zip(batch, kinds, strict=True):
                READERS[kind](pipe, key)
                pipe.pexpiretime(key)
            replies = pipe.execute()
            for i, (key, kind) in enumerate(zip(batch, kinds, strict=True)):
                found = replies[2 * i]
                values[key] = kind, sorted(found.items() if isinstance(found, dict) else found) \
                    if kind in (b"hash", b"set") else found
                ttls[key] = replies[2 * i + 1]
        client.close()
    return values, ttls


def same_data(source: tuple[dict, dict], target: tuple[dict, dict]) -> None:
    assert set(target[0]) == set(source[0])
    assert [k for k in source[0] if source[0][k] != target[0][k]] == []
    off = [k for k, t in source[1].items() if (t < 0) != (target[1][k] < 0) or abs(t - target[1][k]) > 1000]
    volatile = sum(t > 0 for t in source[1].values())
    assert volatile >= 50 and sum(t > 0 for t in target[1].values()) == volatile  # TTLs kept, expiry within 1 s
    assert off == [], [(k, source[1][k], target[1][k]) for k in off[:5]]


def restore(capsys, spec: Path, *args: str) -> tuple[int, str, str]:
    return run(capsys, "restore", "-f", str(spec), *args)


def backup_dir(capsys, spec: Path, to: Path) -> Path:
    code, out, err = run(capsys, "backup", "-f", str(spec), "--to", str(to), "--output", "json")
    assert code == 0, err + out
    return Path(json.loads(out.splitlines()[-1])["dir"])


@contextmanager
def topologies(tmp_path: Path, capsys, flavor: str,
               *shapes: tuple[str, dict]) -> Iterator[list[tuple[Path, LoadedSpec]]]:
    with ExitStack() as stack:
        out = []
        for i, (topology, sections) in enumerate(shapes):
            folder = tmp_path / f"t{i}"
            folder.mkdir(parents=True)
            out.append(stack.enter_context(deployed(folder, capsys, topology, flavor, **sections)))
        yield out


def cluster(masters: int) -> tuple[str, dict]:
    return "cluster", {"cluster": {"masters": masters, "replicas_per_master": 0}}


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_restore_into_other_shapes(tmp_path, capsys, flavor) -> None:
    shapes = cluster(3), cluster(5), cluster(3), ("standalone", {}), cluster(3)
    with topologies(tmp_path, capsys, flavor, *shapes) as deployed_:
        (a, a_loaded), (b, b_loaded), (c, c_loaded), (s, s_loaded), (d, d_loaded) = deployed_
        fill(a_loaded)
        source = snapshot(a_loaded)
        folder = backup_dir(capsys, a, tmp_path / "backups")

        code, out, err = restore(capsys, b, "--from", str(folder), "--dry-run")
        assert code == 0 and "nothing was written" in out, err + out
        assert sum(c.dbsize() for c in clients(b_loaded)) == 0

        code, out, err = restore(capsys, b, "--from", str(folder))  # 3 masters -> 5
        assert code == 0 and "verified" in out, err + out
        same_data(source, snapshot(b_loaded))
        assert cluster_check(b_loaded.layout.servers[0].endpoint).returncode == 0

        code, out, err = restore(capsys, c, "--from-live", str(b), "--verify", "full")  # 5 -> 3 (a spec's least), live
        assert code == 0 and "verified" in out, err + out
        same_data(source, snapshot(c_loaded))

        code, out, err = restore(capsys, s, "--from", str(folder))  # cluster -> standalone
        assert code == 0, err + out
        same_data(source, snapshot(s_loaded))

        standalone = backup_dir(capsys, s, tmp_path / "backups")
        code, out, err = restore(capsys, d, "--from", str(standalone))  # standalone -> cluster
        assert code == 0 and "verified" in out, err + out
        same_data(source, snapshot(d_loaded))
        code, out, err = restore(capsys, b, "--from", str(standalone))  # the keys are there already
        assert code == 3 and "already exist" in err and "nothing was written" in err, err



def test_a_live_source_is_locked_while_it_is_read(tmp_path, capsys) -> None:
    """Another run holding the source (a reshard, a failover) refuses the copy before anything is written, as
    `backup` does; a spec naming the target's own servers is refused before any lock."""
    with topologies(tmp_path, capsys, "valkey", ("standalone", {}), ("standalone", {})) as [(s, s_loaded),
                                                                                             (t, t_loaded)]:
        clients(s_loaded)[0].mset({f"k:{i}": i for i in range(50)})
        holder = subprocess.Popen([sys.executable, "-c", HOLD, str(s)], stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            code, _, err = restore(capsys, t, "--from-live", str(s))
            assert code == 3 and "holds this topology" in err, err
            assert clients(t_loaded)[0].dbsize() == 0
        finally:
            holder.kill()
            holder.wait()
        code, _, err = restore(capsys, t, "--from-live", str(t))
        assert code == 3 and "same nodes" in err and "both specs name" in err, err
        code, out, err = restore(capsys, t, "--from-live", str(s))
        assert code == 0 and "verified" in out, err + out
