"""The plan reads like Terraform's (issue 25, convention 11): each shard's master before its replicas where the
order is free (files and starts, which apply runs side by side), and each changed setting as before -> after, a
secret only as a verdict or ***, never its value and never a digest. Pure: synthetic facts."""

from __future__ import annotations

import dataclasses
import json

import pytest

from opsctl.apply.planfile import parse_plan
from opsctl.apply.planning import plan_text
from opsctl.base.secrets import MASK
from opsctl.plan.desired import DIFFERS
from opsctl.plan.facts import NodeFacts
from opsctl.plan.planner import make_plan
from opsctl.plan.steps import NODE_LOCAL, ConfigSet, Plan, WriteConfig
from opsctl.spec.deployed import NodeRecord
from opsctl.spec.load import LoadedSpec
from tests.support import PASSWORD, make_spec
from tests.test_plan_drift import _disk_of
from tests.test_planner import desired, formed_cluster, fresh_facts, load_dict, loaded_spec, recorded


def _first_line(text: str, node: str) -> int:
    return next(i for i, line in enumerate(text.splitlines()) if line.rstrip().endswith(f" {node}"))


@pytest.mark.parametrize("topology", ["cluster", "replication", "sentinel"])
def test_a_new_fleet_lists_each_master_before_its_replicas(topology: str) -> None:
    loaded = loaded_spec(topology)
    plan = make_plan(loaded, desired(loaded), fresh_facts(loaded), "d")
    text = plan_text(plan)
    for shard in loaded.layout.shards:
        for replica in shard.replicas:
            assert _first_line(text, shard.master) < _first_line(text, replica), text


def test_masters_first_moves_nothing_out_of_its_side_by_side_run() -> None:
    """The reordered steps stay inside one run of node-local steps: apply runs the same waves as before."""
    loaded = loaded_spec("cluster")
    steps = make_plan(loaded, desired(loaded), fresh_facts(loaded), "d").steps
    local = [isinstance(s, NODE_LOCAL) for s in steps]
    assert local == sorted(local, reverse=True)  # one block of files and starts, then form-cluster


def _changed_memory(spec: dict) -> tuple[LoadedSpec, dict[str, NodeFacts]]:
    before = load_dict(spec)
    after = load_dict({**spec, "memory": {**spec["memory"], "maxmemory": "96mb"}})
    facts = {k: dataclasses.replace(v, record=dataclasses.replace(recorded(desired(before)[k]), digest="old"))
             for k, v in formed_cluster(before).items()}
    return after, facts


def test_a_changed_setting_shows_before_and_after() -> None:
    loaded, facts = _changed_memory(make_spec("cluster"))
    plan = make_plan(loaded, desired(loaded), facts, "d")
    text = plan_text(plan)
    writes = [s for s in plan.steps if isinstance(s, WriteConfig)]
    assert writes and all(s.changes == (("maxmemory", "64mb", "96mb"),) for s in writes)
    assert text.count("       maxmemory: 64mb -> 96mb") == len(writes), text
    sets = [s for s in plan.steps if isinstance(s, ConfigSet)]
    assert sets and all(s.before == "67108864" and s.value == "96mb" for s in sets)
    assert f"config-set {sets[0].node} maxmemory 67108864 -> 96mb" in text
    assert plan.steps[0].node == loaded.layout.shards[0].replicas[0]  # a rolling change keeps replicas first


def test_a_file_drifted_on_disk_shows_what_the_file_says() -> None:
    loaded = loaded_spec("cluster")
    name = loaded.layout.servers[0].name
    facts = {n: dataclasses.replace(f, on_disk=_disk_of(loaded, n)) for n, f in formed_cluster(loaded).items()}
    facts[name] = dataclasses.replace(facts[name], on_disk={**_disk_of(loaded, name),
                                                            "maxmemory-policy": "allkeys-random",
                                                            "masterauth": DIFFERS})
    plan = make_plan(loaded, desired(loaded), facts, "d")
    write = plan.steps[0]
    assert isinstance(write, WriteConfig) and dict((n, (b, a)) for n, b, a in write.changes) == {
        "maxmemory-policy": ("allkeys-random", "allkeys-lru"), "masterauth": (DIFFERS, MASK)}
    assert f"masterauth: {DIFFERS} -> {MASK}" in plan_text(plan)


def test_a_secret_changes_as_a_verdict_never_its_value() -> None:
    spec = make_spec("replication")
    loaded = load_dict(spec)
    want = desired(loaded)
    facts = {}
    for node in loaded.layout.servers:
        recorded_directives = [(k, PASSWORD if k in ("requirepass", "masterauth") else v)  # a record gone wrong
                               for k, v in recorded(want[node.name]).directives]
        facts[node.name] = NodeFacts(node.name, True, record=NodeRecord("old", tuple(recorded_directives)),
                                     reachable=True, config={"masterauth": DIFFERS, "requirepass": MASK})
    plan = make_plan(loaded, want, facts, "d")
    text = plan_text(plan)
    dumped = json.dumps(plan.to_dict())
    assert PASSWORD not in text and PASSWORD not in dumped
    assert f"masterauth {DIFFERS} -> {MASK}" in text, text
    assert f"masterauth: {MASK} -> {MASK}" not in text  # the digest changed, the masked value did not: no line


def test_a_setting_that_left_the_spec_shows_its_way_back_to_the_default() -> None:
    loaded = loaded_spec("standalone")
    want = desired(loaded)
    name = loaded.layout.servers[0].name
    record = NodeRecord("old", (*want[name].directives, ("hz", "20")))
    facts = {name: NodeFacts(name, True, record=record, reachable=True,
                             config={"maxmemory": "67108864", "maxmemory-policy": "allkeys-lru", "hz": "20"})}
    plan = make_plan(loaded, want, facts, "d")
    text = plan_text(plan)
    assert "       hz: 20 -> (unset)" in text and f"config-set {name} hz 20 -> \"10\"" in text, text


def test_the_changes_survive_the_plan_file() -> None:
    loaded, facts = _changed_memory(make_spec("cluster"))
    plan = make_plan(loaded, desired(loaded), facts, "d")
    again = parse_plan(json.loads(json.dumps(plan.to_dict())), "t")
    assert isinstance(again, Plan) and again == plan


def _recorded_with(loaded: LoadedSpec, old: dict[str, str]) -> dict[str, NodeFacts]:
    """Running servers whose last apply rendered `old` for some settings (and runs them)."""
    want = desired(loaded)
    facts = {}
    for node in loaded.layout.servers:
        record = recorded(want[node.name])
        record = dataclasses.replace(record, digest="old",
                                     directives=tuple((k, old.get(k, v)) for k, v in record.directives))
        facts[node.name] = NodeFacts(node.name, True, record=record, reachable=True,
                                     config={"maxmemory": "67108864", "maxmemory-policy": "allkeys-lru", **old})
    return facts


def test_a_derived_setting_names_the_spec_field_that_changed_it() -> None:
    """Issue 33 item 8: a replica more per master said "spec changed repl-diskless-sync-delay", a setting the user
    never wrote. The plan names the field that derives it, before -> after; a `config:` entry is its own cause."""
    loaded = loaded_spec("replication")  # 3 hosts: 2 replicas per master, deployed when it had 1
    old = {"repl-diskless-sync-delay": "0", "repl-diskless-sync-max-replicas": "1"}
    plan = make_plan(loaded, desired(loaded), _recorded_with(loaded, old), "d")
    text = plan_text(plan)
    sets = {s.directive: s.reason for s in plan.steps if isinstance(s, ConfigSet)}
    assert sets["repl-diskless-sync-delay"] == "hosts (2 replicas per master) derives repl-diskless-sync-delay 0 -> 1"
    assert "spec changed repl-diskless-sync" not in text, text
    writes = [s for s in plan.steps if isinstance(s, WriteConfig)]
    assert writes and all(s.reason == "hosts (2 replicas per master) derives repl-diskless-sync-delay, "
                                      "repl-diskless-sync-max-replicas" for s in writes), text
    own = load_dict({**make_spec("replication"), "config": {"repl-diskless-sync-delay": "1"}})
    sets = {s.directive: s.reason for s in make_plan(own, desired(own), _recorded_with(own, old), "d").steps
            if isinstance(s, ConfigSet)}
    assert sets["repl-diskless-sync-delay"] == "spec changed repl-diskless-sync-delay 0 -> 1"


def test_a_sentinel_quorum_names_the_sentinels_as_its_cause() -> None:
    loaded = loaded_spec("sentinel")
    want = desired(loaded)
    facts = _recorded_with(loaded, {})
    for node in loaded.layout.sentinels:
        record = recorded(want[node.name])
        record = dataclasses.replace(record, digest="old", directives=tuple(
            (k, v.rsplit(" ", 1)[0] + " 1" if k == "sentinel monitor" else v) for k, v in record.directives))
        facts[node.name] = NodeFacts(node.name, True, record=record, reachable=True)
    text = plan_text(make_plan(loaded, want, facts, "d"))
    assert "hosts (3 sentinels: a majority) derives quorum 1 -> 2" in text, text


def test_a_write_without_a_setting_change_says_what_changed_and_shows_no_lines() -> None:
    loaded = loaded_spec("standalone")
    facts = _recorded_with(loaded, {})
    name = loaded.layout.servers[0].name
    facts[name] = dataclasses.replace(facts[name], record=dataclasses.replace(facts[name].record, digest="old"))
    plan = make_plan(loaded, desired(loaded), facts, "d")
    write = plan.steps[0]
    assert isinstance(write, WriteConfig) and write.changes == ()
    assert write.reason == "rendered files changed beside the single settings (users.acl, user lines, comments)"
    lines = plan_text(plan).splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("1. write-config"))
    assert lines[at + 1].strip().startswith("why:")
    after = lines[at + 2] if at + 2 < len(lines) else ""
    assert not (after.startswith(" " * 7) and " -> " in after), lines  # no before -> after line: nothing to show
