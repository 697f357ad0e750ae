"""cluster_problems on real snapshots (tests/fixtures/replies) and on edited copies of them. Pure."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import pytest

from opsctl.observe.cluster_state import (
    cluster_problems,
    even_slot_ranges,
    first_difference,
    node_groups,
    slot_map,
    uncovered,
)
from opsctl.observe.replies import parse_cluster_nodes, parse_info

REPLIES = Path(__file__).parent / "fixtures" / "replies"
FLAVORS = ["valkey", "redis"]


def snapshot(flavor: str, scenario: str):
    raw = json.loads((REPLIES / flavor / f"{scenario}.json").read_text())
    views = {name: parse_cluster_nodes(v["nodes"]) for name, v in raw.items()}
    infos = {name: {**parse_info(v["cluster_info"]), **parse_info(v["replication"])} for name, v in raw.items()}
    return views, infos


def texts(problems):
    return [p.render() for p in problems]


@pytest.mark.parametrize("masters", [1, 2, 3, 5, 7, 16384])
def test_even_slot_ranges(masters):
    ranges = even_slot_ranges(masters)
    assert ranges[0][0] == 0 and ranges[-1][1] == 16383 and len(ranges) == masters
    assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(ranges))
    sizes = {e - s + 1 for s, e in ranges}
    assert max(sizes) - min(sizes) <= 1


def test_even_slot_ranges_rejects_zero():
    with pytest.raises(ValueError):
        even_slot_ranges(0)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_converged_cluster_has_no_problems(flavor):
    assert cluster_problems(*snapshot(flavor, "converged")) == []


@pytest.mark.parametrize("flavor", FLAVORS)
def test_open_slot_names_both_ends(flavor):
    views, infos = snapshot(flavor, "open_slot")
    names = sorted(views)
    found = texts(cluster_problems(views, infos))
    assert any(t.startswith(f"{names[0]}: slot 100 is open: MIGRATING to ") and f"({names[2]})" in t for t in found)
    assert any(t.startswith(f"{names[2]}: slot 100 is open: IMPORTING from ") and f"({names[0]})" in t
               for t in found)


@pytest.mark.parametrize(("flavor", "scenario", "flag"), [(f, s, s.replace("pfail", "fail?"))
                                                          for f in FLAVORS for s in ("pfail", "fail")])
def test_failed_node_is_named(flavor, scenario, flag):
    views, infos = snapshot(flavor, scenario)
    found = texts(cluster_problems(views, infos))
    assert any(f" as {flag}" in t for t in found), found
    assert any("which is not an observed node" not in t for t in found)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_differing_slot_map_names_node_and_range(flavor):
    views, infos = snapshot(flavor, "converged")
    names = sorted(views)
    ids = {name: next(line.id for line in view if line.is_myself) for name, view in views.items()}
    # names[4]'s view: pretend it still thinks names[0] owns 5462-6000 (e.g. a missed SETSLOT NODE)
    text = "\n".join(_move(line, ids[names[0]], ids[names[2]]) for line in
                     json.loads((REPLIES / flavor / "converged.json").read_text())[names[4]]["nodes"].splitlines())
    views[names[4]] = parse_cluster_nodes(text)
    found = texts(cluster_problems(views, infos))
    assert len(found) == 1, found
    assert found[0].startswith(f"{names[4]}: sees slots 5462-6000 owned by ") and f"({names[0]})" in found[0]
    assert f"({names[2]}) owning them" in found[0]


def _move(line: str, to_id: str, from_id: str) -> str:
    if line.startswith(to_id):
        return line + " 5462-6000"
    if line.startswith(from_id):
        return line.replace("5462-10922", "6001-10922")
    return line


@pytest.mark.parametrize("flavor", FLAVORS)
def test_state_unknown_node_epoch_and_link(flavor):
    views, infos = snapshot(flavor, "converged")
    names = sorted(views)
    infos[names[0]] = {**infos[names[0]], "cluster_state": "fail"}
    infos[names[1]] = {**infos[names[1]], "master_link_status": "down"}
    me = next(line for line in views[names[2]] if line.is_myself)
    views[names[3]] = [line for line in views[names[3]] if line.id != me.id]
    other = next(line for line in views[names[4]] if line.is_myself)
    views[names[4]] = [_epoch(line, me.config_epoch) if line.is_myself else line for line in views[names[4]]]
    found = texts(cluster_problems(views, infos))
    assert any(t.startswith(f"{names[0]}: cluster_state is fail") for t in found)
    assert any(t.startswith(f"{names[1]}: replica link to ") and t.endswith("is down") for t in found)
    assert any(t.startswith(f"{names[3]}: does not know ") and f"({names[2]})" in t for t in found)
    if other.is_master:
        assert any(t.startswith(f"{names[4]}: has config epoch {me.config_epoch}") for t in found)


def _epoch(line, epoch):
    from dataclasses import replace

    return replace(line, config_epoch=epoch)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_role_disagreement_is_named(flavor):
    views, infos = snapshot(flavor, "converged")
    names = sorted(views)
    replica = next(line for line in views[names[1]] if line.is_myself)
    from dataclasses import replace

    views[names[0]] = [replace(line, master_id=None, flags=frozenset({"master"})) if line.id == replica.id else line
                       for line in views[names[0]]]
    found = texts(cluster_problems(views, infos))
    assert any(t.startswith(f"{names[0]}: sees ") and f"({names[1]}) as a master but it is a replica of" in t
               for t in found), found


def test_uncovered_and_first_difference():
    a = slot_map(parse_cluster_nodes("x 1.1.1.1:1@2 myself,master - 0 0 1 connected 0-99 200-16383"))
    assert uncovered(a) == [(100, 199)]
    b = slot_map(parse_cluster_nodes("x 1.1.1.1:1@2 myself,master - 0 0 1 connected 0-16383"))
    assert first_difference(a, b) == (100, 199, None, "x")
    assert first_difference(a, a) is None


def test_open_slots_are_reported_as_ranges_per_peer() -> None:
    from opsctl.observe.cluster_state import _runs

    slots = {**{s: "b" for s in range(100, 612)}, 700: "b", 701: "c"}
    assert _runs(slots) == [((100, 611), "b"), ((700, 700), "b"), ((701, 701), "c")]


@pytest.mark.parametrize("flavor", FLAVORS)
def test_node_groups_split_nodes_that_never_met(flavor) -> None:
    """A creation killed before its CLUSTER MEETs: each node knows only itself, several groups (the slot commands
    refuse). Met nodes are one group, also while some still miss others or know one only one way (gossip spreads)."""
    views, _ = snapshot(flavor, "converged")
    names = sorted(views)
    assert node_groups(views) == [names]
    alone = {name: [line for line in view if line.is_myself] for name, view in views.items()}
    assert node_groups(alone) == [[n] for n in names]
    first, *rest = names
    halves = {**alone, first: views[first]}  # the first met every other node, which have not heard of it yet
    assert node_groups(halves) == [names]
    ids = {n: next(line.id for line in views[n] if line.is_myself) for n in names}
    pair = {**alone, rest[0]: [line for line in views[rest[0]] if line.id in (ids[rest[0]], ids[rest[1]])]}
    assert node_groups(pair) == sorted([[first], *[[n] for n in rest[2:]], sorted(rest[:2])])
    seen_first = next(line for line in views[rest[0]] if line.id == ids[first])
    handshake = replace(seen_first, id="0" * 40, flags=frozenset({"master", "handshake"}))  # id made up until answered
    meeting = {**alone, rest[0]: [*alone[rest[0]], handshake]}  # rest[0] ran CLUSTER MEET first: a meet under way
    assert [first, rest[0]] in node_groups(meeting)
    assert node_groups({}) == []
