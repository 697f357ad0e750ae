"""Pure parts of slot operations: ranges, weighted balance, reshard picks, batching, journal replay, planning."""

from __future__ import annotations

import json

from opsctl.apply.planfile import parse_plan
from opsctl.observe.replies import SLOTS, parse_cluster_node_line
from opsctl.plan.facts import NodeFacts
from opsctl.plan.steps import CloseSlots, MoveSlots, Plan, RemoveNode
from opsctl.slots.atomic import job_state, parse_migrations, poll_interval, start_commands
from opsctl.slots.balance import Move, balance_moves, pick_slots, split_for_parallel, targets
from opsctl.slots.batching import BIG_KEY_BYTES, batches, closed_first, opened_together, rate_delay, waves
from opsctl.slots.journal import SlotState, decide, parse_lines, pending
from opsctl.slots.progress import SlotsProgress
from opsctl.slots.ranges import count, expand, key_slot, parse, text, to_ranges
from opsctl.slots.slotplan import slot_steps
from opsctl.spec.layout import Layout, Node, Shard


def test_ranges_round_trip():
    assert to_ranges([5, 1, 2, 3, 9]) == ((1, 3), (5, 5), (9, 9))
    assert text(((1, 3), (5, 5))) == "1-3,5" and parse("1-3,5") == ((1, 3), (5, 5))
    assert expand(((0, 2),)) == [0, 1, 2] and count(((0, 9), (20, 20))) == 11


def test_key_slot_is_the_cluster_hash_slot():
    """Issue 34: the slot of a key without redis-py (outside opsctl.net no module imports it), the same as
    redis.crc.key_slot and the server's CLUSTER KEYSLOT (known values), hash tags included."""
    from redis.crc import key_slot as redis_key_slot

    known = {b"foo": 12182, b"bar": 5061, b"{user1000}.following": 3443, b"{user1000}.followers": 3443,
             b"": 0, b"{}x": redis_key_slot(b"{}x"), b"a{b}c{d}": redis_key_slot(b"b")}
    assert {k: key_slot(k) for k in known} == known
    keys = [b"", b"{", b"}", b"{}", b"{}{x}", b"x{y", b"x}y{", b"\xff\x00{\x01}", *(b"k%d" % i for i in range(2000)),
            *(b"{t%d}:%d" % (i % 7, i) for i in range(200))]
    assert [key_slot(k) for k in keys] == [redis_key_slot(k) for k in keys]
    assert all(0 <= key_slot(k) < SLOTS for k in keys)


def test_weighted_targets_sum_to_all_slots():
    assert targets({"a": 1, "b": 1, "c": 1}) == {"a": 5462, "b": 5461, "c": 5461}
    assert targets({"a": 2, "b": 1, "c": 1}, 16) == {"a": 8, "b": 4, "c": 4}
    assert sum(targets({"a": 3, "b": 7, "c": 0.5}).values()) == SLOTS


def _even(n: int) -> dict[str, list[int]]:
    size = SLOTS // n
    return {f"m{i}": list(range(i * size, SLOTS if i == n - 1 else (i + 1) * size)) for i in range(n)}


def test_scale_out_moves_only_into_the_new_master_and_minimally():
    owned = {**_even(3), "m3": []}
    moves = balance_moves(owned, dict.fromkeys(owned, 1.0))
    assert {m.target for m in moves} == {"m3"}
    assert sum(m.slot_count for m in moves) == 4096
    assert all(m.slots[-1][1] in {s[-1] for s in owned.values() if s} for m in moves)  # taken from the top


def test_drain_gives_everything_away_and_balanced_is_a_no_op():
    owned = _even(4)
    moves = balance_moves(owned, {"m0": 1, "m1": 1, "m2": 1})
    assert {m.source for m in moves} == {"m3"} and sum(m.slot_count for m in moves) == len(owned["m3"])
    assert balance_moves(_even(3), {"m0": 1, "m1": 1, "m2": 1}) == []
    skewed = {"a": list(range(0, 8300)), "b": list(range(8300, SLOTS))}
    assert balance_moves(skewed, {"a": 1, "b": 1}, threshold_pct=2) == []
    assert balance_moves(skewed, {"a": 1, "b": 1}, threshold_pct=0)[0].slot_count == 108


def test_weights_and_parallel_rounds():
    moves = balance_moves(_even(2), {"m0": 3, "m1": 1})
    assert moves == [Move("m1", "m0", moves[0].slots)] and moves[0].slot_count == 4096
    rounds = split_for_parallel([Move("a", "b", ()), Move("c", "d", ()), Move("a", "d", ())])
    assert [[(m.source, m.target) for m in r] for r in rounds] == [[("a", "b"), ("c", "d")], [("a", "d")]]


def test_pick_slots_takes_the_highest():
    assert pick_slots(list(range(100)), 10) == ((90, 99),)


def test_batches_by_bytes_big_keys_alone():
    keys = [b"a", b"b", b"big", b"c"]
    out = batches(keys, [3_000_000, 3_000_000, BIG_KEY_BYTES, None])
    assert [b.keys for b in out] == [(b"a",), (b"big",), (b"b", b"c")]
    assert out[1].big and out[1].timeout_ms > out[0].timeout_ms
    assert [len(b.keys) for b in batches([b"k"] * 2500, [10] * 2500)] == [1000, 1000, 500]
    assert rate_delay(1000, 0.5, 1000) == 0.5 and rate_delay(10, 1, None) == 0


def test_journal_replay_leaves_only_unclosed_slots():
    entries = [{"op": "open", "source": "a", "source_id": "A", "target": "b", "target_id": "B",
                "slots": [[0, 9]]},
               {"op": "close", "slots": [[0, 4]]},
               {"op": "open", "source": "c", "source_id": "C", "target": "b", "target_id": "B",
                "slots": [[20, 20]], "mode": "atomic"}]
    left = pending(parse_lines([json.dumps(e) for e in entries], "j"))
    assert [(p.source, p.target, p.slots, p.mode) for p in left] == [
        ("a", "b", ((5, 9),), "keys"), ("c", "b", ((20, 20),), "atomic")]


def test_journal_decisions():
    def state(**kw: object) -> SlotState:
        base = {"source_owns": True, "target_owns": False, "migrating": False, "importing": False,
                "source_keys": 0, "target_keys": 0}
        return SlotState(**{**base, **kw})  # type: ignore[arg-type]

    assert decide(state()) == "none"  # journaled, killed before opening anything
    assert decide(state(importing=True)) == "cancel"
    assert decide(state(importing=True, migrating=True, source_keys=5)) == "finish"
    assert decide(state(importing=True, target_keys=1)) == "finish"  # keys arrived: never go back
    assert decide(state(target_owns=True, migrating=True)) == "assign"
    assert decide(state(source_owns=False, target_owns=True)) == "none"


def test_atomic_job_parsing():
    reply = [["name", "n1", "operation", "EXPORT", "state", "success"],
             ["name", "n2", "operation", "EXPORT", "state", "failed", "message", "boom"]]
    jobs = parse_migrations(reply)
    assert job_state(jobs, {"n2"}) == "done" and job_state(jobs, set()) == "failed: failed boom"
    assert job_state(jobs, {"n1", "n2"}) is None
    assert start_commands("valkey", "T", ((0, 9),))[1] == "source"
    assert start_commands("redis", "T", ((0, 9),)) == (("CLUSTER", "MIGRATION", "IMPORT", 0, 9), "target")


def test_bar_line():
    line = SlotsProgress(50, 100, 10, 2048, 5.0, 2.0, 3.0).line(width=10)
    assert line.startswith("[#####.....] 50/100 slots") and "2.0KiB" in line and "ETA 3s" in line


def _facts(name: str, node_id: str, slots: str, master: bool = True, extra: str = "") -> NodeFacts:
    flags = "myself,master" if master else "myself,slave"
    line = parse_cluster_node_line(f"{node_id} 127.0.0.1:1@2 {flags} - 0 0 1 connected {slots} {extra}".strip())
    return NodeFacts(name, True, cluster_nodes=(line,), info={"db0": "keys=1000,expires=0"})


def _layout(masters: int) -> Layout:
    nodes = tuple(Node(f"t-{i}", "h", "127.0.0.1", 1000 + i, "master", i) for i in range(1, masters + 1))
    return Layout(nodes, tuple(Shard(i, f"t-{i}", ()) for i in range(1, masters + 1)))


def test_planning_scale_out_in_and_open_slots_round_trip_json():
    facts = {"t-1": _facts("t-1", "a" * 40, "0-8191"), "t-2": _facts("t-2", "b" * 40, "8192-16383"),
             "t-3": NodeFacts("t-3", False)}
    steps = slot_steps(_layout(3), facts, ["t-1", "t-2", "t-3"])
    assert all(isinstance(s, MoveSlots) and s.target == "t-3" for s in steps)
    assert sum(s.slot_count for s in steps) == 5461 and "~" in steps[0].reason
    assert parse_plan(Plan("s", "d", "f", (steps[0],)).to_dict(), "test").steps == (steps[0],)
    shrink = slot_steps(_layout(2), facts | {"t-3": _facts("t-3", "c" * 40, "")}, ["t-1", "t-2"])
    assert [type(s) for s in shrink] == [RemoveNode]
    open_ = {**facts, "t-1": _facts("t-1", "a" * 40, "0-8191", extra="[5->-" + "b" * 40 + "]")}
    steps = slot_steps(_layout(3), open_, ["t-1", "t-2", "t-3"])
    assert steps == [CloseSlots("t-1", steps[0].reason, "5")]


def test_waves_double_from_a_small_first_one_and_cover_every_slot_once():
    slots = list(range(100, 1100))
    parts = waves(slots, 64, 512)
    assert [len(p) for p in parts] == [64, 128, 256, 512, 40]
    assert [s for p in parts for s in p] == slots
    assert waves([], 64, 512) == [] and waves([7], 0, 0) == [[7]]


def test_the_first_waves_open_without_waiting_and_full_waves_keep_three_open():
    sizes = [len(p) for p in waves(list(range(5000)), 16, 512)]  # 16, 32, ..., 512, 512, ...
    assert [closed_first(sizes, at, 3 * 512) for at in range(9)] == [0, 0, 0, 0, 0, 0, 0, 5, 6]
    for at in range(len(sizes)):  # never more than 3 * 512 slots open once the wave opens
        assert sum(sizes[closed_first(sizes, at, 3 * 512):at + 1]) <= 3 * 512
    assert closed_first([512] * 6, 5, 3 * 512) == 3 and closed_first([9], 0, 3) == 0


def test_the_small_waves_after_the_first_open_together_within_a_full_waves_slots():
    sizes = [len(p) for p in waves(list(range(5000)), 16, 512)]  # 16, 32, 64, 128, 256, 512, ...
    assert opened_together(sizes, 0, 3 * 512, 512, 0) == 1  # the stream starts with the first wave alone
    assert opened_together(sizes, 1, 3 * 512, 512, 0) == 4  # 32 + 64 + 128 + 256 = 480 slots, one opening
    assert opened_together(sizes, 5, 3 * 512, 512, 0) == 1  # a full wave opens alone
    # a wave that must wait for a close does not join an earlier opening before that close
    assert opened_together([16, 32, 64], 1, 64, 512, 0) == 1
    assert opened_together([16, 32, 64], 1, 64, 512, 1) == 1  # 32 + 64 > 64 open: wave 2 waits for wave 1 too
    assert opened_together([16, 16, 16, 16], 1, 48, 512, 0) == 2  # wave 3 waits for wave 0 to close
    assert opened_together([16, 16, 16, 16], 1, 48, 512, 1) == 3
    for at in range(1, len(sizes)):  # an opening never holds more than the bound on open slots
        count = opened_together(sizes, at, 3 * 512, 512, at)
        assert sum(sizes[closed_first(sizes, at, 3 * 512):at + count]) <= 3 * 512


def test_atomic_jobs_are_polled_often_at_first_then_less_as_they_run_long():
    assert poll_interval(0.0) == 0.002 and poll_interval(0.05) == 0.002  # a short job is seen done within 2 ms
    assert poll_interval(0.25) == 0.005  # a fiftieth of the time so far: at most 2% late
    assert poll_interval(30.0) == 0.01  # never more than 10 ms late: a whole reshard takes about a second
