"""The continuous archive's pure parts: segment files (round trip, every tampering refused by name), chains with
holes, the cut at a time (never inside MULTI/EXEC), the RDB's replication position, base choice and retention."""

from __future__ import annotations

import pytest

from opsctl.backup.rdb import repl_position
from opsctl.backup.segment import (
    SegmentName,
    SegmentProblem,
    applied,
    chain,
    cut,
    decode_segment,
    encode_segment,
    parse_name,
)
from opsctl.backup.timeline import (
    DAY,
    Base,
    archive_json,
    base_for,
    base_of,
    group,
    parse_archive,
    parse_time,
    to_prune,
)
from opsctl.base.errors import OpsctlError, RefusedError
from opsctl.stream.framing import Entry, Position

REPLID = "a" * 40


def entries(start: int = 100, at: float = 1000.0) -> list[Entry]:
    commands = [(b"SELECT", b"0"), (b"SET", b"k", b"v"), (b"PING",), (b"MULTI",), (b"INCR", b"n"), (b"EXEC",),
                (b"DEL", b"k\r\n\x00")]
    out, end = [], start
    for i, args in enumerate(commands):
        end += 10 + i
        out.append(Entry(args, end, at + i * 0.1))
    return out


def test_a_segment_round_trips_and_names_itself() -> None:
    name, data = encode_segment(2, REPLID, 100, entries(), closed=1001.0, resumed=True)
    assert parse_name(f"b/stream/shard-2/{name.text}") == name and (name.start, name.end) == (100, entries()[-1].end)
    header, back = decode_segment(name, data, "seg")
    assert back == [Entry(e.args, e.end, round(e.arrived * 1e6) / 1e6) for e in entries()]
    assert (header.shard, header.replid, header.first, header.last, header.resumed) == (2, REPLID, 1000.0, 1000.6,
                                                                                        True)
    assert applied(back) == [e.args for e in entries() if e.args[0] != b"PING"]
    assert parse_name("manifest.json") is None


@pytest.mark.parametrize("damage", ["flip", "cut", "rename", "extend"])
def test_a_tampered_or_cut_segment_is_refused_by_name(damage) -> None:
    name, data = encode_segment(1, REPLID, 100, entries(), closed=1001.0, resumed=False)
    if damage == "flip":
        data = data[:-5] + bytes([data[-5] ^ 1]) + data[-4:]
    elif damage == "cut":
        data = data[: len(data) * 2 // 3]
    elif damage == "rename":
        name = SegmentName(name.start, name.end + 1, name.sha256)
    else:
        data += b"999 1 3\n*0\r\n"
    with pytest.raises(SegmentProblem) as caught:
        decode_segment(name, data, "s3://b/x/seg-1")
    assert caught.value.summary.startswith("s3://b/x/seg-1: ")


def test_chains_refuse_a_hole_and_skip_what_the_base_holds() -> None:
    a, b, c = SegmentName(0, 50, "0" * 64), SegmentName(50, 80, "1" * 64), SegmentName(80, 90, "2" * 64)
    assert chain(50, [c, a, b], "shard 1") == [b, c]
    assert chain(0, [a, b, c], "shard 1") == [a, b, c]
    with pytest.raises(SegmentProblem, match=r"offsets 50\.\.80 are in no segment"):
        chain(0, [a, c], "shard 1")
    with pytest.raises(SegmentProblem, match="hole"):
        chain(40, [b], "shard 1")


def test_the_cut_at_a_time_never_splits_a_transaction() -> None:
    es = entries()  # arrivals 1000.0, .1, .2, .3 MULTI, .4 INCR, .5 EXEC, .6 DEL
    assert cut(es, 999.0) == 0
    assert cut(es, 1000.1) == 2
    assert cut(es, 1000.35) == 3 and cut(es, 1000.45) == 3  # MULTI read, EXEC not: the transaction waits
    assert cut(es, 1000.5) == 6 and cut(es, 2000.0) == 7


def test_the_replication_position_in_an_rdb_head() -> None:
    def aux(key: bytes, value: bytes) -> bytes:
        return b"\xfa" + bytes([len(key)]) + key + bytes([len(value)]) + value
    head = b"REDIS0010" + aux(b"redis-ver", b"7.0.15") + aux(b"repl-id", REPLID.encode())
    assert repl_position(head + b"\xfa\x0brepl-offset\xc1\xbb\x0b\xfe\x00") == (REPLID, 3003)  # 16-bit int encoding
    assert repl_position(head + aux(b"repl-offset", b"123456789012") + b"\xfe\x00") == (REPLID, 123456789012)
    assert repl_position(head + b"\xfe\x00") is None  # a master without a backlog writes none
    assert repl_position(head[:20]) is None


def test_times_are_iso_with_a_zone() -> None:
    assert parse_time("2026-11-27T14:01:00Z") == parse_time("2026-11-27T15:01:00+01:00")
    for bad in ("2026-11-27T14:01:00", "yesterday"):
        with pytest.raises(OpsctlError):
            parse_time(bad)


def _base(name: str, taken: float, archived: bool = True, complete: bool = True) -> Base:
    return Base(name, "orders", taken, complete, {1: Position(REPLID, 5)} if archived else {})


def test_the_base_for_a_time_and_retention() -> None:
    now = 100 * DAY
    bases = [_base("orders-20260101T000000Z", now - 10 * DAY), _base("orders-20260102T000000Z", now - 5 * DAY),
             _base("orders-20260103T000000Z", now - 2 * DAY), _base("orders-20260104T000000Z", now - 1 * DAY, False),
             _base("orders-20260105T000000Z", now - 9 * DAY, complete=False)]
    assert base_for(bases, now - 3 * DAY, "orders", None).name == "orders-20260102T000000Z"
    assert base_for(bases, now, "orders", None).name == "orders-20260103T000000Z"  # plain backups serve no time
    dropped = {b.name for b in to_prune(bases, now, keep_days=3)}
    assert dropped == {"orders-20260101T000000Z", "orders-20260105T000000Z"}  # 0102 serves the cutoff (now - 3d)
    kept = [b for b in bases if b.name not in dropped]
    with pytest.raises(RefusedError, match="dropped by retention"):
        base_for(kept, now - 6 * DAY, "orders", dropped_before=now - 5 * DAY)
    with pytest.raises(RefusedError, match="no archive of orders reaches back"):
        base_for(kept, now - 6 * DAY, "orders", None)
    assert {b.name for b in to_prune(bases, now, keep_days=0)} >= {"orders-20260101T000000Z"}
    assert "orders-20260104T000000Z" not in {b.name for b in to_prune(bases, now + 50 * DAY, 0)}  # the newest stays


def test_archive_descriptions_and_grouping() -> None:
    text = archive_json(1234.5, {2: Position(REPLID, 7), 1: Position(REPLID, 3)})
    assert parse_archive(text, "a") == (1234.5, {1: Position(REPLID, 3), 2: Position(REPLID, 7)})
    with pytest.raises(OpsctlError, match="not an archive description"):
        parse_archive('{"format": 1}', "a")
    names = ["orders-20261127T140000Z/manifest.json", "orders-20261127T140000Z/stream/shard-1/x.seg",
             "retention/orders.json", "stray.txt"]
    grouped = group(names)
    assert list(grouped) == ["orders-20261127T140000Z"]
    base = base_of("orders-20261127T140000Z", grouped["orders-20261127T140000Z"], (99.0, {1: Position(REPLID, 1)}))
    assert base.complete and base.archived and base.taken == 99.0 and base.spec == "orders"


def test_a_topology_change_record_round_trips_and_anything_else_is_refused() -> None:
    from opsctl.backup.timeline import Changed, changed_json, parse_changed

    change = Changed(1000.0, 1002.5, (1, 2, 3), (1, 2, 3, 4))
    assert parse_changed(changed_json(change), "b/changed.json", 2000.0) == change
    assert change.text() == "shards 1, 2, 3 became 1, 2, 3, 4"
    for bad in ('{"format": 2, "until": 1, "seen": 2, "was": [1], "now": [1, 2]}',
                '{"format": 1, "until": 3, "seen": 2, "was": [1], "now": [1, 2]}',  # until after it was seen
                '{"format": 1, "until": NaN, "seen": 2, "was": [1], "now": [1, 2]}',
                '{"format": 1, "until": 1, "seen": 2, "was": [0], "now": [1, 2]}',
                '{"format": 1, "until": 1, "seen": 2, "was": [true], "now": [1, 2]}',
                '{"format": 1, "until": 1, "seen": 1e12, "was": [1], "now": [1, 2]}',
                '{"format": 1, "until": 1, "seen": 2, "was": "1", "now": [1, 2]}', "[]", "{"):
        with pytest.raises(OpsctlError, match=r"b/changed\.json: not a topology change record"):
            parse_changed(bad, "b/changed.json", 2000.0)


def test_the_shards_an_archive_holds_are_the_deployed_ones() -> None:
    import yaml

    from opsctl.backup.follow import deployed_shards
    from opsctl.spec.load import load_spec
    from tests.support import make_spec

    data = make_spec("cluster")
    data["cluster"]["masters"] = 4
    loaded = load_spec(yaml.safe_dump(data), "s.yaml", None)
    members = {s.index: s.members for s in loaded.layout.shards}
    deployed = frozenset(members[1] + members[2] + members[3][:1])
    assert deployed_shards(loaded, deployed) == {1, 2, 3}  # shard 4 named by the spec, not deployed yet
    assert deployed_shards(loaded, deployed | {members[4][1]}) == {1, 2, 3, 4}
    single = load_spec(yaml.safe_dump(make_spec("replication", hosts=2)), "r.yaml", None)
    assert deployed_shards(single, frozenset()) == {1}


def test_the_slots_a_cluster_serves_by_shard() -> None:
    import yaml

    from opsctl.backup.follow import MOVING, slot_map
    from opsctl.observe.replies import parse_cluster_nodes
    from opsctl.spec.load import load_spec
    from tests.support import make_spec

    loaded = load_spec(yaml.safe_dump(make_spec("cluster")), "s.yaml", None)
    masters = [s.master for s in loaded.layout.shards]
    replica = loaded.layout.shards[0].replicas[0]

    def line(node: str, flags: str, slots: str) -> list[object]:
        return parse_cluster_nodes(f"{'a' * 39}1 127.0.0.1:7000@17000 {flags} - 0 0 1 connected {slots}\n")

    whole = {masters[0]: line(masters[0], "myself,master", "0-5460"),
             masters[1]: line(masters[1], "myself,master", "5461-10922"),
             masters[2]: line(masters[2], "myself,master", "10923-16383"),
             replica: line(replica, "myself,slave", "")}
    assert slot_map(loaded, whole) == {1: ((0, 5460),), 2: ((5461, 10922),), 3: ((10923, 16383),)}
    assert slot_map(loaded, {**whole, masters[2]: None}) is None  # a master that does not answer: not known whole
    opened = {**whole, masters[1]: line(masters[1], "myself,master", "5461-10922 [5461->-" + "b" * 40 + "]")}
    assert slot_map(loaded, opened) == MOVING
    twice = {**whole, replica: line(replica, "myself,master", "0-10")}  # a failover under way: two claim shard 1
    assert slot_map(loaded, twice) is None


def test_the_fleet_records_a_change_once_from_the_last_look_that_agreed(tmp_path) -> None:
    """A running archive's fleet (placed by a stand-in for the records): grown from 3 shards to 4, the base is
    recorded as serving up to the last look that still found 3, once; a base taken without the shards it should
    hold serves no time at all."""
    import yaml

    from opsctl.backup.follow import Fleet
    from opsctl.backup.store import FolderStore, parse_location
    from opsctl.backup.timeline import CHANGED, parse_changed
    from opsctl.net.connector import Connector
    from opsctl.spec.load import load_spec
    from tests.support import make_spec

    spec = yaml.safe_dump(make_spec("replication", hosts=2))  # no cluster: no slots asked (no server runs here)

    def place():
        return load_spec(spec, "s.yaml", None), frozenset()

    store = FolderStore(parse_location(str(tmp_path)))
    notes: list[object] = []
    loaded, _ = place()
    fleet = Fleet(Connector(loaded), place, notes.append)
    base = Base("s-20261207T000000Z", "s", 1000.0, True, {1: Position(REPLID, 1)}, ())
    fleet.look(now=True)
    fleet.follow(base, store)
    assert not fleet.changed(store) and fleet.agreed == 1000.0
    fleet.look(now=True)
    agreed = fleet.agreed
    assert agreed > 1000.0 and not fleet.changed(store)
    fleet.shards = frozenset({1, 2, 3, 4})  # as a look after a grow finds them
    assert fleet.changed(store) and fleet.changed(store)
    change = parse_changed((tmp_path / base.name / CHANGED).read_text(), CHANGED)
    assert (change.until, change.was, change.now) == (agreed, (1,), (1, 2, 3, 4)) and len(notes) == 1
    late = Base("s-20261207T000100Z", "s", 2000.0, True, {1: Position(REPLID, 1)}, ())
    fleet.follow(late, store)
    assert fleet.changed(store)
    assert parse_changed((tmp_path / late.name / CHANGED).read_text(), CHANGED).until < late.taken


@pytest.mark.parametrize("refusal", ["stopped", "store"])
def test_a_stop_inside_a_segments_store_write_is_a_stop_not_a_store_failure(refusal) -> None:
    """A SIGTERM that lands while flush() stores a segment (outside a finishing region it raises where the main
    thread is) propagates as Stopped, ending the archive normally; only a failing store is StoreDown. Nothing
    is acknowledged either way: the master's backlog keeps the segment."""
    import signal
    from types import SimpleNamespace

    from opsctl.backup.archive import ShardStream, StoreDown, flush
    from opsctl.base import stop

    raised = stop.Stopped(signal.SIGTERM) if refusal == "stopped" else OpsctlError("the bucket said no")

    class Refusing:  # a store stand-in: its write is where the signal lands (no Redis behaviour)
        def put_bytes(self, name: str, data: bytes) -> None:
            raise raised

    acks: list[int] = []
    link = ShardStream(1, "s-20261207T000000Z", Position(REPLID, 100), pending=[Entry((b"SET", b"k", b"v"), 130, 1.0)])
    link.stream = SimpleNamespace(position=Position(REPLID, 130), ack=acks.append)
    with pytest.raises(stop.Stopped if refusal == "stopped" else StoreDown) as caught:
        flush(Refusing(), link, lambda event: None)
    assert type(caught.value) is (stop.Stopped if refusal == "stopped" else StoreDown)
    assert acks == [] and link.position.offset == 100 and len(link.pending) == 1
