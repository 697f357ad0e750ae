"""Slots no master serves (pure): which they are, who gets them, and the commands that assign them. One decision for
apply's assign-slots and `cluster fix` (opsctl.slots.fix.cover)."""

from __future__ import annotations

import pytest

from opsctl.base.errors import OpsctlError
from opsctl.observe.cluster_state import slot_map, uncovered
from opsctl.observe.replies import ClusterNodeLine, parse_cluster_node_line
from opsctl.server.versions import SUPPORTED, has_capability
from opsctl.slots.coverage import Owners, cover_owners, cover_plan, unreachable_owners, unserved_slots
from opsctl.slots.ranges import expand, slot_command, to_ranges
from opsctl.spec.layout import Layout, Node, Shard

IDS = {name: f"{i:040x}" for i, name in enumerate(["t-1", "t-2", "t-3", "t-4", "t-5", "t-6"], start=1)}
SHARES = {"t-1": "0-5461", "t-2": "5462-10922", "t-3": "10923-16383"}


def line(name: str, slots: str = "", myself: bool = False, master: bool = True) -> ClusterNodeLine:
    flags = ",".join([*(["myself"] if myself else []), "master" if master else "slave"])
    text = f"{IDS[name]} 127.0.0.1:{6000 + int(name[2:])}@16000 {flags} - 0 0 1 connected {slots}"
    return parse_cluster_node_line(text.strip())


def test_a_killed_creation_leaves_unserved_only_the_share_of_the_master_that_had_none() -> None:
    """form-cluster killed while it set the masters up: t-2 and t-3 have their share, t-1 and the replicas none,
    nobody met: every view knows only its own node, no two views agree. The most common view (that of the four
    nodes without slots) shows no slot served: covering by it gave t-1 every slot, t-2's and t-3's too, and with
    the BUMPEPOCH a new owner needs t-1's claim would have won over theirs."""
    views = [[line("t-1", myself=True)], [line("t-2", SHARES["t-2"], myself=True)],
             [line("t-3", SHARES["t-3"], myself=True)], *([line(r, myself=True, master=False)] for r in ("t-4", "t-5"))]
    assert unserved_slots(views) == set(range(0, 5462))
    maps = [slot_map(v) for v in views]
    assert expand(uncovered(max(maps, key=maps.count))) == list(range(16384))  # what the most common view said


def test_a_stale_view_that_misses_an_owner_does_not_make_its_slots_unserved() -> None:
    """t-3 met the others but has not learned t-2's slots yet (or forgot its line): the others' views show them
    served, so nothing is unserved; a slot one view still shows served is never given to a second master."""
    full = [line("t-1", SHARES["t-1"]), line("t-2", SHARES["t-2"]), line("t-3", SHARES["t-3"])]
    stale = [line("t-1", SHARES["t-1"]), line("t-3", SHARES["t-3"], myself=True)]
    assert unserved_slots([full, full, stale]) == set()
    assert unserved_slots([stale, stale]) == set(range(5462, 10923))
    assert unserved_slots([]) == set() and unserved_slots([[], []]) == set()  # no view says nothing


def test_an_unreachable_masters_slots_are_those_any_view_gives_it_and_none_gives_a_master_that_answers() -> None:
    """t-3 does not answer (no view of its own). t-1 lost slot 16383 (DELSLOTS): it is t-3's all the same, as t-2
    says; the most common view could be either, and was t-1's on a tie. t-2's shard failed over to t-5 (its own
    view says so) while t-1 still shows t-2 serving: not lost."""
    t1 = [line("t-1", SHARES["t-1"], myself=True), line("t-2", SHARES["t-2"]), line("t-3", "10923-16382")]
    t2 = [line("t-1", SHARES["t-1"]), line("t-2", SHARES["t-2"], myself=True), line("t-3", SHARES["t-3"])]
    assert unreachable_owners([t1, t2]) == {IDS["t-3"]: list(range(10923, 16384))}
    t5 = [line("t-1", SHARES["t-1"]), line("t-5", SHARES["t-2"], myself=True), line("t-2", master=False),
          line("t-3", SHARES["t-3"])]
    assert unreachable_owners([t1, t5]) == {IDS["t-3"]: list(range(10923, 16384))}
    assert unreachable_owners([t1, t2, [line("t-3", SHARES["t-3"], myself=True)]]) == {}  # every master answers
    assert unreachable_owners([]) == {}


def layout(shards: int) -> Layout:
    """shards shards of a master and one replica: t-1 and t-2, t-3 and t-4, ..."""
    nodes = tuple(Node(f"t-{i}", "h", "127.0.0.1", 6000 + i, "master" if i % 2 else "replica", (i + 1) // 2)
                  for i in range(1, 2 * shards + 1))
    return Layout(nodes, tuple(Shard(s, f"t-{2 * s - 1}", (f"t-{2 * s}",)) for s in range(1, shards + 1)))


def to(name: str) -> Owners:
    """The owners of a caller that gives every slot to one master (apply's assign-slots: the step's master)."""
    return lambda free: dict.fromkeys(free, name)


def given(plan_give: dict[str, list[int]]) -> dict[str, list[tuple[int, int]]]:
    return {name: list(to_ranges(mine)) for name, mine in plan_give.items()}


def test_a_slot_goes_to_the_master_holding_its_keys_only_when_the_caller_follows_keys() -> None:
    """cluster fix follows keys (a slot goes to the master holding keys in it, else to its shard's master by the
    layout); apply's assign-slots does not (its slots go to the shard's master, which the layout says): a slot
    whose keys another master holds is stranded there, which cover refuses."""
    slots = [100, 101, 102]
    keys = {"t-1": {}, "t-3": {100: 3}, "t-5": {}}
    fixed = cover_plan(slots, keys, cover_owners(layout(3), ["t-1", "t-3", "t-5"], {"t-3": 5461}), follow_keys=True)
    assert fixed.give == {"t-3": [100], "t-1": [101, 102]} and fixed.stranded == {}
    assigned = cover_plan(slots, keys, to("t-1"), follow_keys=False)
    assert assigned.give == {"t-1": [100, 101, 102]} and assigned.stranded == {"t-3": [100]}
    own = cover_plan(slots, {"t-1": {101: 1}}, to("t-1"), follow_keys=False)
    assert own.give == {"t-1": [100, 101, 102]} and own.stranded == {}


def test_keys_of_one_slot_on_two_masters_are_stranded_whoever_gets_it() -> None:
    keys = {"t-1": {7: 1}, "t-3": {7: 5}}
    plan = cover_plan([7], keys, cover_owners(layout(2), ["t-1", "t-3"], {}), follow_keys=True)
    assert plan.give == {"t-3": [7]} and plan.stranded == {"t-1": [7]}


def test_cluster_fix_gives_a_killed_creations_unserved_share_to_its_shards_master_as_apply_does() -> None:
    """A creation killed part way: shards 2 and 3's masters (t-3, t-5) have their share, shard 1's master t-1 and
    the three replicas that never ran CLUSTER REPLICATE are masters without slots. cluster fix gave slot 0 to t-1,
    1 to t-2, 2 to t-4, 3 to t-6, 4 to t-1, ... (the fewest slots among every master, counted again after each
    slot): three declared replicas served slots, one BUMPEPOCH each, and the next apply refused ('shard 1 has 2
    masters serving data'). Now shard 1's share goes to shard 1's master now, as apply's assign-slots gives it."""
    shards = layout(3)
    unserved = range(0, 5462)
    plan = cover_plan(unserved, {}, cover_owners(shards, ["t-1", "t-3", "t-5"], {"t-3": 5461, "t-5": 5461}), True)
    assert given(plan.give) == {"t-1": [(0, 5461)]} and plan.stranded == {}
    # keys still decide first: a would-be replica holding keys in a slot gets it, the rest stays whole
    plan = cover_plan(unserved, {"t-4": {9: 1}}, cover_owners(shards, ["t-1", "t-3", "t-5"], {}), True)
    assert given(plan.give) == {"t-1": [(0, 8), (10, 5461)], "t-4": [(9, 9)]}


def test_a_share_whose_shard_has_no_master_goes_whole_to_the_shard_master_with_the_fewest_slots() -> None:
    """Shard 1's master does not answer (or the facts cannot tell which member it is): its share goes, as one
    range, to a shard master, the one with the fewest slots counting what this cover gives (never a replica that
    runs as a master without slots, nor a node outside the layout); several such shares spread."""
    owners = cover_owners(layout(3), [None, "t-3", "t-5"], {"t-3": 5461, "t-5": 5000})
    assert given(cover_plan(range(0, 5462), {}, owners, True).give) == {"t-5": [(0, 5461)]}
    owners = cover_owners(layout(4), [None, None, "t-5", "t-7"], {"t-5": 4096, "t-7": 4096})
    plan = cover_plan([*range(0, 8192), 16000], {}, owners, True)  # 16000: t-7's share, to t-7 first
    assert given(plan.give) == {"t-5": [(0, 4095)], "t-7": [(4096, 8191), (16000, 16000)]}
    with pytest.raises(OpsctlError, match="no shard's master answers"):
        cover_owners(layout(2), [None, None], {})(list(range(10)))


def test_assign_slots_and_cluster_fix_give_a_share_to_the_same_master() -> None:
    """One decision: the shard whose share of the spec's layout holds a slot, to its master now."""
    from opsctl.plan.facts import NodeFacts
    from opsctl.slots.slotplan import assign_steps

    shards = layout(3)
    facts = {"t-3": NodeFacts("t-3", True, cluster_nodes=(line("t-3", "5462-10922", myself=True),))}
    steps = assign_steps(shards, facts, ["t-1", "t-4", "t-5"])  # shard 2 failed over to t-4
    owners = cover_owners(shards, ["t-1", "t-4", "t-5"], {})(list(expand(((0, 5461), (10923, 16383)))))
    assert [(s.node, s.slots) for s in steps] == [("t-1", "0-5461"), ("t-5", "10923-16383")]
    assert {owners[0], owners[5461]} == {"t-1"} and {owners[10923], owners[16383]} == {"t-5"}


def test_slot_assignments_are_one_command_in_the_form_each_supported_version_has() -> None:
    """ADDSLOTSRANGE and DELSLOTSRANGE came with Redis 7.0 (Valkey has them from its first version): Redis 6.2,
    supported, gets ADDSLOTS and DELSLOTS with every slot listed."""
    ranges = [(0, 2), (5, 5)]
    assert slot_command("ADDSLOTS", ranges, True) == ("CLUSTER", "ADDSLOTSRANGE", 0, 2, 5, 5)
    assert slot_command("DELSLOTS", ranges, True) == ("CLUSTER", "DELSLOTSRANGE", 0, 2, 5, 5)
    assert slot_command("ADDSLOTS", ranges, False) == ("CLUSTER", "ADDSLOTS", 0, 1, 2, 5)
    assert slot_command("DELSLOTS", ranges, False) == ("CLUSTER", "DELSLOTS", 0, 1, 2, 5)
    assert (6, 2) in SUPPORTED["redis"] and not has_capability("redis", (6, 2), "slot_range_commands")
    assert has_capability("redis", (7, 0), "slot_range_commands")
    assert all(has_capability("valkey", v, "slot_range_commands") for v in SUPPORTED["valkey"])
