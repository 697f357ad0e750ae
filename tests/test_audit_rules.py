"""Unit tests of the audit's pure core: RESP, slots, key-name lint, thresholds, TTLs, node checks, reports."""

from __future__ import annotations

import json

import pytest
from redis.crc import key_slot

from opsctl.audit.bigdelete import choose_method, gc_name, parse_slot_owner
from opsctl.audit.formats import render
from opsctl.audit.keynames import NameLint, case_style, prefix_of
from opsctl.audit.keyspace import BigKeys, Expiries, HotKeys, Thresholds, shard_skew
from opsctl.audit.nodechecks import (
    auth_findings,
    command_available,
    config_drift,
    memory_findings,
    probe_findings,
    probes,
    size_bytes,
    slowlog_rows,
)
from opsctl.audit.scan import throttle_delay
from opsctl.net.discover import LiveNode, role_summary, scan_targets
from opsctl.net.resp import INCOMPLETE, encode, encode_keyed, reader, replies
from opsctl.observe.findings import BEST_PRACTICES, RULES, SOURCES, at_or_above, finding
from opsctl.observe.replies import RespError
from opsctl.spec.layout import Node


def test_resp_round_trip_and_partial_buffers() -> None:
    assert encode(["SET", b"k", 1]) == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n1\r\n"
    assert encode_keyed(b"STRLEN", [b"a", b"bc"]) == encode([b"STRLEN", b"a"]) + encode([b"STRLEN", b"bc"])
    assert encode_keyed(b"MEMORY", [b"k"], b"USAGE") == encode([b"MEMORY", b"USAGE", b"k"])
    keys = [b"", b"k", b"\r\n$1\r\n", b"k" * 300, b"x"]
    assert encode_keyed(b"TYPE", keys) == b"".join(encode([b"TYPE", k]) for k in keys)
    assert encode_keyed(b"TYPE", []) == b""
    buf = b":5\r\n$3\r\na\nb\r\n*2\r\n$1\r\n0\r\n*1\r\n$2\r\nk1\r\n-ERR x\r\n$-1\r\n+OK\r\n*2\r\n+a\r\n:1\r\n"
    assert replies(buf) == [5, b"a\nb", [b"0", [b"k1"]], RespError("ERR x"), None, b"OK", [b"a", 1]]
    assert len(replies(buf[:-3])) == 6  # cut inside the last array: it waits for more bytes


def test_gc_names_stay_in_the_slot_and_are_stable() -> None:
    for key in (b"trade:followers:{42}", b"plain:key", b"user:{u1}:friends"):
        assert key_slot(gc_name(key, cluster=True)) == key_slot(key)
        assert gc_name(key, True) == gc_name(key, True) and gc_name(key, True).startswith(b"gc:{")
    assert gc_name(b"k", cluster=False).startswith(b"gc:")


def test_delete_method() -> None:
    assert choose_method("set", lazyfree=True, force_chunked=False, gc_exists=False) == "unlink"
    assert choose_method("set", lazyfree=False, force_chunked=False, gc_exists=False) == "chunked"
    assert choose_method("set", lazyfree=True, force_chunked=True, gc_exists=False) == "chunked"
    assert choose_method("string", lazyfree=False, force_chunked=True, gc_exists=False) == "unlink"
    assert choose_method("none", lazyfree=False, force_chunked=False, gc_exists=True) == "resume"
    assert choose_method("none", lazyfree=False, force_chunked=False, gc_exists=False) == "missing"


def test_slot_owner_from_cluster_nodes() -> None:
    text = ("a1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460\n"
            "b2 127.0.0.1:7002@17002 master - 0 0 2 connected 5461-10922 [5000->-a1]\n"
            "c3 127.0.0.1:7004@17004 slave b2 0 0 2 connected\n"
            "d4 127.0.0.1:7003@17003 master - 0 0 3 connected 10923-16383\n")
    assert parse_slot_owner(text, 0) == ("127.0.0.1", 7001)
    assert parse_slot_owner(text, 6000) == ("127.0.0.1", 7002)
    assert parse_slot_owner(text, 16383) == ("127.0.0.1", 7003)


def test_key_name_lint_groups_by_prefix() -> None:
    lint = NameLint(max_length=20)
    for key in [b"nonamespace", b"bad:with space", b"bad:new\nline", b"ok:user:1", b"long:" + b"x" * 30,
                b"style:userName:1", b"style:user_name:2", b"style:user_name:3", b"trade:order:1"]:
        lint.add(key)
    got = {(f.rule, f.data["prefix"]): f.data["count"] for f in lint.findings("n1")}
    assert got == {("key-namespace", "(none)"): 1, ("key-special-chars", "bad"): 2, ("key-length", "long"): 1,
                   ("key-case-style", "style"): 1}
    assert prefix_of(b"a:b") == "a" and prefix_of(b"ab") == "(none)"
    assert [case_style(s) for s in ("userName", "user_name", "user-name", "UserName", "USER", "order", "42")] == [
        "camel", "snake", "kebab", "pascal", "upper", None, None]


def test_big_key_thresholds_are_strictly_above() -> None:
    big = BigKeys(Thresholds(top=2))
    big.add_batch("string", [b"s:ok", b"s:big"], [10240, 10241])
    big.add_batch("set", [b"a:ok", b"a:big", b"a:small"], [5000, 5001, 3])
    assert sorted(b.key for b in big.big) == [b"a:big", b"s:big"]
    assert [(b.type, b.key) for b in big.top_keys()] == [("string", b"s:big"), ("string", b"s:ok"),
                                                         ("set", b"a:big"), ("set", b"a:ok")]
    found = {f.rule: f for f in big.findings("n1")}
    assert found["bigkey-string"].severity == "medium" and "opsctl bigkey delete" in found["bigkey-string"].fix


def test_big_keys_in_batches_match_one_key_at_a_time() -> None:
    """A batch with nothing big nor for the top-N is skipped whole (max() in C): the result is the same as key
    by key, ties included (the first key seen of a size keeps its place)."""
    import random

    rng = random.Random(7)
    sizes = [rng.choice([1, 1, 1, 5, 80, 10240, 10241, rng.randrange(20000)]) for _ in range(5000)]
    keys = [b"k:%d" % i for i in range(len(sizes))]
    batched, single = BigKeys(Thresholds(top=5)), BigKeys(Thresholds(top=5))
    for at in range(0, len(keys), 250):
        batched.add_batch("string", keys[at:at + 250], sizes[at:at + 250])
    for key, size in zip(keys, sizes, strict=True):
        single.add_batch("string", [key], [size])
    assert (batched.big, batched.top, batched.totals, batched.counts) == (
        single.big, single.top, single.totals, single.counts)
    with pytest.raises(ValueError, match="2 keys, 1 sizes"):
        batched.add_batch("string", [b"a", b"b"], [1])


def test_audit_imports_no_client_library() -> None:
    """What `opsctl audit` runs, imported: discovery, the node checks and the scan talk raw RESP
    (opsctl.net.rawpipe), so
    no redis-py, cryptography or asyncio; a bigkeys audit loads no renderer either (only the config check
    compares rendered directives), nor the observer's machinery."""
    import subprocess
    import sys

    code = ("import sys, opsctl.cli.main, opsctl.cli.commands.audit, opsctl.audit.survey, "
            "opsctl.audit.formats, opsctl.state.specfile, "
            "opsctl.state.localdirs, opsctl.net.connector; print(' '.join(sorted(sys.modules)))")
    modules = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 check=True).stdout.split())
    unwanted = sorted(m for m in modules if m.split(".")[0] in ("redis", "pydantic", "cryptography", "asyncio")
                      or m.startswith(("opsctl.render", "opsctl.audit.probe", "opsctl.audit.bigdelete",
                                       "opsctl.net.observer")))
    assert not unwanted, unwanted


def test_expiries_share_and_clustering() -> None:
    exp = Expiries(Thresholds(no_ttl_min_keys=3, expiry_cluster_keys=3))
    exp.add_batch([b"a:1", b"a:2", b"a:3", b"b:1", b"b:2", b"b:3", b"c:1"], [-1, -1, -1, 5000, 5100, 5999, -2])
    rules = [(f.rule, f.data.get("prefix", f.data.get("second"))) for f in exp.findings("n")]
    assert rules == [("ttl-missing", "a"), ("ttl-clustered", 5)]


def test_hot_keys_and_skew() -> None:
    hot = HotKeys(Thresholds(top=2, hot_freq=100))
    hot.add_batch([b"a", b"b", b"c"], [5, 200, 120])
    assert [f.data["key"] for f in hot.findings("n")] == ["b", "c"]
    mb = 1024 * 1024
    assert [f.node for f in shard_skew({"s1": 500 * mb, "s2": 100 * mb, "s3": 110 * mb})] == ["s1"]
    assert shard_skew({"s1": 3 * mb, "s2": 1 * mb}) == []


def test_config_drift_normalises_sizes_quotes_and_order() -> None:
    assert size_bytes("64mb") == 64 * 1024 * 1024 and size_bytes("1g") == 10**9 and size_bytes("x") is None
    expected = [("maxmemory", "64mb"), ("bind", "127.0.0.2 127.0.0.1"), ("appendfilename", '"x.aof"'),
                ("lazyfree-lazy-expire", "yes"), ("requirepass", '"***"'), ("save", "900 1 300 10")]
    live = {"maxmemory": "67108864", "bind": "127.0.0.1 127.0.0.2", "lazyfree-lazy-expire": "no",
            "requirepass": "secret", "save": "900 1  300 10"}
    drift = config_drift("n1", expected, live)
    assert [(f.rule, f.severity, f.data["directive"]) for f in drift] == [("lazyfree", "high", "lazyfree-lazy-expire")]
    assert "secret" not in json.dumps([f.as_dict() for f in drift])


def test_dangerous_command_probes() -> None:
    assert command_available("ERR wrong number of arguments for 'keys' command")
    assert command_available("ERR syntax error")
    assert not command_available("ERR unknown command 'KEYS', with args beginning with:")
    assert not command_available("NOPERM User opsctl has no permissions to run the 'keys' command")
    assert not command_available("ERR DEBUG command not allowed.")
    checked = probes(["FLUSHALL", "KEYS"], {"CONFIG": "SECRET_CFG"})
    assert [(p.command, p.args) for p in checked] == [("FLUSHALL", ("opsctl-probe", "x", "y")), ("KEYS", ()),
                                                      ("CONFIG", ("HELP",))]
    found = probe_findings("n", {"KEYS": "ERR wrong number of arguments", "FLUSHALL": "ERR unknown command",
                                 "CONFIG": None}, checked)
    assert [f.data["command"] for f in found] == ["KEYS", "CONFIG"]
    assert "SECRET_CFG" not in json.dumps([f.as_dict() for f in found])


def test_auth_checks() -> None:
    assert auth_findings("n", "NOAUTH Authentication required.", ["on", "sanitize-payload"], False) == []
    assert [f.rule for f in auth_findings("n", None, ["on", "nopass"], True)] == ["auth", "default-user", "auth"]


def test_memory_and_slowlog() -> None:
    row = {"node": "n", "used_memory": 950, "maxmemory": 1000, "used_share": 0.95, "fragmentation": 1.0,
           "clients": 9, "maxclients": 10}
    assert [(f.rule, f.severity) for f in memory_findings(row)] == [("memory-headroom", "high"), ("clients", "medium")]
    rows = slowlog_rows("n", [[1, 0, 20000, [b"HGETALL", b"user:secret"], "", ""], [2, 0, 15000, ["hgetall", "k"]],
                              [3, 0, 12000, ["SMEMBERS", "k"]]])
    assert rows[0] == {"node": "n", "command": "HGETALL", "count": 2, "max_us": 20000, "total_us": 35000}
    assert "user:secret" not in json.dumps(rows)


def _live(name: str, role: str, master: str | None = None, linked: bool = True) -> LiveNode:
    port = {"m1": 1, "r1": 2, "m2": 3}[name]
    return LiveNode(Node(name, "h", "127.0.0.1", port, "master"), role, master, linked)


def test_roles_and_scan_targets() -> None:
    assert role_summary(["master", 10, []]) == ("master", None, True)
    assert role_summary(["slave", "127.0.0.1", 7001, "connected", 5]) == ("replica", "127.0.0.1:7001", True)
    live = [_live("m1", "master"), _live("r1", "replica", "127.0.0.1:1"), _live("m2", "master")]
    targets, problems = scan_targets(live, allow_masters=False)
    assert [t.node.name for t in targets] == ["r1"] and [p.node for p in problems] == ["m2"]
    targets, problems = scan_targets(live, allow_masters=True)
    assert [t.node.name for t in targets] == ["m2", "r1"] and problems == []


def test_findings_cite_rules_and_reports_render() -> None:
    assert all(rule.source.startswith(SOURCES) and "seeds/" not in rule.source for rule in RULES.values())
    items = [finding("key-special-chars", "medium", "n1", "prefix <b>: 1 key", "rename", prefix="<b>"),
             finding("hotkey", "info", "n1", "not measured", "use lfu")]
    assert len(at_or_above(items, "low")) == 1
    report = {"spec": "s", "checks": ["keys"], "stats": {}, "findings": [f.as_dict() for f in items],
              "tables": {"ttl": [{"prefix": "a", "keys": 3}]}}
    assert "[MEDIUM  ] key-special-chars  n1" in render(report, items, "table")
    assert json.loads(render(report, items, "json"))["findings"][0]["source"].startswith(BEST_PRACTICES)
    page = render(report, items, "html")
    assert "&lt;b&gt;" in page and "<b>" not in page


@pytest.mark.parametrize(("spent", "now", "delay"), [(100, 0.5, 0.5), (100, 2.0, 0.0), (0, 0.0, 0.0)])
def test_throttle(spent: int, now: float, delay: float) -> None:
    assert throttle_delay(0.0, spent, 100.0, now) == pytest.approx(delay)
    assert throttle_delay(0.0, spent, None, now) == 0.0


def test_keys_with_any_byte_and_replies_split_across_reads() -> None:
    keys = [b"k%d" % i for i in range(12)] + [b"evil\r\n$3\r\nkey", b""]
    buf = encode(keys) + b":7\r\n-ERR no\r\n:0\r\n"
    assert replies(buf) == [keys, 7, RespError("ERR no"), 0]
    parse = reader()
    out = []
    for at in range(0, len(buf), 5):  # fed in small pieces, as a socket may deliver them
        parse.feed(buf[at:at + 5])
        while (reply := parse.gets()) is not INCOMPLETE:
            out.append(reply)
    assert out == [keys, 7, RespError("ERR no"), 0]
