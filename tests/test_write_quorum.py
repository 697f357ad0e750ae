"""Issue 23, class 1: a master that loses its replicas stops taking writes within a bounded time by default
(min-replicas-to-write / -max-lag rendered from persistence.min_replicas_*), with an explicit opt-out; sources of
outgoing connections (hosts[].source_address, bind-source-addr) for servers and sentinels. Pure: spec, render,
plan."""

from __future__ import annotations

import pytest

from opsctl.base.errors import SpecError
from opsctl.plan.desired import single_valued
from opsctl.plan.facts import FENCE, MAX_LAG, TO_WRITE, NodeFacts, spec_values
from opsctl.plan.servers import config_steps, file_drift
from opsctl.server.versions import parse_version
from tests.support import make_spec
from tests.test_plan_drift import _disk_of
from tests.test_planner import desired, load_dict, loaded_spec, recorded


def _rendered(loaded, name: str) -> dict[str, str]:
    return single_valued(desired(loaded)[name].directives)


@pytest.mark.parametrize(("topology", "sections", "expected"), [
    ("sentinel", {}, ("1", "5")),
    ("replication", {}, ("1", "5")),
    ("cluster", {}, ("0", "5")),  # a cluster's node timeout bounds a cut-off master; one replica per master
    ("sentinel", {"persistence": {"min_replicas_to_write": 0}}, ("0", "5")),  # the opt-out
    ("replication", {"persistence": {"min_replicas_to_write": 2, "min_replicas_max_lag": 2}}, ("2", "2")),
    ("cluster", {"persistence": {"min_replicas_to_write": 1, "min_replicas_max_lag": 10}}, ("1", "10")),
])
def test_the_write_quorum_is_rendered_by_default_where_a_failover_drops_writes(topology, sections, expected) -> None:
    loaded = loaded_spec(topology, **sections)
    for node in loaded.layout.servers:
        values = _rendered(loaded, node.name)
        assert (values[TO_WRITE], values[MAX_LAG]) == expected
        assert spec_values(loaded, node) == {TO_WRITE: expected[0], MAX_LAG: expected[1]}  # what the fence restores


def test_a_standalone_node_has_no_write_quorum() -> None:
    standalone = loaded_spec("standalone")
    assert TO_WRITE not in _rendered(standalone, standalone.layout.servers[0].name)


@pytest.mark.parametrize(("topology", "sections", "words"), [
    ("replication", {"persistence": {"min_replicas_to_write": 3}}, "a shard has 2: its master would refuse"),
    ("standalone", {"persistence": {"min_replicas_to_write": 1}}, "a shard has 0"),
    ("sentinel", {"persistence": {"min_replicas_max_lag": 0}}, "min_replicas_max_lag"),
    ("sentinel", {"persistence": {"min_replicas_to_write": -1}}, "min_replicas_to_write"),
])
def test_a_write_quorum_no_master_can_meet_is_refused(topology, sections, words) -> None:
    with pytest.raises(SpecError) as refused:
        loaded_spec(topology, **sections)
    assert words in refused.value.render(), refused.value.render()


def _with_source(topology: str, source: str | None = None, flavor: str = "valkey", version: str | None = None):
    """A spec whose first host gives source_address (its own address when source is None)."""
    spec = make_spec(topology, flavor)
    spec["server"]["version"] = version or spec["server"]["version"]
    spec["hosts"][0]["source_address"] = source or spec["hosts"][0]["address"]
    return load_dict(spec)


def test_source_address_reaches_the_servers_and_sentinels_of_its_host_only() -> None:
    loaded = _with_source("sentinel")
    first = loaded.spec.hosts[0]
    for node in loaded.layout.nodes:
        assert _rendered(loaded, node.name).get("bind-source-addr") == \
            (first.address if node.host == first.name else None), node.name


@pytest.mark.parametrize(("flavor", "version", "source", "words"), [
    ("valkey", None, "not-an-ip", "is not an IP address"),
    ("valkey", None, "127.0.0.1", "is neither the host's address nor one of its bind addresses"),
    ("redis", "6.2", None, "redis 6.2 has no bind-source-addr"),
])
def test_a_source_address_the_host_cannot_use_is_refused(flavor, version, source, words) -> None:
    with pytest.raises(SpecError) as refused:
        _with_source("replication", source, flavor, version)
    assert words in refused.value.render(), refused.value.render()


def _running(loaded, name: str, value: str) -> NodeFacts:
    """A running node as its look sees it: the spec's file on disk and live config, but min-replicas-to-write."""
    on_disk = {**_disk_of(loaded, name), TO_WRITE: value}
    return NodeFacts(name, True, record=recorded(desired(loaded)[name]), reachable=True, config={TO_WRITE: value},
                     on_disk=on_disk)


def test_write_quorum_drift_is_set_back_but_a_fence_is_left_to_finishing_the_failover() -> None:
    loaded = loaded_spec("sentinel")
    node = loaded.layout.servers[0]
    want = desired(loaded)[node.name]
    server = (loaded.spec.server.flavor, parse_version(loaded.spec.server.version))
    drifted = _running(loaded, node.name, "0")
    assert [(s.kind, getattr(s, "directive", None), getattr(s, "value", None))
            for s in config_steps(node, want, drifted, True, server)] == \
        [("write-config", None, None), ("config-set", TO_WRITE, "1")]
    assert [line for line in file_drift(want, drifted) if TO_WRITE in line]
    fenced = _running(loaded, node.name, FENCE)
    assert config_steps(node, want, fenced, True, server) == []
    assert file_drift(want, fenced) == []
