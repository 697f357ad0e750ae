"""The pure parts of a migration from a store opsctl did not deploy (--from-endpoints): the layout from what its
servers say, the options refused before anything is touched, and the journal keeping the source's options and a
cutover's fence across a kill."""

from __future__ import annotations

import json
import os

import pytest

from opsctl.base.errors import OpsctlError
from opsctl.migrate.foreign import (
    ForeignSource,
    cluster_layout_of,
    parse_endpoints,
    replicas_of,
    replication_layout_of,
)
from opsctl.migrate.phases import Journal, ShardState, journal_json, parse_journal
from opsctl.observe.replies import parse_cluster_nodes
from opsctl.stream.framing import Position
from tests.lifecycle import run

SECRET = "foreign-pw-5e0b7c1d93a4"

NODES = """\
a1 10.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-8191
a2 10.0.0.2:7001@17001 master - 0 0 2 connected 8192-16383
b1 10.0.0.3:7002@17002 slave a1 0 0 1 connected
b2 10.0.0.4:7003@17003 slave a2 0 0 2 connected
b3 10.0.0.5:7004@17004 slave,fail a2 0 0 2 disconnected
"""


def test_a_cluster_source_becomes_one_shard_per_master_with_its_live_replicas() -> None:
    layout = cluster_layout_of(parse_cluster_nodes(NODES))
    assert [(s.index, layout.node(s.master).endpoint, [layout.node(r).endpoint for r in s.replicas])
            for s in layout.shards] == [(1, "10.0.0.1:7000", ["10.0.0.3:7002"]),
                                        (2, "10.0.0.2:7001", ["10.0.0.4:7003"])]


def test_a_replication_source_lists_online_replicas_that_listen() -> None:
    info = {"role": "master", "slave0": "ip=10.0.0.2,port=7001,state=online,offset=5,lag=0",
            "slave1": "ip=10.0.0.9,port=0,state=online,offset=5,lag=0",  # a stream reader such as opsctl's
            "slave2": "ip=10.0.0.3,port=7002,state=wait_bgsave,offset=0,lag=0"}
    assert replicas_of(info) == [("10.0.0.2", 7001)]
    layout = replication_layout_of(("10.0.0.1", 7000), replicas_of(info))
    assert [n.role for n in layout.servers] == ["master", "replica"] and len(layout.shards) == 1


def test_the_source_options_kept_for_a_rerun_hold_no_secret() -> None:
    source = ForeignSource(parse_endpoints("10.0.0.1:7000, [::1]:7001"), password_env="SRC_PW", user="mover",
                           tls_ca="ca.pem", tls_cert="/etc/c.pem", tls_key="/etc/k.pem")
    assert source.ref() == {"from_endpoints": "10.0.0.1:7000,[::1]:7001", "from_password_env": "SRC_PW",
                            "from_user": "mover", "from_tls_ca": os.path.abspath("ca.pem"),
                            "from_tls_cert": "/etc/c.pem", "from_tls_key": "/etc/k.pem"}


def test_the_journal_keeps_the_source_options_and_the_fence() -> None:
    journal = Journal("ab12", "endpoints:10.0.0.1:7000", source_ref={"from_spec": "/x/old.yaml"},
                      fence={"10.0.0.1:7000": {"min-replicas-to-write": "0", "min-replicas-max-lag": "10"}})
    journal.shards["shard-1"] = ShardState("stream", Position("f" * 40, 123))
    back = parse_journal(journal_json(journal), "j")
    assert back == journal
    old = parse_journal('{"id": "x", "source": "s", "shards": {}}', "j")  # a journal written before these fields
    assert old.fence is None and old.source_ref == {}


def test_endpoint_options_refused_clearly(tmp_path, capsys) -> None:
    """Bad --from-endpoints input: exit 1, what and how to fix, no traceback, nothing written, no secret shown."""
    from tests.support import make_spec, write_spec

    spec = write_spec(tmp_path, make_spec("standalone"))
    state = str(tmp_path / "state")
    base = ["migrate", "-f", str(spec), "--state-dir", state, "--auto-approve"]
    cases = [
        (["--from-endpoints", "nohost"], "is not HOST:PORT"),
        (["--from-endpoints", "127.0.0.1:1"], "exactly one of --from-password-file"),
        (["--from-endpoints", "127.0.0.1:1", "--from-password-env", "OPSCTL_T_UNSET_VAR"], "not set or empty"),
        (["--from-endpoints", "127.0.0.1:1", "--from-password-file", str(tmp_path / "none")], "missing or empty"),
        (["--from", str(spec), "--from-endpoints", "127.0.0.1:1"], "needs one source"),
    ]
    good = tmp_path / "good.pw"
    good.write_text(SECRET)
    good.chmod(0o600)
    with_password = ["--from-endpoints", "127.0.0.1:1", "--from-password-file", str(good)]
    cases += [
        ([*with_password, "--from-tls-cert", str(good)], "--from-tls-cert and --from-tls-key go together"),
        ([*with_password, "--from-tls-cert", str(good), "--from-tls-key", str(good)], "needs --from-tls-ca"),
        ([*with_password, "--from-tls-ca", str(tmp_path / "no-ca.pem")], "no-ca.pem: no such file"),
        (["--from", str(spec), "--from-tls-ca", str(good)], "go with --from-endpoints, not --from"),
        (["--from", str(spec), "--from-password-file", str(good)], "go with --from-endpoints, not --from"),
    ]
    loose = tmp_path / "loose.pw"
    loose.write_text(SECRET)
    loose.chmod(0o644)
    cases.append((["--from-endpoints", "127.0.0.1:1", "--from-password-file", str(loose)], "open to group or others"))
    for extra, words in cases:
        code, out, err = run(capsys, *base, *extra)
        assert code == 1 and words in err and "internal error" not in err and SECRET not in out + err, (extra, err)
    os.environ["OPSCTL_T_SECRET_VAR"] = SECRET
    try:
        code, out, err = run(capsys, *base, "--from-endpoints", "127.0.0.1:1", "--from-password-env",
                             "OPSCTL_T_SECRET_VAR")
    finally:
        del os.environ["OPSCTL_T_SECRET_VAR"]
    assert code == 1 and "no endpoint of the source answers" in err and SECRET not in out + err, out + err
    assert not (tmp_path / "state" / "migrate-journal.json").exists()


# The journal as the code before the typed record (5590220) wrote it: a streaming shard with its time, a shard in
# its snapshot (no time), the source options and a fence.
OLD_JOURNAL = ('{\n "id": "ab12",\n "source": "endpoints:10.0.0.1:7000",\n "finished": false,\n "shards": {\n'
               '  "shard-1": {\n   "phase": "stream",\n   "replid": "' + "f" * 40 + '",\n   "offset": 123,\n'
               '   "at": 1765000000.5\n  },\n  "shard-2": {\n   "phase": "snapshot",\n   "replid": "' + "e" * 40
               + '",\n   "offset": 0\n  }\n },\n "source_ref": {\n  "from_spec": "/x/old.yaml"\n },\n "fence": {\n'
               '  "10.0.0.1:7000": {\n   "min-replicas-to-write": "0"\n  }\n }\n}')


def test_a_journal_the_previous_code_wrote_is_read_and_written_the_same() -> None:
    journal = parse_journal(OLD_JOURNAL, "j")
    assert journal.shards["shard-1"] == ShardState("stream", Position("f" * 40, 123), 1765000000.5)
    assert journal.shards["shard-2"] == ShardState("snapshot", Position("e" * 40, 0))
    assert journal.fence == {"10.0.0.1:7000": {"min-replicas-to-write": "0"}}
    assert journal_json(journal) == OLD_JOURNAL


@pytest.mark.parametrize(("edit", "named"), [
    ({"id": 7}, "id: expected a string, found whole number"),
    ({"shards": {"s1": {"phase": "stream", "replid": "f" * 40, "offset": True}}}, "shards.s1.offset: expected a whole"),
    ({"shards": {"s1": {"phase": "stream", "replid": "short", "offset": 1}}}, "shards.s1.replid: is not a replica"),
    ({"shards": {"s1": {"phase": "stream", "replid": "f" * 40, "offset": 1, "at": -1}}}, "shards.s1.at: is not a"),
    ({"fence": {"10.0.0.1:7000": {"min-replicas-to-write": 0}}}, "fence.10.0.0.1:7000.min-replicas-to-write: "),
    ({"source_ref": {"file": "/etc/other.yaml"}}, "source_ref: names an option"),
    ({"extra": 1}, "unknown field 'extra'"),
])
def test_a_damaged_journal_names_the_file_and_the_field(tmp_path, edit, named) -> None:
    """Read as every command reads it (read_journal): an error of exit code 1 naming the file and the field."""
    from opsctl.migrate.phases import JOURNAL, read_journal

    data = {**json.loads(OLD_JOURNAL), **edit}
    (tmp_path / JOURNAL).write_text(json.dumps(data))
    with pytest.raises(OpsctlError) as caught:
        read_journal(tmp_path)
    assert caught.value.summary.startswith(f"{tmp_path / JOURNAL}: not a migration journal ({named}")
    assert caught.value.exit_code == 1 and "remove it" in caught.value.hint
