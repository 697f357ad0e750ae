"""The pure parts of a live migration: which keys a replicated command touches, what is refused, how a command
splits across target shards, and expiries moved to the target's clock."""

from __future__ import annotations

import pytest

from opsctl.stream.touched import absolute_expiry, classify, command_keys, split


def args(*words: str) -> tuple[bytes, ...]:
    return tuple(w.encode() for w in words)


@pytest.mark.parametrize("command, keys", [
    (("SET", "k", "v", "PXAT", "1"), ("k",)),
    (("DEL", "a", "b", "c"), ("a", "b", "c")),
    (("MSET", "a", "1", "b", "2"), ("a", "b")),
    (("RENAME", "a", "b"), ("a", "b")),
    (("BITOP", "AND", "d", "x", "y"), ("d", "x", "y")),
    (("ZUNIONSTORE", "d", "2", "x", "y", "WEIGHTS", "1", "2"), ("d", "x", "y")),
    (("XGROUP", "CREATE", "s", "g", "$"), ("s",)),
    (("HSETEX", "h", "PXAT", "1", "FIELDS", "1", "f", "v"), ("h",)),
])
def test_keys_of_replicated_commands(command, keys) -> None:
    assert command_keys(command[0].encode(), args(*command)) == args(*keys)
    assert classify(args(*command)).action == "apply"


def test_what_is_skipped_selected_grouped_or_refused() -> None:
    assert classify(args("PING")).action == "skip" and classify(args("REPLCONF", "GETACK", "*")).action == "skip"
    assert classify(args("PUBLISH", "c", "m")).action == "skip"
    assert classify(args("SELECT", "3")).db == 3
    assert classify(args("MULTI")).action == "multi" and classify(args("exec")).action == "exec"
    for refused in (("FLUSHALL",), ("FLUSHDB", "ASYNC"), ("SWAPDB", "0", "1"), ("FUNCTION", "LOAD", "x")):
        assert classify(args(*refused)).action == "refuse"
    unknown = classify(args("JSON.SET", "k", "$", "1"))
    assert unknown.action == "refuse" and "JSON.SET" in unknown.why


def test_per_key_commands_split_by_target() -> None:
    assert split(args("DEL", "a", "b", "c"), [0, 1, 0]) == {0: args("DEL", "a", "c"), 1: args("DEL", "b")}
    assert split(args("MSET", "a", "1", "b", "2"), [1, 0]) == {1: args("MSET", "a", "1"), 0: args("MSET", "b", "2")}


@pytest.mark.parametrize("command, expected", [
    (("SET", "k", "EX", "PXAT", "1000"), ("SET", "k", "EX", "PXAT", "1100")),  # a value that reads EX stays
    (("SET", "k", "v", "EX", "10"), ("SET", "k", "v", "PXAT", "15100")),
    (("SETEX", "k", "10", "v"), ("SET", "k", "v", "PXAT", "15100")),
    (("PSETEX", "k", "10", "v"), ("SET", "k", "v", "PXAT", "5110")),
    (("EXPIRE", "k", "2"), ("PEXPIREAT", "k", "7100")),
    (("PEXPIREAT", "k", "9000"), ("PEXPIREAT", "k", "9100")),
    (("EXPIREAT", "k", "9"), ("PEXPIREAT", "k", "9100")),
    (("RESTORE", "k", "9000", "payload", "ABSTTL"), ("RESTORE", "k", "9100", "payload", "ABSTTL")),
    (("RESTORE", "k", "10", "payload", "REPLACE"), ("RESTORE", "k", "5110", "payload", "REPLACE", "ABSTTL")),
    (("RESTORE", "k", "0", "payload"), ("RESTORE", "k", "0", "payload")),
    (("HPEXPIREAT", "h", "9000", "FIELDS", "1", "f"), ("HPEXPIREAT", "h", "9100", "FIELDS", "1", "f")),
    (("HSETEX", "h", "PXAT", "9000", "FIELDS", "1", "EX", "v"), ("HSETEX", "h", "PXAT", "9100", "FIELDS", "1", "EX",
                                                                  "v")),
    (("INCR", "k"), ("INCR", "k")),
])
def test_expiries_become_absolute_in_the_targets_clock(command, expected) -> None:
    assert absolute_expiry(args(*command), 100, 5000) == args(*expected)


def test_a_cutover_without_a_running_migration_says_so(tmp_path, capsys) -> None:
    from tests.lifecycle import run
    from tests.support import make_spec, write_spec

    spec = write_spec(tmp_path, make_spec("standalone"))
    code, out, err = run(capsys, "migrate", "cutover", "-f", str(spec), "--state-dir", str(tmp_path / "state"))
    assert code == 1 and "no migration into" in err and "opsctl migrate -f" in err, out + err
    assert not (tmp_path / "state" / "migrate-cutover.request").exists()
