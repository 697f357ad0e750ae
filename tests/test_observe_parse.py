"""Pure parsers on replies captured from real Valkey 9.1 and Redis 7.0 (tests/fixtures/replies/capture.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opsctl.observe.replies import (
    IMMUTABLE,
    IMMUTABLE_BY_FLAVOR,
    PROTECTED,
    config_equal,
    is_config_directive,
    parse_cluster_node_line,
    parse_cluster_nodes,
    parse_info,
    parse_pairs,
    parse_role,
    to_bytes,
)
from opsctl.spec.text import split_args

REPLIES = Path(__file__).parent / "fixtures" / "replies"
FLAVORS = ["valkey", "redis"]


def load(flavor: str, name: str):
    path = REPLIES / flavor / name
    return json.loads(path.read_text()) if name.endswith(".json") else path.read_text()


@pytest.mark.parametrize("flavor", FLAVORS)
def test_info(flavor):
    info = parse_info(load(flavor, "info.txt"))
    assert info["cluster_enabled"] == "1"
    assert info["role"] == "master"
    assert info.get("redis_mode", info.get("server_mode")) == "cluster"
    assert int(info["tcp_port"]) > 0
    assert ("valkey_version" in info) == (flavor == "valkey")
    cinfo = parse_info(next(iter(load(flavor, "converged.json").values()))["cluster_info"])
    assert cinfo["cluster_state"] == "ok" and cinfo["cluster_slots_assigned"] == "16384"


def test_info_keeps_keyspace_values_raw():
    info = parse_info("# Keyspace\r\ndb0:keys=3,expires=1,avg_ttl=0\r\n\r\n# Server\r\nexecutable:/a:b\r\n")
    assert info == {"db0": "keys=3,expires=1,avg_ttl=0", "executable": "/a:b"}


@pytest.mark.parametrize("flavor", FLAVORS)
def test_cluster_nodes_converged(flavor):
    views = {name: parse_cluster_nodes(v["nodes"]) for name, v in load(flavor, "converged.json").items()}
    for view in views.values():
        assert len(view) == 6 and sum(line.is_myself for line in view) == 1
        masters = [line for line in view if line.is_master]
        assert len(masters) == 3
        assert sorted(r for m in masters for r in m.slots) == [(0, 5461), (5462, 10922), (10923, 16383)]
        assert all(line.link_state == "connected" and not line.is_failing for line in view)
        replicas = [line for line in view if not line.is_master]
        assert {r.master_id for r in replicas} == {m.id for m in masters}
        assert len({m.config_epoch for m in masters}) == 3
        assert all(line.address.startswith("127.") and line.bus_port == line.port + 10000 for line in view)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_cluster_nodes_open_slot(flavor):
    views = {name: parse_cluster_nodes(v["nodes"]) for name, v in load(flavor, "open_slot.json").items()}
    names = sorted(views)
    source = next(line for line in views[names[0]] if line.is_myself)
    target = next(line for line in views[names[2]] if line.is_myself)
    assert source.migrating == {100: target.id} and source.slots == ((0, 5461),)
    assert target.importing == {100: source.id} and target.slots == ((5462, 10922),)


@pytest.mark.parametrize(("flavor", "scenario", "flag"), [(f, s, s.replace("pfail", "fail?"))
                                                          for f in FLAVORS for s in ("pfail", "fail")])
def test_cluster_nodes_failed_node(flavor, scenario, flag):
    views = [parse_cluster_nodes(v["nodes"]) for v in load(flavor, f"{scenario}.json").values()]
    failing = [line for view in views for line in view if flag in line.flags]
    assert failing and all(line.is_failing and not line.is_master for line in failing)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_cluster_nodes_fresh_node_has_no_address(flavor):
    (line,) = parse_cluster_nodes(load(flavor, "nodes_fresh.txt"))
    assert line.address == "" and line.port > 0 and line.is_myself and line.is_master
    assert line.master_id is None and line.config_epoch == 0 and line.slots == ()


def test_cluster_node_line_variants():
    line = parse_cluster_node_line("a1 10.0.0.1:7000@17000,db-1.example,shard-id=x myself,master - 0 0 4 "
                                   "connected 0 2-3 [5->-b2] [6-<-c3]")
    assert (line.address, line.port, line.bus_port, line.hostname) == ("10.0.0.1", 7000, 17000, "db-1.example")
    assert line.slots == ((0, 0), (2, 3)) and line.migrating == {5: "b2"} and line.importing == {6: "c3"}
    assert line.endpoint == "10.0.0.1:7000" and line.slot_count == 3
    noaddr = parse_cluster_node_line("b2 :0@0 master,fail,noaddr - 1 1 2 disconnected")
    assert noaddr.address == "" and noaddr.port == 0 and noaddr.is_failing and "noaddr" in noaddr.flags
    hs = parse_cluster_node_line("c3 127.0.0.2:7001@17001 handshake - 0 0 0 connected")
    assert "handshake" in hs.flags and not hs.is_master
    v6 = parse_cluster_node_line("d4 [::1]:7002@17002 slave a1 0 0 4 connected")
    assert (v6.address, v6.port, v6.master_id) == ("::1", 7002, "a1")
    with pytest.raises(ValueError):
        parse_cluster_node_line("garbage")


@pytest.mark.parametrize("flavor", FLAVORS)
def test_role(flavor):
    roles = load(flavor, "role.json")
    master, replica = parse_role(roles["master"]), parse_role(roles["replica"])
    assert master.kind == "master" and len(master.replicas) == 1 and master.master is None
    ip, port, offset = master.replicas[0]
    assert ip.startswith("127.") and port > 0 and offset >= 0
    assert replica.kind == "replica" and replica.link == "connected" and replica.master is not None
    assert replica.master[1] > 0


def test_role_sentinel_and_unknown():
    assert parse_role(["sentinel", ["orders"]]).monitors == ("orders",)
    with pytest.raises(ValueError):
        parse_role(["leader"])


def test_parse_pairs_both_shapes():
    assert parse_pairs(["a", "1", "b", 2]) == {"a": "1", "b": "2"}
    assert parse_pairs({"a": 1}) == {"a": "1"}


@pytest.mark.parametrize(("text", "size"), [("256mb", 268435456), ("1k", 1000), ("1KB", 1024), ("2m", 2000000),
                                             ("1g", 10**9), ("1gb", 1024**3), ("42", 42), ("7b", 7)])
def test_to_bytes(text, size):
    assert to_bytes(text) == size


def test_to_bytes_rejects():
    with pytest.raises(ValueError):
        to_bytes("lots")


def test_split_args_quotes():
    assert split_args('"a b" \'c\\\'d\' e\\x "\\x41\\n"') == ["a b", "c'd", "e\\x", "A\n"]
    assert split_args('""') == [""]


@pytest.mark.parametrize("flavor", FLAVORS)
def test_config_equal_against_live_values(flavor):
    live = load(flavor, "config_get.json")
    assert config_equal("maxmemory", "64mb", live["maxmemory"])
    assert config_equal("repl-backlog-size", "64mb", live["repl-backlog-size"])
    assert not config_equal("maxmemory", "65mb", live["maxmemory"])
    assert config_equal("save", "900 1 300 10 60 10000", live["save"])
    assert config_equal("save", "60 10000 900 1 300 10", live["save"])
    assert not config_equal("save", '""', live["save"])
    assert config_equal("appendfilename", '"appendonly.aof"', live["appendfilename"])
    assert config_equal("appendonly", "YES", live["appendonly"])
    assert config_equal("maxmemory-policy", "ALLKEYS-LRU", live["maxmemory-policy"])
    assert config_equal("client-output-buffer-limit", "replica 256mb 64mb 60", live["client-output-buffer-limit"])
    assert not config_equal("client-output-buffer-limit", "pubsub 1mb 1mb 1", live["client-output-buffer-limit"])
    assert config_equal("dir", live["dir"] + "/", live["dir"])
    assert config_equal("cluster-node-timeout", "2000", live["cluster-node-timeout"])


def test_config_equal_rules():
    assert config_equal("save", '""', "")
    assert config_equal("bind", "127.0.0.2 127.0.0.1", "127.0.0.1 127.0.0.2")
    assert not config_equal("bind", "127.0.0.2", "127.0.0.1 127.0.0.2")
    assert config_equal("requirepass", '"p\\"w"', 'p"w')
    assert not config_equal("requirepass", '"PW"', "pw")
    assert config_equal("notify-keyspace-events", "KEx", "xKE")
    assert config_equal("oom-score-adj-values", "0 200 800", "0 200 800")
    with pytest.raises(ValueError):
        config_equal("rename-command", "KEYS \"\"", "")
    with pytest.raises(ValueError):
        config_equal("sentinel monitor", "m 1 2 3", "")


@pytest.mark.parametrize("flavor", FLAVORS)
def test_immutable_and_protected_are_real_configs(flavor):
    live = load(flavor, "config_get.json")
    for name in ("daemonize", "cluster-enabled", "dir", "dbfilename", "aclfile", "logfile", "pidfile"):
        assert name in live
        assert not live_settable(name, flavor)
    assert set(live) >= PROTECTED and "dir" not in IMMUTABLE
    assert live_settable("maxmemory", flavor) and live_settable("save", flavor)
    assert not live_settable("rename-command") and not live_settable("sentinel monitor")
    assert live_settable("io-threads", "valkey") and not live_settable("io-threads", "redis")


def live_settable(directive: str, flavor: str | None = None) -> bool:  # what the tests ask of the tables
    """Whether CONFIG SET can change the directive on a running node (hardened: protected configs blocked)."""
    name = directive.strip().lower()
    immutable = IMMUTABLE_BY_FLAVOR.get(flavor, IMMUTABLE) if flavor else IMMUTABLE
    return is_config_directive(name) and name not in immutable and name not in PROTECTED
