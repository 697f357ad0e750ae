"""Pure parts of backup and restore: the manifest read back, saver choice, fork waves, scratch choice, routing,
payload comparison, counts, room, the resume journal."""

from __future__ import annotations

import json

import pytest

from opsctl.backup.manifest import (
    Manifest,
    ShardFile,
    count_problem,
    manifest_json,
    parse_manifest,
    rdb_header,
    shard_file_name,
)
from opsctl.backup.savers import Member, Saver, choose_saver, host_waves, parse_keyspace, pick_scratch
from opsctl.base.errors import OpsctlError, RefusedError
from opsctl.observe.replies import parse_cluster_nodes
from opsctl.restore.route import (
    Counts,
    Journal,
    cluster_router,
    expiry_of,
    journal_json,
    landed_problem,
    parse_journal,
    restore_command,
    room_problems,
    same_payload,
)


def shard(n: int = 1, **changes: object) -> ShardFile:
    base = ShardFile(n, f"o-{n}", "replica", ((0, 5460),), shard_file_name(n), 120, f"{n:x}" * 64, {0: 10}, {0: 2},
                     {0: 11}, 4242, "2026-11-22T23:59:59Z", 5000)
    return ShardFile(**{**base.__dict__, **changes})  # type: ignore[arg-type]


def manifest(*shards: ShardFile) -> Manifest:
    return Manifest("orders", "cluster", "valkey", "9.1", 80, "2026-11-22T23:59:58Z", shards or (shard(),))


def test_manifest_round_trip() -> None:
    m = manifest(shard(1), shard(2, slots=((5461, 16383),)))
    assert parse_manifest(manifest_json(m), "m.json") == m


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.pop("flavor"), "flavor is missing"),
    (lambda d: d.update(flavor="keydb"), "flavor has an unexpected value"),
    (lambda d: d.update(format=2), "format is 2"),
    (lambda d: d.clear(), "format is missing"),  # not a manifest at all: said before any other field
    (lambda d: d.update(format="1"), "format must be int, not str"),
    (lambda d: d.update(rdb_version="80"), "rdb_version must be int"),
    (lambda d: d.update(shards=[]), "shards is empty"),
    (lambda d: d["shards"][0].update(file="../../etc/passwd"), "shards[0].file has an unexpected value"),
    (lambda d: d["shards"][0].update(file="shard-2.rdb"), "expected 'shard-1.rdb'"),
    (lambda d: d["shards"][0].update(sha256="xyz"), "shards[0].sha256"),
    (lambda d: d["shards"][0].update(bytes=-1), "shards[0].bytes is -1"),
    (lambda d: d["shards"][0].update(slots=[[5, 3]]), "shards[0].slots[0]"),
    (lambda d: d["shards"][0].update(keys={"x": 1}), "not a database number"),
    (lambda d: d["shards"][0].update(expires={"0": 99}), "larger than the key count"),
    (lambda d: d["shards"][0].update(saved_at="yesterday"), "not an ISO time"),
    (lambda d: d["shards"].append(d["shards"][0]), "lists a shard twice"),
    (lambda d: d["shards"].append({**d["shards"][0], "shard": 2, "file": "shard-2.rdb"}),
     "shards[1].node names the node of shards[0]"),
    (lambda d: d["shards"].append({**d["shards"][0], "shard": 2, "file": "shard-2.rdb", "node": "o-2",
                                   "slots": [[5461, 16383]]}), "shards[1].sha256 is the file of shards[0]"),
    (lambda d: d["shards"].append({**d["shards"][0], "shard": 2, "file": "shard-2.rdb", "node": "o-2",
                                   "sha256": "b" * 64, "slots": [[6000, 6001], [5000, 5460]]}),
     "shards[1].slots overlap those of shards[0]"),
    (lambda d: d.update(topology="sentinel", shards=[*d["shards"], {**d["shards"][0], "shard": 2, "node": "o-2",
                        "file": "shard-2.rdb", "sha256": "b" * 64, "slots": []}]), "a sentinel backup holds one"),
])
def test_manifest_damage_is_named(edit, message) -> None:
    data = json.loads(manifest_json(manifest()))
    edit(data)
    with pytest.raises(OpsctlError) as caught:
        parse_manifest(json.dumps(data), "backup/manifest.json")
    assert caught.value.summary.startswith("backup/manifest.json: ") and message in caught.value.summary
    assert "use another backup" in caught.value.hint


# manifest.json as the code before the typed reader (5590220) wrote it: one cluster shard, two databases.
OLD_MANIFEST = """{
  "name": "orders", "topology": "cluster", "flavor": "valkey", "version": "9.1", "rdb_version": 80,
  "created_at": "2026-11-22T23:59:58Z",
  "shards": [{"shard": 1, "node": "o-1", "role": "master", "slots": [[0, 16383]], "file": "shard-1.rdb",
              "bytes": 120, "sha256": "%s", "keys": {"0": 10, "3": 1}, "expires": {"0": 2},
              "keys_at_save": {"0": 11}, "repl_offset": 4242, "saved_at": "2026-11-22T23:59:59Z",
              "dataset_bytes": 5000}],
  "format": 1
}
""" % ("1" * 64)


def test_a_manifest_the_previous_code_wrote_is_read() -> None:
    read = parse_manifest(OLD_MANIFEST, "m.json")
    assert read == manifest(shard(1, role="master", slots=((0, 16383),), sha256="1" * 64, keys={0: 10, 3: 1}))
    assert json.loads(manifest_json(read)) == json.loads(OLD_MANIFEST)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.update(extra=1), "m.json: the manifest has an unknown field 'extra'"),
    (lambda d: d["shards"][0].update(extra=1), "m.json: shards[0] has an unknown field 'extra'"),
    (lambda d: d["shards"].append([]), "m.json: shards[1] is not a JSON object"),
    (lambda d: d["shards"][0]["keys"].update({"0": "x"}), "m.json: shards[0].keys.0 must be int, not str"),
    (lambda d: d["shards"][0].update(slots=[[1, 2, 3]]), "m.json: shards[0].slots[0] expected a list of 2 items"),
])
def test_manifest_fields_are_read_by_their_types(edit, message) -> None:
    data = json.loads(OLD_MANIFEST)
    edit(data)
    with pytest.raises(OpsctlError) as caught:
        parse_manifest(json.dumps(data), "m.json")
    assert caught.value.summary.startswith(message) and caught.value.exit_code == 1


def test_manifest_not_json() -> None:
    with pytest.raises(OpsctlError, match="not valid JSON"):
        parse_manifest("{", "m.json")


def test_rdb_header() -> None:
    assert rdb_header(b"REDIS0010") == ("redis", 10)
    assert rdb_header(b"VALKEY080") == ("valkey", 80)
    assert rdb_header(b"VALKEY08") is None and rdb_header(b"HELLO0010") is None


def test_count_problem_allows_expired_keys_only() -> None:
    entry = shard(keys={0: 10}, expires={0: 2})
    assert count_problem(entry, {0: 10}) is None and count_problem(entry, {0: 8}) is None
    assert "holds 7 keys" in (count_problem(entry, {0: 7}) or "")
    assert "holds 11 keys" in (count_problem(entry, {0: 11}) or "")
    assert "db 3 holds 1 keys" in (count_problem(entry, {0: 10, 3: 1}) or "")


def test_keyspace() -> None:
    assert parse_keyspace({"db0": "keys=3,expires=1,avg_ttl=0", "db12": "keys=5,expires=0", "dbx": "1"}) == \
        {0: (3, 1), 12: (5, 0)}


def test_saver_is_a_linked_replica_else_the_master() -> None:
    members = [Member("m", "h1", "master", True), Member("r1", "h2", "replica", False),
               Member("r2", "h3", "replica", True)]
    assert choose_saver(1, members) == Saver(1, "r2", "h3", "replica", "m")
    assert choose_saver(2, members[:2]).node == "m"


def test_one_fork_per_host_at_a_time() -> None:
    savers = [Saver(i, f"n{i}", host, "replica", "m") for i, host in enumerate(["a", "b", "a", "c", "a", "b"])]
    waves = host_waves(savers)
    assert [[s.shard for s in w] for w in waves] == [[0, 1, 3], [2, 5], [4]]
    assert all(len({s.host for s in w}) == len(w) for w in waves)


def test_scratch_choice_follows_what_the_target_reads() -> None:
    both = [("valkey", (9, 1)), ("redis", (7, 0))]
    assert pick_scratch(both, 10, ("redis", (7, 0)), "b") == ("redis", (7, 0))
    assert pick_scratch(both, 10, ("valkey", (9, 1)), "b") == ("valkey", (9, 1))  # a Redis 7.0 backup into Valkey
    assert pick_scratch(both, 80, None, "b") == ("valkey", (9, 1))
    with pytest.raises(RefusedError, match=r"redis 7\.0 cannot read the backup"):
        pick_scratch(both, 80, ("redis", (7, 0)), "the backup")  # Valkey 9.1 -> Redis 7.0
    with pytest.raises(RefusedError, match="no server here can read"):
        pick_scratch([("redis", (7, 0))], 80, None, "b")


def test_cluster_router_routes_by_slot() -> None:
    view = parse_cluster_nodes(
        "a 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-8000\n"
        "b 127.0.0.1:7002@17002 master - 0 0 2 connected 8001-16383\n")
    router = cluster_router(view, ["127.0.0.1:7002", "127.0.0.1:7001"])
    assert router.target(b"123456789") == 0  # slot 12739 (0x31C3): b at 127.0.0.1:7002, listed first
    assert router.target(b"a") == 0 and router.target(b"b") == 1  # slots 15495 and 3300
    assert router.target(b"{user}:1") == router.target(b"{user}:2")


def test_restore_command_and_payloads() -> None:
    assert restore_command(b"RESTORE", b"k", 0, b"p", False) == [b"RESTORE", b"k", 0, b"p"]
    assert restore_command(b"R", b"k", 17, b"p", True) == [b"R", b"k", 17, b"p", b"REPLACE", b"ABSTTL"]
    body = b"\x00\x03abc"
    assert same_payload(body + b"\x0a\x00" + b"1" * 8, body + b"\x50\x00" + b"2" * 8)
    assert not same_payload(body + b"\x0a\x00" + b"1" * 8, b"\x00\x03abd\x0a\x00" + b"1" * 8)


def test_expiry_from_either_command() -> None:
    assert expiry_of(-2, True, 0, 0) is None and expiry_of(-1, True, 5, 0) == 0
    assert expiry_of(10_000, True, 500, 0) == 9_500  # the source's clock is 500 ms ahead of ours
    assert expiry_of(300, False, 0, 1_000) == 1_300


def test_counts_balance_and_room() -> None:
    counts = Counts({0: 5}, restored=3, existing=1, skipped=1)
    assert counts.balance_problem() is None
    counts.restored = 2
    assert "5 keys read but 4" in (counts.balance_problem() or "")
    mib = 1 << 20
    assert room_problems(100 * mib, [("a", 10 * mib, 0, 1.0)]) == []  # no maxmemory: no limit
    assert room_problems(100 * mib, [("a", 10 * mib, 200 * mib, 0.5), ("b", 10 * mib, 60 * mib, 0.5)]) == \
        ["b: needs about 70 MiB (10 MiB used + 50% of 100 MiB with a 20% margin), maxmemory is 60 MiB"]


def test_landed_keys() -> None:
    counts = Counts({0: 10}, restored=10, volatile=3)
    assert landed_problem(5, 15, counts) is None and landed_problem(5, 12, counts) is None
    assert "at least 12 expected" in (landed_problem(5, 11, counts) or "")


def test_journal_round_trip_and_damage() -> None:
    journal = Journal("backup:/x:2026", "replace", {"shard-1": Counts({0: 4}, 4, 0, 0, 0, [])})
    assert parse_journal(journal_json(journal), "j") == journal
    finished = Journal("backup:/x:2026", "fail-if-exists", {}, finished=True)
    assert parse_journal(journal_json(finished), "j") == finished
    assert not parse_journal('{"source": "s", "mode": "replace", "done": {}}', "j").finished  # written before it
    for text in ("[", '{"source": 1}', '{"source": "s", "mode": "bad", "done": {}}',
                 '{"source": "s", "mode": "replace", "done": {}, "finished": "yes"}',
                 '{"source": "s", "mode": "replace", "done": {"a": {"restored": -1}}}'):
        with pytest.raises(OpsctlError, match=r"^j: "):
            parse_journal(text, "j")


@pytest.mark.integration
@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_db0_counts_from_a_real_file(flavor) -> None:
    from opsctl.backup.rdb import db0_counts
    from opsctl.backup.scratch import scratch_binaries, scratch_server
    from tests.support import unix_client

    binary = next((b for s, b in scratch_binaries().items() if s[0] == flavor), None)
    if binary is None:
        pytest.skip(f"no {flavor} server")
    with scratch_server(binary, None, "empty") as scratch:
        client = unix_client(scratch.socket)  # a test's own client: the scratch's handle speaks raw RESP
        client.execute_command("SAVE")
        assert db0_counts((scratch.folder / "dump.rdb").read_bytes()) == (0, 0)
        client.function_load("#!lua name=lib\nredis.register_function('f', function() return 1 end)")
        for i in range(300):
            client.set(f"k{i}", "x" * (i % 90), px=600_000 if i % 3 == 0 else None)
        client.execute_command("SAVE")
        data = (scratch.folder / "dump.rdb").read_bytes()
        assert db0_counts(data) == (300, 100)
        assert db0_counts(data[:20]) is None  # too short to say
        client.execute_command("SELECT", 1)
        client.execute_command("FLUSHALL")
        client.set("other", 1)
        client.execute_command("SAVE")
        assert db0_counts((scratch.folder / "dump.rdb").read_bytes()) is None  # db 1 first: not db 0's count


def test_two_backups_of_one_second_get_two_folders(tmp_path) -> None:
    from opsctl.backup.save import _free_folder

    first, first_partial = _free_folder(tmp_path, "orders-20261123T020239Z")
    assert first.name == "orders-20261123T020239Z" and first_partial.name == ".orders-20261123T020239Z.partial"
    first.mkdir()
    second, _ = _free_folder(tmp_path, "orders-20261123T020239Z")
    assert second.name == "orders-20261123T020239Z-2"
    (tmp_path / ".orders-20261123T020239Z-2.partial").mkdir()  # a run still writing it
    assert _free_folder(tmp_path, "orders-20261123T020239Z")[0].name == "orders-20261123T020239Z-3"


@pytest.mark.integration
@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_scratch_servers_handle_speaks_the_node_handles_vocabulary(flavor) -> None:
    """A scratch server is read through a node handle on its unix socket (opsctl.net.connection.Connection.on_unix):
    replies parsed by opsctl's facts, a refusal is NodeRefused, a server gone is NodeUnreachable (no client
    library's exception reaches the caller)."""
    from opsctl.backup.scratch import scratch_binaries, scratch_server
    from opsctl.base.errors import NodeRefused, NodeUnreachable

    binary = next((b for s, b in scratch_binaries().items() if s[0] == flavor), None)
    if binary is None:
        pytest.skip(f"no {flavor} server")
    with scratch_server(binary, None, "empty") as scratch:
        assert scratch.keyspace() == {}
        scratch.handle.call("SET", "k", "v", "PX", 600_000)
        assert scratch.keyspace() == {0: (1, 1)}
        with pytest.raises(NodeRefused) as refused:
            scratch.handle.call("NOT-A-COMMAND")
        assert refused.value.code == "ERR"
        scratch.process.kill()
        scratch.process.wait()
        with pytest.raises(NodeUnreachable):
            scratch.handle.call("PING")
        assert not scratch.handle.ping()
