"""opsctl.backup.rdb.split_keys against the servers themselves: every type and encoding Valkey 9.1 and Redis 7.0 save
(strings raw, integer and LZF; keys integer and LZF; lists, sets, sorted sets and hashes small and large; streams with
groups, pending entries and consumers; expiries; other dbs; LRU and LFU metadata; functions; a cluster node's file).
Each key's payload cut from the file must be byte for byte what DUMP answers, its expiry what PEXPIRETIME says."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import redis

from opsctl.backup.manifest import rdb_header
from opsctl.backup.rdb import KeyRecord, Unsplittable, lzf_decompress, split_keys
from opsctl.base.poll import Pending, wait_for
from tests.support import bare_server

pytestmark = pytest.mark.integration

LIBRARY = "#!lua name=splitlib\nredis.register_function('splitfn', function(keys, args) return 1 end)"


def _raw(client: Any) -> redis.Redis:
    kwargs = client.connection_pool.connection_kwargs
    return redis.Redis(host=kwargs["host"], port=kwargs["port"], password=kwargs.get("password"))


def _fill(raw: redis.Redis, flavor: str) -> None:
    rng = random.Random(7)
    raw.set("s:int", "12345")
    raw.set("s:neg", "-7")
    raw.set("s:wide", "4294967296")
    raw.set("s:embstr", "short")
    raw.set("s:raw", rng.randbytes(300))
    raw.set("s:lzf", "x" * 1000)  # compressed to < 64 bytes, 1000 long: the splitter's inline cases, each length
    raw.set("s:lzf-short", "x" * 40)
    raw.set("s:lzf-long", "".join(f"{i:05d}" for i in range(20_000)))
    raw.set("s:raw-32bit", rng.randbytes(20_000))
    raw.set(b"s:bin\x00\xff", b"\x00\x01\xfe")
    raw.set("123456", "an integer key")
    raw.set("k" * 200, "an LZF key")
    raw.set("ttl:ms", "v", px=600_000)
    raw.set("ttl:s", "v", ex=900_000)
    raw.rpush("l:small", *[f"e{i}" for i in range(5)])
    raw.rpush("l:big", *[f"element-{i}" * 3 for i in range(5000)])
    raw.rpush("l:huge-item", "y" * 10_000, "z")
    raw.sadd("set:int", *range(20))
    raw.sadd("set:small", *[f"m{i}" for i in range(10)])
    raw.sadd("set:big", *[f"member-{i}" for i in range(2000)])
    raw.zadd("z:small", {f"m{i}": i / 3 for i in range(10)})
    raw.zadd("z:big", {f"member-{i}": i * 1.5 for i in range(2000)} | {"inf": float("inf"), "-inf": float("-inf")})
    raw.hset("h:small", mapping={f"f{i}": f"v{i}" for i in range(10)})
    raw.hset("h:big", mapping={f"field-{i}": f"value-{i}" * 4 for i in range(2000)})
    raw.hset("h:long-value", mapping={"f": "w" * 5000})
    for i in range(300):
        raw.xadd("x:stream", {"n": i, "payload": f"p{i}"})
    raw.xgroup_create("x:stream", "g1", id="0")
    raw.xgroup_create("x:stream", "g2", id="$")
    raw.xreadgroup("g1", "alice", {"x:stream": ">"}, count=50)
    raw.xreadgroup("g1", "bob", {"x:stream": ">"}, count=20)
    first = raw.xrange("x:stream", count=3)
    raw.xack("x:stream", "g1", first[0][0])
    raw.xdel("x:stream", first[1][0])
    raw.xadd("x:empty", {"a": 1})
    raw.xtrim("x:empty", maxlen=0)
    raw.function_load(LIBRARY, replace=True)
    raw.execute_command("SELECT", 3)
    raw.set("db3:key", "in db 3")
    raw.hset("db3:hash", "f", "v")
    raw.execute_command("SELECT", 0)
    if flavor == "valkey":  # hash fields with their own TTL (Valkey 9.0's HSETEX)
        raw.execute_command("HSETEX", "h:field-ttl", "EX", 900, "FIELDS", 2, "a", "1", "b", "2")
        raw.hset("h:field-ttl", "c", "3")


def _splits(folder: Path) -> list[KeyRecord]:
    data = (folder / "dump.rdb").read_bytes()
    header = rdb_header(data[:9])
    assert header is not None
    return [split for page in split_keys(data, header[1], page=97) for split in page]


def _check(raw: redis.Redis, splits: list[KeyRecord]) -> None:
    by_db: dict[int, list[KeyRecord]] = {}
    for split in splits:
        by_db.setdefault(split.db, []).append(split)
    for db, entries in by_db.items():
        raw.execute_command("SELECT", db)
        assert len(entries) == raw.dbsize(), db
        for split in entries:
            assert raw.dump(split.key) == split.payload, split.key
            expires = raw.execute_command("PEXPIRETIME", split.key)
            assert split.expires == (expires if expires > 0 else 0), split.key
    raw.execute_command("SELECT", 0)


@pytest.fixture(params=["valkey", "redis"])
def flavor(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.parametrize("policy", ["noeviction", "allkeys-lru", "allkeys-lfu"])
def test_every_payload_is_what_dump_answers(flavor: str, policy: str, tmp_path: Path) -> None:
    lines = [f"maxmemory-policy {policy}", "maxmemory 512mb", "list-compress-depth 1", "databases 16"]
    with bare_server(flavor, tmp_path, lines) as client:
        raw = _raw(client)
        _fill(raw, flavor)
        raw.save()
        splits = _splits(tmp_path)
        _check(raw, splits)
        assert {s.key for s in splits} >= {b"s:lzf", b"k" * 200, b"123456", b"x:stream", b"db3:key"}


def test_a_cluster_nodes_file(flavor: str, tmp_path: Path) -> None:
    with bare_server(flavor, tmp_path, ["cluster-enabled yes", f"cluster-config-file {tmp_path}/n.conf"]) as client:
        raw = _raw(client)
        raw.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        wait_for(lambda: b"cluster_state:ok" in raw.execute_command("CLUSTER", "INFO") or Pending("cluster down"),
                 30.0, "the one-node cluster's state ok")
        pipe = raw.pipeline(transaction=False)
        for i in range(5000):
            pipe.set(f"key:{i}", i, px=900_000 if i % 3 == 0 else None)
        pipe.execute()
        raw.save()
        _check(raw, _splits(tmp_path))


def test_what_it_does_not_know_is_refused(tmp_path: Path) -> None:
    """A module's value, an unknown opcode and a file cut short: Unsplittable, never a wrong payload."""
    head = b"REDIS0010"
    with pytest.raises(Unsplittable, match="RDB type 7"):
        list(split_keys(head + b"\x07\x01k" + b"\x00" * 16, 10))
    with pytest.raises(Unsplittable, match="opcode 0xf4"):
        list(split_keys(head + b"\xf4\x00\x00\x00\xff", 10))
    with pytest.raises(Unsplittable):
        list(split_keys(head + b"\x00\x01k\x05ab", 10))
    with pytest.raises(Unsplittable, match="before its EOF"):
        list(split_keys(head + b"\x00\x01k\x01v", 10))


def test_lzf_round_trip() -> None:
    assert lzf_decompress(b"\x02abc\xe0\x02\x00", 14) == b"abc" + b"c" * 11  # 3 literal, then 11 from 1 back
    with pytest.raises(Unsplittable):
        lzf_decompress(b"\x20\x05", 3)
