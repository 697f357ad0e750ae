"""The planner is pure: synthetic facts in, steps out."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from opsctl.apply.planfile import parse_plan
from opsctl.base.errors import RefusedError
from opsctl.observe.cluster_state import even_slot_ranges
from opsctl.observe.replies import ClusterNodeLine, RoleInfo
from opsctl.plan.desired import DesiredNode, desired_nodes
from opsctl.plan.facts import NodeFacts
from opsctl.plan.planner import make_plan
from opsctl.plan.steps import (
    AssignSlots,
    ConfigSet,
    Failover,
    FormCluster,
    JoinCluster,
    MoveSlots,
    Replicate,
    RestartNode,
    StartNode,
    WaitConverged,
)
from opsctl.render import default_paths
from opsctl.spec.deployed import NodeRecord
from opsctl.spec.load import LoadedSpec, load_spec, make_resolver
from tests.support import PASSWORD, make_spec


def loaded_spec(topology: str, **sections) -> LoadedSpec:
    return load_dict(make_spec(topology, **sections))


def load_dict(spec: dict) -> LoadedSpec:
    return load_spec(yaml.safe_dump(spec), "t.yaml", make_resolver({"OPSCTL_TEST_PASSWORD": PASSWORD}, lambda _: None))


def desired(loaded: LoadedSpec) -> dict[str, DesiredNode]:
    return desired_nodes(loaded, lambda n: default_paths("/var/lib/opsctl/t", n), daemonize=True)


def fresh_facts(loaded: LoadedSpec) -> dict[str, NodeFacts]:
    return {n.name: NodeFacts(n.name, running=False) for n in loaded.layout.nodes}


def recorded(want: DesiredNode) -> NodeRecord:
    return NodeRecord(want.digest, tuple(want.directives))


def live_config(want: DesiredNode) -> dict[str, str]:
    return {"maxmemory": "67108864", "maxmemory-policy": "allkeys-lru", "appendonly": "yes"}


def formed_cluster(loaded: LoadedSpec, swap_shard: int | None = None) -> dict[str, NodeFacts]:
    """Facts of a healthy cluster; swap_shard's replica has been failed over to master."""
    layout = loaded.layout
    want = desired(loaded)
    ranges = even_slot_ranges(len(layout.shards))
    ids = {n.name: f"{i:040x}" for i, n in enumerate(layout.servers, start=1)}
    masters = {s.index: (s.replicas[0] if s.index == swap_shard else s.master) for s in layout.shards}
    lines = []
    for shard in layout.shards:
        for name in shard.members:
            node = layout.node(name)
            is_master = name == masters[shard.index]
            lines.append(ClusterNodeLine(
                ids[name], node.address, node.port, node.port + 10000,
                frozenset({"master" if is_master else "slave"}),
                None if is_master else ids[masters[shard.index]], shard.index, "connected",
                (ranges[shard.index - 1],) if is_master else ()))
    facts = {}
    for shard in layout.shards:
        master = layout.node(masters[shard.index])
        for name in shard.members:
            view = tuple(
                ClusterNodeLine(line.id, line.address, line.port, line.bus_port,
                                line.flags | ({"myself"} if line.id == ids[name] else set()), line.master_id,
                                line.config_epoch, line.link_state, line.slots)
                for line in lines)
            if name == masters[shard.index]:
                others = tuple((layout.node(r).address, layout.node(r).port, 100)
                               for r in shard.members if r != name)
                role = RoleInfo("master", 100, replicas=others)
            else:
                role = RoleInfo("replica", 100, (master.address, master.port), "connected")
            facts[name] = NodeFacts(name, True, record=recorded(want[name]), reachable=True,
                                    info={"cluster_state": "ok"}, role=role, cluster_nodes=view,
                                    config=live_config(want[name]))
    return facts


def kinds(plan) -> list[str]:
    return [s.kind for s in plan.steps]


def test_fresh_cluster_is_written_started_and_formed() -> None:
    loaded = loaded_spec("cluster")
    plan = make_plan(loaded, desired(loaded), fresh_facts(loaded), "d")
    assert kinds(plan) == ["write-config", "start"] * 6 + ["form-cluster"]  # it waits until converged
    form = next(s for s in plan.steps if isinstance(s, FormCluster))
    assert len(form.members) == 6


def test_healthy_cluster_has_an_empty_plan_that_says_why() -> None:
    loaded = loaded_spec("cluster")
    plan = make_plan(loaded, desired(loaded), formed_cluster(loaded), "d")
    assert plan.empty
    assert "nothing to do" in plan.notes[0]


def test_a_formed_cluster_that_has_not_settled_yet_is_waited_for() -> None:
    """A run killed after the last mutation of form-cluster left nothing to change, but the cluster still settles
    (a master's first 2 s, gossip): the next apply waits until every node agrees instead of reporting it unhealthy."""
    loaded = loaded_spec("cluster")
    facts = formed_cluster(loaded)
    name = loaded.layout.shards[1].master
    facts[name] = replace(facts[name], info={"cluster_state": "fail"})
    plan = make_plan(loaded, desired(loaded), facts, "d")
    assert [type(s) for s in plan.steps] == [WaitConverged] and name in plan.steps[0].reason


def test_a_replica_not_linked_yet_is_waited_for() -> None:
    """A replica a killed run started a moment ago follows the right master, but its link is not up yet: the next
    apply waits until it is instead of reporting the topology unhealthy."""
    loaded = loaded_spec("replication")
    want, shard = desired(loaded), loaded.layout.shards[0]
    master = loaded.layout.node(shard.master)

    def node_facts(name: str, role: RoleInfo) -> NodeFacts:
        return NodeFacts(name, True, record=recorded(want[name]), reachable=True, role=role,
                         config=live_config(want[name]))

    facts = {shard.master: node_facts(shard.master, RoleInfo("master", 5))}
    facts |= {r: node_facts(r, RoleInfo("replica", 5, (master.address, master.port), "connected"))
              for r in shard.replicas}
    assert make_plan(loaded, want, facts, "d").empty
    linking = shard.replicas[0]
    facts[linking] = node_facts(linking, RoleInfo("replica", 0, (master.address, master.port), "connect"))
    plan = make_plan(loaded, want, facts, "d")
    assert [type(s) for s in plan.steps] == [WaitConverged] and linking in plan.steps[0].reason


def test_after_a_failover_the_plan_stays_empty() -> None:
    loaded = loaded_spec("cluster")
    plan = make_plan(loaded, desired(loaded), formed_cluster(loaded, swap_shard=2), "d")
    assert plan.empty, plan.steps


def test_a_dead_process_is_started_again() -> None:
    loaded = loaded_spec("cluster")
    facts = formed_cluster(loaded)
    name = loaded.layout.shards[0].replicas[0]
    facts[name] = NodeFacts(name, False, "pidfile names dead pid 42", facts[name].record)
    plan = make_plan(loaded, desired(loaded), facts, "d")
    assert [type(s) for s in plan.steps] == [StartNode, WaitConverged]
    assert "dead pid 42" in plan.steps[0].reason


def forgotten(facts: dict[str, NodeFacts], name: str) -> dict[str, NodeFacts]:
    """Every other node FORGOT name (a scale-in removed it); name's own view is its old nodes.conf."""
    gone = facts[name].myself.id
    return {k: v if k == name else replace(v, cluster_nodes=tuple(n for n in v.cluster_nodes if n.id != gone))
            for k, v in facts.items()}


def test_a_node_the_cluster_forgot_joins_again_instead_of_waiting_to_rejoin() -> None:
    """Scale-in removed it (forgotten, stopped, folder kept), the spec adds it again: its record says it ran, but
    the cluster does not know it, so it does not rejoin by itself: it is started, joined and replicated."""
    loaded = loaded_spec("cluster")
    name = loaded.layout.shards[0].replicas[0]
    facts = forgotten(formed_cluster(loaded), name)
    facts[name] = NodeFacts(name, False, "not running (no pidfile)", facts[name].record)
    plan = make_plan(loaded, desired(loaded), facts, "d")
    assert [type(s) for s in plan.steps] == [StartNode, JoinCluster, Replicate, WaitConverged], plan.steps
    assert "forgot" in plan.steps[1].reason


def test_a_running_node_with_a_forgotten_identity_joins_again() -> None:
    """It knows the cluster from its old nodes.conf, the cluster does not know it back (a run killed after it
    started it): it is joined (the executor resets it first)."""
    loaded = loaded_spec("cluster")
    name = loaded.layout.shards[0].replicas[0]
    plan = make_plan(loaded, desired(loaded), forgotten(formed_cluster(loaded), name), "d")
    assert (JoinCluster, name) in [(type(s), s.node) for s in plan.steps], plan.steps


def killed_creation(loaded: LoadedSpec, set_up: set[int]) -> dict[str, NodeFacts]:
    """A creation killed while form-cluster set the masters up: every node runs and knows only itself; the masters
    of the shards in set_up have their share of slots, the others none (nobody met, nobody replicates)."""
    masters = {shard.master for shard in loaded.layout.shards if shard.index in set_up}
    facts = {}
    for name, f in formed_cluster(loaded).items():
        me = f.myself
        assert me is not None
        kept = me.slots if name in masters else ()
        line = replace(me, flags=frozenset({"myself", "master"}), master_id=None, slots=kept)
        facts[name] = replace(f, cluster_nodes=(line,), role=RoleInfo("master"), info={"cluster_state": "fail"})
    return facts


def test_a_creation_killed_before_every_master_had_its_slots_assigns_the_rest_instead_of_moving_slots() -> None:
    """CI (test_apply_create_faults[answering]): killed while form-cluster set the masters up, shards 2 and 3 with
    their slots, shard 1's master without any, nobody met. The next plan moved slots from shards 2 and 3 into
    shard 1's master as if it were a new shard (and waited 60 s for a cluster whose 5462 unassigned slots nobody
    would ever serve). Unserved slots go to the master of the shard whose share of the layout holds them."""
    loaded = loaded_spec("cluster")
    first = loaded.layout.shards[0].master
    plan = make_plan(loaded, desired(loaded), killed_creation(loaded, {2, 3}), "d")
    assert "move-slots" not in kinds(plan), plan.steps
    assign = [s for s in plan.steps if isinstance(s, AssignSlots)]
    assert [(s.node, s.slots, s.slot_count) for s in assign] == [(first, "0-5461", 5462)], plan.steps
    assert "no master serves slots 0-5461" in assign[0].reason and "shard 1's share" in assign[0].reason
    joined = {s.node for s in plan.steps if isinstance(s, JoinCluster)}
    assert joined == {n.name for n in loaded.layout.servers} - {loaded.layout.shards[1].master}  # via it
    assert kinds(plan)[-2:] == ["assign-slots", "wait-converged"] and kinds(plan).count("replicate") == 3
    only_last = make_plan(loaded, desired(loaded), killed_creation(loaded, {3}), "d")
    assert [(s.node, s.slots) for s in only_last.steps if isinstance(s, AssignSlots)] == \
        [(first, "0-5461"), (loaded.layout.shards[1].master, "5462-10922")]
    assert "move-slots" not in kinds(only_last)


def test_unserved_slots_count_as_assigned_when_a_new_shard_is_balanced() -> None:
    """The spec grew a shard after the killed creation: the unserved slots go to the shards whose share of the new
    layout holds them, and the new, empty shard master gets its share by moves from the masters that hold slots."""
    spec = make_spec("cluster")
    facts = killed_creation(load_dict(spec), {2, 3})
    more = load_dict({**spec, "cluster": {**spec["cluster"], "masters": 4}})
    plan = make_plan(more, desired(more), {**fresh_facts(more), **facts}, "d")
    shards = more.layout.shards
    assert [(s.node, s.slots) for s in plan.steps if isinstance(s, AssignSlots)] == \
        [(shards[0].master, "0-4095"), (shards[1].master, "4096-5461")]
    moves = [s for s in plan.steps if isinstance(s, MoveSlots)]
    assert {s.target for s in moves} == {shards[3].master} and sum(s.slot_count for s in moves) == 4096, moves


def test_a_down_shard_the_cluster_still_knows_rejoins_by_itself() -> None:
    loaded = loaded_spec("cluster")
    facts = formed_cluster(loaded)
    for name in loaded.layout.shards[1].members:
        facts[name] = NodeFacts(name, False, "not running (no pidfile)", facts[name].record)
    plan = make_plan(loaded, desired(loaded), facts, "d")
    assert kinds(plan)[:2] == ["start", "start"] and not {"join-cluster", "replicate"} & set(kinds(plan)), kinds(plan)
    assert "move-slots" not in kinds(plan) and plan.replan, kinds(plan)  # its master only looks empty while down


def test_a_stopped_cluster_is_started_not_formed_again() -> None:
    """Every node is down with its record (and its nodes.conf): start them all, observe again, form nothing."""
    loaded = loaded_spec("cluster")
    facts = {k: NodeFacts(k, False, "not running (no pidfile)", v.record) for k, v in formed_cluster(loaded).items()}
    plan = make_plan(loaded, desired(loaded), facts, "d")
    assert set(kinds(plan)) == {"start"} and len(plan.steps) == 6 and plan.replan, kinds(plan)
    assert "observes again" in plan.notes[0]


def test_a_down_master_whose_replica_took_over_needs_no_second_round() -> None:
    """The shard still serves its slots (the replica was promoted): the old master restarts as a replica now."""
    loaded = loaded_spec("cluster")
    shard = loaded.layout.shards[1]
    facts = formed_cluster(loaded, swap_shard=shard.index)
    name = shard.master
    facts[name] = NodeFacts(name, False, "not running (no pidfile)", facts[name].record)
    plan = make_plan(loaded, desired(loaded), facts, "d")
    assert kinds(plan) == ["start", "wait-converged"] and not plan.replan, kinds(plan)


def test_live_drift_of_a_settable_directive_is_a_config_set() -> None:
    loaded = loaded_spec("cluster")
    facts = formed_cluster(loaded)
    name = loaded.layout.shards[0].master
    f = facts[name]
    facts[name] = NodeFacts(name, True, record=f.record, reachable=True, info=f.info, role=f.role,
                            cluster_nodes=f.cluster_nodes, config={**f.config, "maxmemory": "1000"})
    plan = make_plan(loaded, desired(loaded), facts, "d")
    assert [type(s) for s in plan.steps] == [ConfigSet, WaitConverged]
    assert plan.steps[0].directive == "maxmemory" and plan.steps[0].value == "64mb"


def test_a_spec_change_of_a_settable_directive_writes_the_file_and_sets_it_live() -> None:
    spec = make_spec("cluster")
    before = load_dict(spec)
    after = load_dict({**spec, "memory": {**spec["memory"], "maxmemory": "96mb"}})
    facts = formed_cluster(before)
    facts = {k: NodeFacts(k, True, record=replace(recorded(desired(before)[k]), digest="old"), reachable=True,
                          info=v.info, role=v.role, cluster_nodes=v.cluster_nodes, config=v.config)
             for k, v in facts.items()}
    plan = make_plan(after, desired(after), facts, "d")
    assert kinds(plan) == ["write-config", "config-set"] * 6 + ["wait-converged"]


def with_record(facts: dict[str, NodeFacts], change) -> dict[str, NodeFacts]:
    """The same facts, each node's record changed by change(directives) and marked as older."""
    return {k: NodeFacts(k, True, record=replace(v.record, digest="old",
                                                 directives=tuple(map(tuple, change(list(v.record.directives))))),
                         reachable=True, info=v.info, role=v.role, cluster_nodes=v.cluster_nodes, config=v.config)
            for k, v in facts.items()}


def daemonized_differently(directives):
    return [[k, "no" if k == "daemonize" else v] for k, v in directives]


def test_a_restart_change_rolls_shard_by_shard_with_a_failover_before_each_master_restart() -> None:
    loaded = loaded_spec("cluster")
    plan = make_plan(loaded, desired(loaded), with_record(formed_cluster(loaded), daemonized_differently), "d")
    rolling = [(s.kind, s.node) for s in plan.steps]
    expected = []
    for shard in loaded.layout.shards:
        replica, master = shard.replicas[0], shard.master
        expected += [("write-config", replica), ("restart", replica),
                     ("failover", master), ("write-config", master), ("restart", master)]
    assert rolling == [*expected, ("wait-converged", loaded.layout.nodes[0].name)]
    assert not any(getattr(s, "needs_downtime", False) for s in plan.steps)


def in_every_view(facts: dict[str, NodeFacts], name: str, change) -> dict[str, NodeFacts]:
    """The same facts, name's line changed by change(line) in every node's view."""
    me = facts[name].myself
    assert me is not None
    return {k: replace(f, cluster_nodes=tuple(change(line) if line.id == me.id else line
                                              for line in f.cluster_nodes or ())) for k, f in facts.items()}


def test_a_killed_runs_slot_repairs_run_alone_before_a_restarts_failovers() -> None:
    """A move killed part way (slot 5 open from shard 1's master to shard 2's), then a restart-only change: the
    failover before shard 1's master's restart refuses while a slot is open (no-open-slots), and close-slots came
    after every restart: on real servers the failover step timed out after 60 s. Closing decides who serves the
    slot (a new shard's empty master that gets it takes writes, and its restart planned before needs a failover
    now), so the repairs run alone and apply plans the rest after them. Unserved slots likewise: assign-slots names
    the master of plan time, which a failover makes a replica."""
    loaded = loaded_spec("cluster")
    shards = loaded.layout.shards
    facts = formed_cluster(loaded)
    source, target = (facts[s.master].myself for s in shards[:2])
    assert source is not None and target is not None
    facts = in_every_view(facts, shards[0].master, lambda line: replace(line, migrating={5: target.id}))
    facts = in_every_view(facts, shards[1].master, lambda line: replace(line, importing={5: source.id}))
    plan = make_plan(loaded, desired(loaded), with_record(facts, daemonized_differently), "d")
    assert [(s.kind, s.node) for s in plan.steps] == [("close-slots", shards[0].master)] and plan.replan, plan.steps
    assert "repaired first" in plan.notes[0]

    unserved = in_every_view(formed_cluster(loaded), shards[2].master, lambda line: replace(line, slots=()))
    plan = make_plan(loaded, desired(loaded), with_record(unserved, daemonized_differently), "d")
    assert [(s.kind, s.node, s.slots) for s in plan.steps if isinstance(s, AssignSlots)] == \
        [("assign-slots", shards[2].master, "10923-16383")] and len(plan.steps) == 1 and plan.replan, plan.steps

    renamed = with_record(facts, lambda ds: [d for d in ds if d[0] != "rename-command"])  # no failover: the close
    plan = make_plan(loaded, desired(loaded), renamed, "d")  # after the restarts, then apply plans again
    assert kinds(plan)[-2:] == ["close-slots", "wait-converged"] and plan.replan, kinds(plan)


def partly_filled(loaded: LoadedSpec, taken: int) -> dict[str, NodeFacts]:
    """A 4-master cluster whose 4th shard's master took the top `taken` of shard 1's slots (a scale-out from 3
    masters stopped after its first moves); the other shards keep their 3-master share."""
    shards = loaded.layout.shards
    ranges = even_slot_ranges(3)
    slots = {1: ((0, ranges[0][1] - taken),), 2: (ranges[1],), 3: (ranges[2],),
             4: ((ranges[0][1] - taken + 1, ranges[0][1]),)}
    facts = formed_cluster(loaded)
    for shard in shards:
        facts = in_every_view(facts, shard.master, lambda line, s=shard.index: replace(line, slots=slots[s]))
    return facts


def test_a_scale_out_an_apply_did_not_finish_is_filled_to_its_share_and_a_manual_reshard_is_left_alone() -> None:
    """A scale-out (3 -> 4 masters) killed during its moves: the journal's fill entry names shard 4, which holds
    what moved before the kill (16 slots). The moves went only into masters holding no slot, so the next apply
    closed the open slots and planned nothing more: shard 4 kept 16 slots. With the fill open, apply plans the
    rest of its share; without one (a reshard by hand gave it those slots) nothing moves."""
    spec = make_spec("cluster")
    loaded = load_dict({**spec, "cluster": {**spec["cluster"], "masters": 4}})
    shards = loaded.layout.shards
    facts = partly_filled(loaded, 16)
    plan = make_plan(loaded, desired(loaded), facts, "d", filling=[4])
    moves = [s for s in plan.steps if isinstance(s, MoveSlots)]
    assert {(s.target, s.fills) for s in moves} == {(shards[3].master, 4)}, plan.steps
    assert sum(s.slot_count for s in moves) == 4096 - 16 and "not at its share" in moves[0].reason
    assert make_plan(loaded, desired(loaded), facts, "d").empty  # no fill open: a reshard by hand

    balanced = partly_filled(loaded, 0)  # shard 4 at its share (4096 slots, the others 4096 each)
    share = {shard.index: ((4096 * (shard.index - 1), 4096 * shard.index - 1),) for shard in shards}
    for shard in shards:
        balanced = in_every_view(balanced, shard.master, lambda line, s=shard.index: replace(line, slots=share[s]))
    assert make_plan(loaded, desired(loaded), balanced, "d", filling=[4]).empty
    assert make_plan(loaded, desired(loaded), facts, "d", filling=[5]).empty  # a shard the spec no longer has


def test_a_scale_outs_open_slots_are_closed_alone_then_apply_plans_the_rest_of_its_moves() -> None:
    """Killed with a wave open: closing it changes what shard 4 holds, so the close runs alone (replan) and the
    moves are planned from what it leaves; without a fill open, the close is planned as before."""
    spec = make_spec("cluster")
    loaded = load_dict({**spec, "cluster": {**spec["cluster"], "masters": 4}})
    shards = loaded.layout.shards
    facts = partly_filled(loaded, 16)
    source, target = (facts[shards[i].master].myself for i in (0, 3))
    assert source is not None and target is not None
    facts = in_every_view(facts, shards[0].master, lambda line: replace(line, migrating={5444: target.id}))
    facts = in_every_view(facts, shards[3].master, lambda line: replace(line, importing={5444: source.id}))
    plan = make_plan(loaded, desired(loaded), facts, "d", filling=[4])
    assert kinds(plan) == ["close-slots"] and plan.replan and "scale-out" in plan.notes[0], plan
    plan = make_plan(loaded, desired(loaded), facts, "d")
    assert kinds(plan) == ["close-slots", "wait-converged"] and plan.replan, kinds(plan)


def test_a_scale_ins_open_slots_are_closed_then_apply_plans_its_drain_again() -> None:
    """A scale-in (4 -> 3 masters) killed with a wave of its drain open: the plan closes it and moves nothing (the
    moves are planned once nothing is open), then waits, and apply plans the drain from what closing leaves
    (replan); it ended there before, leaving the drain to another apply."""
    spec = make_spec("cluster")
    four, three = load_dict({**spec, "cluster": {**spec["cluster"], "masters": 4}}), load_dict(spec)
    facts = formed_cluster(four)
    leaving, staying = four.layout.shards[3].master, three.layout.shards[0].master
    source, target = facts[leaving].myself, facts[staying].myself
    assert source is not None and target is not None
    facts = in_every_view(facts, leaving, lambda line: replace(line, migrating={13000: target.id}))
    facts = in_every_view(facts, staying, lambda line: replace(line, importing={13000: source.id}))
    plan = make_plan(three, desired(three), facts, "d")
    assert kinds(plan) == ["close-slots", "wait-converged"] and plan.replan, kinds(plan)
    assert "scale-in" in plan.notes[0], plan.notes


def test_a_rename_change_restarts_every_node_in_place_and_needs_downtime_consent() -> None:
    loaded = loaded_spec("cluster")
    facts = with_record(formed_cluster(loaded), lambda ds: [d for d in ds if d[0] != "rename-command"])
    plan = make_plan(loaded, desired(loaded), facts, "d")
    assert not any(isinstance(s, Failover) for s in plan.steps)
    restarts = [s for s in plan.steps if isinstance(s, RestartNode)]
    assert len(restarts) == 6 and [r.needs_downtime for r in restarts] == [False, True] * 3


def test_an_unfinished_restart_from_an_earlier_apply_is_planned_again() -> None:
    loaded = loaded_spec("cluster")
    facts = formed_cluster(loaded)
    name = loaded.layout.shards[0].replicas[0]
    f = facts[name]
    facts[name] = NodeFacts(name, True, record=replace(f.record, pending_restart=True), reachable=True, info=f.info,
                            role=f.role, cluster_nodes=f.cluster_nodes, config=f.config)
    steps = make_plan(loaded, desired(loaded), facts, "d").steps
    assert next((s.kind, s.node) for s in steps) == ("restart", name)


def test_a_master_without_persistence_is_not_restarted_over_replicas_that_hold_data() -> None:
    loaded = loaded_spec("replication", persistence={"aof": "off", "rdb": []})
    shard = loaded.layout.shards[0]
    want = desired(loaded)
    master = loaded.layout.node(shard.master)
    facts = {shard.master: NodeFacts(shard.master, False, "died", recorded(want[shard.master]))}
    for name in shard.replicas:
        facts[name] = NodeFacts(name, True, record=recorded(want[name]), reachable=True,
                                info={"db0": "keys=100,expires=0"},
                                role=RoleInfo("replica", 50, (master.address, master.port), "connecting"),
                                config=live_config(want[name]))
    with pytest.raises(RefusedError, match="come back empty"):
        make_plan(loaded, want, facts, "d")


def test_a_master_without_a_replica_still_needs_downtime() -> None:
    loaded = loaded_spec("cluster", cluster={"replicas_per_master": 0})
    facts = formed_cluster(loaded)
    changed = {k: NodeFacts(k, True, record=NodeRecord("old", tuple(
        d for d in v.record.directives if d[0] != "rename-command")), reachable=True, info=v.info,
        role=v.role, cluster_nodes=v.cluster_nodes, config=v.config) for k, v in facts.items()}
    restarts = [s for s in make_plan(loaded, desired(loaded), changed, "d").steps if isinstance(s, RestartNode)]
    assert restarts and all(r.needs_downtime for r in restarts)


def test_a_server_upgrade_rolls_and_a_downgrade_is_refused() -> None:
    loaded = loaded_spec("cluster")  # valkey 9.1
    facts = formed_cluster(loaded)
    old = {k: NodeFacts(k, True, record=v.record, reachable=True,
                        info={**v.info, "redis_version": "7.0.15"}, role=v.role,
                        cluster_nodes=v.cluster_nodes, config=v.config) for k, v in facts.items()}
    plan = make_plan(loaded, desired(loaded), old, "d")
    reasons = {s.reason for s in plan.steps if isinstance(s, RestartNode)}
    assert reasons == {"server redis 7.0 -> valkey 9.1"}
    down = load_dict({**make_spec("cluster"), "server": {"flavor": "redis", "version": "7.0"}})
    newer = {k: NodeFacts(k, True, record=v.record, reachable=True,
                          info={**v.info, "server_name": "valkey", "valkey_version": "9.1.2"}, role=v.role,
                          cluster_nodes=v.cluster_nodes, config=v.config) for k, v in formed_cluster(down).items()}
    with pytest.raises(RefusedError, match=r"from valkey 9\.1 to redis 7\.0") as refused:
        make_plan(down, desired(down), newer, "d")
    assert "cannot load the RDB format 80" in refused.value.detail


def test_fresh_replication_starts_all_then_points_replicas_at_the_master() -> None:
    loaded = loaded_spec("replication")
    plan = make_plan(loaded, desired(loaded), fresh_facts(loaded), "d")
    replicate = [s for s in plan.steps if isinstance(s, Replicate)]
    assert [(s.node, s.master) for s in replicate] == [(n, loaded.layout.shards[0].master)
                                                       for n in loaded.layout.shards[0].replicas]


def test_a_second_master_holding_data_is_refused_not_overwritten() -> None:
    loaded = loaded_spec("replication")
    shard = loaded.layout.shards[0]
    want = desired(loaded)
    master, other = shard.master, shard.replicas[0]
    facts = fresh_facts(loaded)
    for name in (master, other):
        facts[name] = NodeFacts(name, True, record=recorded(want[name]), reachable=True,
                                info={"db0": "keys=10,expires=0"}, role=RoleInfo("master", 5),
                                config=live_config(want[name]))
    with pytest.raises(RefusedError, match="holding 10 keys"):
        make_plan(loaded, want, facts, "d")


def test_plan_round_trips_through_json() -> None:
    loaded = loaded_spec("sentinel")
    plan = make_plan(loaded, desired(loaded), fresh_facts(loaded), "d")
    again = parse_plan(plan.to_dict(), "test")
    assert again == plan
    assert PASSWORD not in str(plan.to_dict())


def test_a_config_entry_that_overrides_a_rendered_directive_keeps_one_line() -> None:
    loaded = loaded_spec("standalone", config={"tcp-backlog": 256, "hz": 20})
    lines = [d for d in desired(loaded)[loaded.layout.nodes[0].name].directives if d[0] in ("tcp-backlog", "hz")]
    assert lines == [("tcp-backlog", "256"), ("hz", "20")]


def test_a_spec_that_makes_a_deployed_node_another_node_is_refused() -> None:
    """replicas_per_master 1 -> 2 renumbers: t-3 (shard 2 master on h2) would become shard 1's second replica
    on h3. Compared with the record of what each node was deployed as; a failed-over shard is no change."""
    from opsctl.spec.deployed import DeployedAs

    spec = make_spec("cluster")
    loaded = load_dict(spec)
    facts = {k: replace(f, record=replace(f.record, deployed=DeployedAs.of(loaded.layout.node(k))))
             for k, f in formed_cluster(loaded, swap_shard=loaded.layout.shards[0].index).items()}
    assert make_plan(loaded, desired(loaded), facts, "d").steps == ()
    wider = load_dict({**spec, "cluster": {**spec["cluster"], "replicas_per_master": 2}})
    with pytest.raises(RefusedError, match="changes what") as refused:
        make_plan(wider, desired(wider), {**fresh_facts(wider), **facts}, "d")
    third = f"{spec['name']}-3"
    assert f"{third}: deployed as shard 2 master on h2" in refused.value.detail, refused.value.detail
    assert "shard 1 replica on h3" in refused.value.detail and "replicas_per_master" in refused.value.hint
    more = load_dict({**spec, "cluster": {**spec["cluster"], "masters": 4}})  # adding shards is no change
    assert "move-slots" in kinds(make_plan(more, desired(more), {**fresh_facts(more), **facts}, "d"))


def test_nodes_inside_the_ephemeral_port_range_are_named_in_a_warning(tmp_path) -> None:
    from opsctl.apply.planning import ephemeral_port_warning
    from opsctl.providers.proc import ephemeral_port_range

    loaded = loaded_spec("cluster")
    first = loaded.layout.servers[0].port
    assert ephemeral_port_warning(loaded, 40000, 40001 if first != 40000 else 40002) is None
    warning = ephemeral_port_warning(loaded, first + 10000, first + 10001)  # the first two cluster bus ports
    assert warning is not None
    assert warning.startswith(f"{loaded.layout.servers[0].name} ({first + 10000}), "
                              f"{loaded.layout.servers[1].name} ({first + 10001}) listen inside")
    assert f"and {len(loaded.layout.nodes) - 3} more listen" in (ephemeral_port_warning(loaded, 1, 65535) or "")
    for text, expected in [("32768\t60999\n", (32768, 60999)), ("60999 32768", None), ("1 2 3", None), ("", None),
                           ("0 10", None), ("x y", None)]:
        (tmp_path / "range").write_text(text)
        assert ephemeral_port_range(tmp_path / "range") == expected
    assert ephemeral_port_range(tmp_path / "missing") is None


def test_a_refusal_after_steps_ran_is_no_longer_nothing_changed() -> None:
    from opsctl.apply.executor import changed_anyway
    from opsctl.base.errors import EXIT_ERROR, EXIT_REFUSED, OpsctlError, RefusedError

    refused = RefusedError("step 3/5 (replicate t-4 -> t-1) failed: t-1 is a replica now", "detail", "point it")
    assert changed_anyway(refused, 0) is refused and refused.exit_code == EXIT_REFUSED
    after = changed_anyway(refused, 2)
    assert after.exit_code == EXIT_ERROR and "after 2 step(s) of this run had changed the topology" in after.summary
    assert after.detail == "detail" and after.hint == "point it; apply again plans from the state now"
    other = OpsctlError("step 3/5 failed: timed out")
    assert changed_anyway(other, 2) is other


def test_a_nodes_own_line_is_read_once_and_follows_its_view() -> None:
    """NodeFacts.myself is cached (the planner asks it many times at 1000 nodes); a copy with another view (replace)
    finds its own line again, and the cache does not change equality."""
    loaded = loaded_spec("cluster")
    facts = formed_cluster(loaded)
    name = loaded.layout.servers[0].name
    first = facts[name]
    assert first.myself is first.myself and first.myself is not None and first.myself.is_myself
    other = facts[loaded.layout.servers[1].name]
    moved = replace(first, cluster_nodes=other.cluster_nodes)
    assert moved.myself == other.myself != first.myself
    fresh = replace(first)
    assert fresh == first and "myself" not in vars(fresh)
    assert replace(first, cluster_nodes=None).myself is None
