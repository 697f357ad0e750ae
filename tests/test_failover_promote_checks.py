"""The forced promotion of a replication topology whose master is gone: whom it promotes, what it checks first,
which options it takes (pure; the live run is tests/test_failover_promote.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from opsctl.base.errors import OpsctlError, RefusedError
from opsctl.failover.checks import (
    about_gone,
    cluster_prechecks,
    failed,
    names_endpoint,
    postchecks,
    resolve_target,
)
from opsctl.failover.promotion import promotion_prechecks
from opsctl.failover.report import FailoverReport
from opsctl.failover.runbook import Options, _gate, _modes
from opsctl.failover.verdicts import Check, Target, Thresholds
from opsctl.plan.facts import NodeFacts
from tests.test_failover_checks import facts_for, spec


def _gone(loaded, offsets: dict[str, int], down: tuple[str, ...] = ()) -> dict[str, NodeFacts]:
    """The master dead, each replica's link down, at the offset it got to."""
    shard = loaded.layout.shards[0]
    facts = facts_for(loaded, down=(shard.master, *down), link_down=shard.replicas)
    for name, offset in offsets.items():
        info = {**facts[name].info, "master_replid": "a" * 40, "master_repl_offset": str(offset),
                "master_link_down_since_seconds": "12"}
        facts[name] = replace(facts[name], info=info)
    return facts


def test_the_replica_holding_the_most_is_promoted_and_a_lesser_one_is_refused(tmp_path: Path) -> None:
    loaded = spec(tmp_path, "replication")
    shard = loaded.layout.shards[0]
    first, second = shard.replicas
    facts = _gone(loaded, {first: 900, second: 1000})
    target = resolve_target(loaded, facts, shard=1, promote=True)
    assert target == Target(1, shard.master, second)
    assert failed(promotion_prechecks(loaded.layout, facts, target)) == []
    checks = promotion_prechecks(loaded.layout, facts, resolve_target(loaded, facts, to=first, promote=True))
    [most] = failed(checks)
    assert most.name == "most-data" and f"--to {second}" in most.hint and "100 bytes" in most.hint
    assert f"{first} lost it 12 s ago" in checks[0].value
    assert resolve_target(loaded, facts, shard=1) == Target(1, shard.master, None,
                                                           f"{shard.master} does not answer and no replica is "
                                                           "linked to it")


def test_a_silent_replica_or_a_master_that_answers_fails_the_checks(tmp_path: Path) -> None:
    loaded = spec(tmp_path, "replication")
    shard = loaded.layout.shards[0]
    first, second = shard.replicas
    facts = _gone(loaded, {first: 1000}, down=(second,))
    [most] = failed(promotion_prechecks(loaded.layout, facts, resolve_target(loaded, facts, shard=1, promote=True)))
    assert most.name == "most-data" and f"{second} does not answer" in most.value
    alive = facts_for(loaded)
    master = failed(promotion_prechecks(loaded.layout, alive, Target(1, shard.master, first)))[0]
    assert master.name == "master-down" and "graceful" in master.hint
    nobody = _gone(loaded, {}, down=(first, second))
    target = resolve_target(loaded, nobody, shard=1, promote=True)
    assert target.no_replica == f"no replica of {shard.master} answers"
    assert [c.name for c in failed(promotion_prechecks(loaded.layout, nobody, target))] == ["most-data"]


def test_a_forced_failover_passes_with_the_old_master_down_and_a_graceful_one_does_not(tmp_path: Path) -> None:
    loaded = spec(tmp_path, "replication")
    shard = loaded.layout.shards[0]
    new = shard.replicas[0]
    facts = facts_for(loaded, masters={1: new}, down=[shard.master])
    assert failed(postchecks(loaded, facts, shard.master, new, "OK", forced=True)) == []
    assert [c.name for c in failed(postchecks(loaded, facts, shard.master, new, "OK"))] == ["old-master-replica"]


def test_each_topology_takes_only_its_own_modes(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    (tmp_path / "s").mkdir()
    replication = spec(tmp_path / "r", "replication")
    assert _modes(replication, Options(mode="force", yes=True)) == ("promote",)
    with pytest.raises(RefusedError, match="can lose acknowledged writes"):
        _modes(replication, Options(mode="force"))
    for options in (Options(mode="takeover", yes=True), Options(escalate=True, yes=True)):
        with pytest.raises(OpsctlError, match="not for a replication topology"):
            _modes(replication, options)
    sentinel = spec(tmp_path / "s", "sentinel")
    with pytest.raises(OpsctlError, match="--mode force is not for a sentinel topology") as refused:
        _modes(sentinel, Options(mode="force", yes=True))
    assert "Sentinel promotes a replica by itself" in refused.value.detail


def test_a_cluster_force_with_the_master_gone_judges_the_replica_by_its_data(tmp_path: Path) -> None:
    loaded = spec(tmp_path, "cluster")
    s2 = loaded.layout.shards[1]
    replica = s2.replicas[0]
    facts = facts_for(loaded, down=[s2.master], link_down=[replica])
    dead = loaded.layout.node(s2.master)
    facts[replica] = replace(facts[replica], info={**facts[replica].info, "master_replid": "b" * 40,
                                                   "master_repl_offset": "500", "master_host": dead.address,
                                                   "master_port": str(dead.port)})
    assert resolve_target(loaded, facts, shard=2).replica is None  # graceful: nobody is linked
    target = resolve_target(loaded, facts, shard=2, promote=True)
    assert target == Target(2, s2.master, replica)
    graceful = {c.name: c for c in cluster_prechecks(loaded, facts, target, Thresholds(), [], 0.0)}
    assert not graceful["target-linked"].passed and "--mode force --yes" in graceful["target-linked"].hint
    assert not graceful["cluster-agrees"].passed
    forced = cluster_prechecks(loaded, facts, target, Thresholds(), [], 0.0, forced=True)
    assert failed(forced) == [], [c.line() for c in failed(forced)]
    assert forced[0].name == "most-data"
    assert f"({s2.master} left out: it does not answer)" in next(c.value for c in forced if c.name == "cluster-agrees")


def test_the_dead_master_is_left_out_by_its_whole_endpoint() -> None:
    assert names_endpoint("replica link to 10.0.0.1:700 is down", "10.0.0.1:700")
    assert names_endpoint("knows 48674329… (10.0.0.1:700), which is not an observed node", "10.0.0.1:700")
    assert not names_endpoint("replica link to 10.0.0.1:7001 is down", "10.0.0.1:700")
    assert not names_endpoint("knows ab… (110.0.0.1:700)", "10.0.0.1:700")
    assert not names_endpoint("knows ab… (db-redis-1:7000)", "redis-1:7000")


def test_only_what_is_said_of_the_gone_master_itself_is_left_out() -> None:
    """Its own failing state is expected while it is gone; it named as a slot owner or as someone's master, after
    the promotion, is gossip still to settle (clients would still be sent to it)."""
    dead = "10.0.0.1:700"
    for before in (True, False):
        assert about_gone("sees 4867… (10.0.0.1:700) as fail", dead, before)
        assert about_gone("does not know 4867… (10.0.0.1:700)", dead, before)
        assert about_gone("knows 4867… (10.0.0.1:700), which is not an observed node", dead, before)
        assert not about_gone("sees slots 0-5460 owned by 4867… (10.0.0.1:700) but n2 (and 3 more) sees "
                              "10.0.0.2:700 (n4) owning them", dead, before)
        assert not about_gone("sees 10.0.0.2:700 (n4) as a replica of 4867… (10.0.0.1:700) but it is a master", dead,
                              before)
        assert not about_gone("does not know 4867… (10.0.0.1:7001)", dead, before)
    assert about_gone("replica link to 10.0.0.1:700 is down", dead, True)
    assert not about_gone("replica link to 10.0.0.1:700 is down", dead, False)  # not following the new one yet


def _heard(loaded, facts: dict[str, NodeFacts], name: str, seconds_ago: int) -> None:
    """name's link to the (silent to opsctl) master up, last heard from it seconds_ago."""
    m = loaded.layout.node(loaded.layout.shards[0].master)
    facts[name] = replace(facts[name], role=replace(facts[name].role, master=(m.address, m.port), link="connected"),
                          info={**facts[name].info, "master_link_status": "up",
                                "master_last_io_seconds_ago": str(seconds_ago)})


def test_a_master_its_replica_heard_lately_is_not_gone_and_force_checks_cannot_say_it_is(tmp_path: Path) -> None:
    """Silent to opsctl is not gone: a replica that heard from the master within its ping period (10 s, 2 s of
    grace) says it runs, cut off from opsctl only. Binding: --force-checks does not override it."""
    loaded = spec(tmp_path, "replication")
    shard = loaded.layout.shards[0]
    first, second = shard.replicas
    facts = _gone(loaded, {first: 1000, second: 900})
    _heard(loaded, facts, second, 3)
    target = resolve_target(loaded, facts, shard=1, promote=True)
    [master] = failed(promotion_prechecks(loaded.layout, facts, target))
    assert master.name == "master-down" and master.binding and f"{second} heard from it 3 s ago" in master.value
    assert "12 s of its last word" in master.hint
    report = FailoverReport("t", "replication", "me", 0.0, "force", False)
    with pytest.raises(RefusedError, match="pre-check") as refused:
        _gate(report, promotion_prechecks(loaded.layout, facts, target), Options(force_checks=True), lambda _: None)
    assert "--force-checks cannot override it" in refused.value.hint
    _heard(loaded, facts, second, 13)  # stalled or dead: the link stays up until repl-timeout, silent
    assert failed(promotion_prechecks(loaded.layout, facts, target)) == []
    assert failed(promotion_prechecks(loaded.layout, facts, target, ping_period=20.0))[0].binding
    overridable = [Check("most-data", False, "x")]
    _gate(report, overridable, Options(force_checks=True), lambda _: None)  # what --force-checks is for
    assert report.warnings == ["--force-checks: went on despite most-data"]


def test_the_second_incident_on_a_shard_finds_the_master_its_replicas_follow(tmp_path: Path) -> None:
    """After a failover to first, first dies: the declared master is a replica of first (answering), so the shard's
    master by the declared fallback would be it; the forced promotion takes the one the replicas follow."""
    loaded = spec(tmp_path, "replication")
    shard = loaded.layout.shards[0]
    first, second = shard.replicas
    facts = facts_for(loaded, masters={1: first}, down=[first], link_down=[shard.master, second])
    for name, offset in ((shard.master, 800), (second, 900)):
        facts[name] = replace(facts[name], info={**facts[name].info, "master_replid": "a" * 40,
                                                 "master_repl_offset": str(offset)})
    target = resolve_target(loaded, facts, shard=1, promote=True)
    assert target == Target(1, first, second)
    assert failed(promotion_prechecks(loaded.layout, facts, target)) == []
    assert resolve_target(loaded, facts, master=first, promote=True) == target
    assert resolve_target(loaded, facts, to=shard.master, promote=True).master == first
