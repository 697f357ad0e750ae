"""The standby's pure parts and files (issue 36): the fence as rendered in both auth modes and lifted, the
journal's read time and the switchover record read back and checked."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from opsctl.base.errors import OpsctlError
from opsctl.migrate.migration import MigrateLag
from opsctl.migrate.phases import Journal, ShardState, journal_json, parse_journal
from opsctl.migrate.shard import ShardRun
from opsctl.render import default_paths, render_node
from opsctl.render.exporteruser import lifts
from opsctl.spec.load import load_spec
from opsctl.state.standbyfiles import (
    LAG,
    RECORD,
    StandbyStatus,
    Switched,
    check_declared,
    lag_json,
    parse_switched,
    record_switched,
    standby_status,
)
from opsctl.stream.framing import Position

SECRET = "a-long-enough-password"
BASE = {"name": "dr", "topology": "standalone", "hosts": [{"name": "h1", "address": "127.0.0.2"}],
        "auth": {"password": {"env": "P"}}, "follows": {"spec": "primary.yaml"}}
ACL = {"mode": "acl", "password": {"env": "P"}, "users": [{"name": "app", "password": {"env": "P"},
                                                             "rules": "~app:* +@all -@dangerous"}]}


def _loaded(**over: object):  # type: ignore[no-untyped-def]
    return load_spec(yaml.safe_dump({**BASE, **over}), "dr.yaml", lambda ref: SECRET)


def _line(loaded, state_dir: Path, now: float) -> str | None:  # type: ignore[no-untyped-def]
    """status's line about the standby (its text output), None when it says nothing."""
    said = standby_status(loaded, state_dir, now)
    return None if said is None else said.line()


def _users(loaded) -> list[str]:  # type: ignore[no-untyped-def]
    node = loaded.layout.servers[0]
    files = render_node(loaded, node, default_paths("/x", node)).files
    return [line for text in files.values() for line in text.splitlines() if line.startswith("user")]


def test_password_mode_fences_the_default_user_and_adds_the_follower() -> None:
    users = _users(_loaded())
    assert "user default on #*** ~* &* +@all -@write" in users and "user opsctl-follower on #*** ~* &* +@all" in users
    assert lifts(_loaded()) == [("default", ["+@write"])]
    unfenced = _users(_loaded(follows=None))
    assert not [u for u in unfenced if "default" in u or "follower" in u], unfenced


def test_acl_mode_fences_the_applications_users_not_the_admin() -> None:
    users = _users(_loaded(auth=ACL))
    assert "user app on #*** ~app:* +@all -@dangerous -flushall -flushdb -keys -@write" in users
    assert "user opsctl on #*** ~* &* +@all -flushall -flushdb -keys" in users
    assert any(u.startswith("user opsctl-follower on #*** ~* &* +@all") for u in users)
    assert lifts(_loaded(auth=ACL)) == [("app", ["-@all", "~app:*", "+@all", "-@dangerous", "-flushall", "-flushdb",
                                                 "-keys"])]


def test_the_journal_keeps_when_the_stream_was_read_and_checks_it() -> None:
    journal = Journal("ab12", "src", {"shard-1": ShardState("stream", Position("r" * 40, 1234), 1765000000.5)})
    assert parse_journal(journal_json(journal), "j").shards["shard-1"].at == 1765000000.5
    text = journal_json(journal).replace("1765000000.5", "-1")
    with pytest.raises(OpsctlError, match="not a migration journal"):
        parse_journal(text, "j")


def test_a_switched_standby_that_still_follows_is_refused_and_an_apply_without_follows_acknowledges_it(
        tmp_path: Path) -> None:
    assert "is a standby of primary.yaml" in (check_declared(_loaded(), tmp_path) or "")
    record_switched(tmp_path, Switched(1765000000.0, "'orders'", "planned"))
    assert (tmp_path / RECORD).stat().st_mode & 0o777 == 0o600
    with pytest.raises(OpsctlError, match="switched over") as caught:
        check_declared(_loaded(), tmp_path)
    assert "remove follows: from the spec" in (caught.value.hint or "")
    assert check_declared(_loaded(follows=None), tmp_path) is None and (tmp_path / RECORD).exists()  # plan: kept
    assert check_declared(_loaded(follows=None), tmp_path, applying=True) is None
    assert not (tmp_path / RECORD).exists()


@pytest.mark.parametrize("text", ["{}", "[]", '{"switched_over_at": 1, "primary": "p", "mode": "sideways"}', "x"])
def test_a_bad_record_is_refused_by_name(text: str) -> None:
    with pytest.raises(OpsctlError, match="not a standby record"):
        parse_switched(text, "standby.json")


def test_status_says_following_with_the_lag_not_following_or_switched(tmp_path: Path) -> None:
    loaded = _loaded()
    assert "not following (opsctl follow -f dr.yaml)" in (_line(loaded, tmp_path, 1000.0) or "")
    shards = {"shard-1": {"phase": "stream", "lag_bytes": 120, "lag_seconds": 0.25, "applied": 9},
              "shard-2": {"phase": "snapshot", "copied": 500}}
    (tmp_path / LAG).write_text(lag_json(990.0, "'orders'", shards))
    assert _line(loaded, tmp_path, 1000.0) == ("standby of primary.yaml: following, shard-1 stream lag 120B "
                                               "0.25s, shard-2 snapshot 500 keys copied (10.0s ago)")
    assert "not following, last report 60s ago" in (_line(loaded, tmp_path, 1050.0) or "")
    (tmp_path / LAG).write_text("{not json")
    assert "not following (" in (_line(loaded, tmp_path, 1000.0) or "")
    assert _line(_loaded(follows=None), tmp_path, 1000.0) is None
    record_switched(tmp_path, Switched(0.0, "'orders'", "primary-lost"))
    assert "switched over from 'orders' (primary-lost" in (_line(_loaded(follows=None), tmp_path, 1.0) or "")


def test_the_standby_record_status_carries_from_a_lag_file(tmp_path: Path) -> None:
    """status's result carries the standby's state as a record (its JSON under "standby"), not only as the text
    line: following (per shard phase, lag, copied, applied; an unknown lag null, never -1), not following (the
    last report's age, or none), switched over (from whom, mode, when); None for a spec that is no standby."""
    from opsctl.status.looks import StatusResult

    loaded = _loaded()
    shards = {"shard-1": {"phase": "stream", "lag_bytes": 120, "lag_seconds": 0.25, "applied": 9},
              "shard-2": {"phase": "stream", "lag_bytes": -1, "lag_seconds": 0.0, "applied": 4},
              "shard-3": {"phase": "snapshot", "copied": 500}}
    (tmp_path / LAG).write_text(lag_json(990.0, "'orders'", shards))
    said = standby_status(loaded, tmp_path, 1000.0)
    assert said is not None and said.to_dict() == {
        "state": "following", "primary": "primary.yaml", "mode": None, "switched_at": None, "report_age": 10.0,
        "shards": {"shard-1": {"phase": "stream", "lag_bytes": 120, "lag_seconds": 0.25, "copied": 0, "applied": 9},
                   "shard-2": {"phase": "stream", "lag_bytes": None, "lag_seconds": None, "copied": 0, "applied": 4},
                   "shard-3": {"phase": "snapshot", "lag_bytes": None, "lag_seconds": None, "copied": 500,
                               "applied": 0}},
        "hint": None}
    result = StatusResult("dr", "standalone", True, "standalone healthy", (), None, said)
    assert result.to_dict()["standby"] == said.to_dict()
    assert result.text().splitlines()[-1] == said.line()  # the text output: the same line as before
    assert StatusResult("dr", "standalone", True, "ok", (), None).to_dict()["standby"] is None
    stale = standby_status(loaded, tmp_path, 1060.0)
    assert stale is not None and (stale.state, stale.report_age, stale.shards, stale.hint) == (
        "not-following", 70.0, (), "opsctl follow -f dr.yaml")
    for bad in ('{"at": 990, "shards": {"shard-1": {"phase": "sideways"}}}',
                '{"at": 990, "shards": {"shard-1": {"phase": "stream", "lag_bytes": "120"}}}',
                '{"at": 990, "shards": []}'):
        (tmp_path / LAG).write_text(bad)  # a file read back is checked: a wrong one is no report
        wrong = standby_status(loaded, tmp_path, 1000.0)
        assert wrong is not None and (wrong.state, wrong.report_age) == ("not-following", None), bad
    record_switched(tmp_path, Switched(86400.0, "'orders'", "planned"))
    assert standby_status(_loaded(follows=None), tmp_path, 1.0) == StandbyStatus("switched-over", "'orders'",
                                                                                  "planned", 86400.0)


def test_status_and_the_lag_line_never_show_a_cut_link_as_current(tmp_path: Path) -> None:
    """A split from the primary: its lag is unknown (-1), not "-1B"; a shard whose link was lost is attaching
    again, not "0 keys copied" (the lag line and status said both as if the standby were current)."""
    from opsctl.migrate.migration import MigrateLag

    shards = {"shard-1": {"phase": "stream", "lag_bytes": -1, "lag_seconds": 0.0, "applied": 9},
              "shard-2": {"phase": "attach", "copied": 0, "applied": 4}}
    (tmp_path / LAG).write_text(lag_json(990.0, "'orders'", shards))
    assert _line(_loaded(), tmp_path, 1000.0) == (
        "standby of primary.yaml: following, shard-1 stream lag unknown (the primary does not answer), shard-2 "
        "attach (link lost: attaching again from the journaled offset, no copy) (10.0s ago)")
    assert MigrateLag(shards).line() == ("shard-1: lag unknown (the source does not answer) 0.00s, 9 applied  "
                                         "shard-2: attaching again (link lost), 4 applied")


def test_a_shard_whose_link_was_lost_is_attaching_again_not_copying(tmp_path: Path) -> None:
    """A failover (or a restart) mid-stream: the shard attaches again from its journaled offset. Its progress, the
    status line and the lag report say so; before, they said `snapshot, 0 keys copied` (a copy from scratch)."""
    run = ShardRun("shard-1", [], None, None, None, tmp_path, 0, 0.0)  # type: ignore[arg-type]
    assert run.phase == "snapshot"  # copying: no stream followed yet
    run.streaming = run.followed = True
    assert run.phase == "stream"
    run.streaming = False  # the link lost
    assert run.phase == "attach"
    shards = {"shard-1": {"phase": "attach", "copied": 0, "applied": 9}}
    assert MigrateLag(shards).line() == "shard-1: attaching again (link lost), 9 applied"
    (tmp_path / LAG).write_text(lag_json(990.0, "'orders'", shards))
    assert _line(_loaded(), tmp_path, 1000.0) == (
        "standby of primary.yaml: following, shard-1 attach (link lost: attaching again from the journaled offset, "
        "no copy) (10.0s ago)")
