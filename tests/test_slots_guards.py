"""Pure guards of slot moves: endpoint verdicts and shard masters, the journal's shape checks, the topology
lock's markers, MIGRATE timeouts under the node timeout, backoff."""

from __future__ import annotations

import json

import pytest

from opsctl.base.errors import OpsctlError, RefusedError
from opsctl.net.quorum import Marker, live_others, marker_name, parse_markers
from opsctl.observe.replies import parse_cluster_nodes
from opsctl.slots.batching import backoff, base_timeout_ms, batches
from opsctl.slots.journal import Journal, parse_lines
from opsctl.slots.moveguard import DOWN, OK, REPLACED, flagged_ids, shard_master, verdict

T, R, S = "10.0.0.2:7001", "10.0.0.3:7002", "10.0.0.1:7000"
SHARD = {T, R}


def view(*lines: str) -> list:
    return parse_cluster_nodes("\n".join(lines))


def line(node_id: str, endpoint: str, flags: str, master: str = "-", epoch: int = 1, slots: str = "") -> str:
    return f"{node_id} {endpoint}@1{endpoint[-4:]} {flags} {master} 0 0 {epoch} connected {slots}".strip()


def test_target_verdicts_ok_down_replaced():
    own = view(line("t", T, "myself,master", slots="0-99"), line("r", R, "slave", "t"))
    healthy = view(line("s", S, "myself,master"), line("t", T, "master", slots="0-99"), line("r", R, "slave", "t"))
    assert verdict(T, own, healthy, SHARD) == OK
    assert verdict(T, None, healthy, SHARD) == DOWN  # stalled: no answer in time
    pfail = view(line("s", S, "myself,master"), line("t", T, "master,fail?", slots="0-99"), line("r", R, "slave", "t"))
    assert verdict(T, own, pfail, SHARD) == DOWN
    promoted = view(line("s", S, "myself,master"), line("t", T, "master,fail"),
                    line("r", R, "master", epoch=7, slots="0-99"))
    assert verdict(T, None, promoted, SHARD) == REPLACED
    assert verdict(T, own, promoted, SHARD) == REPLACED  # woke up still believing it is the master
    demoted = view(line("t", T, "myself,slave", "r"), line("r", R, "master", epoch=7, slots="0-99"))
    assert verdict(T, demoted, healthy, SHARD) == REPLACED


def test_a_split_shard_replaces_only_the_older_epoch():
    """The stalled master kept the slots it was given just before its replica took over (the replica claims only
    what it knew): both serve slots for good. The promoted one (newer epoch) is the shard's master, as
    shard_master says; the run goes on with it, and the older one's slots are merged into it."""
    split = view(line("s", S, "myself,master", slots="100-200"), line("t", T, "master", epoch=7, slots="2478-2509"),
                 line("r", R, "master", epoch=8, slots="0-99"))
    own_r = view(line("r", R, "myself,master", epoch=8, slots="0-99"), line("t", T, "master", epoch=7, slots="1"))
    assert verdict(R, own_r, split, SHARD) == OK
    own_t = view(line("t", T, "myself,master", epoch=7, slots="2478-2509"), line("r", R, "master", epoch=8, slots="0"))
    assert verdict(T, own_t, split, SHARD) == REPLACED
    mine = {"t": split[1], "r": split[2]}
    assert shard_master(["t", "r"], mine, set()) == "r"


def test_shard_master_skips_flagged_and_prefers_slots_then_epoch():
    mine = {"t": view(line("t", T, "myself,master", epoch=3, slots="0-9"))[0],
            "r": view(line("r", R, "myself,master", epoch=7, slots="0-9"))[0]}
    assert shard_master(["t", "r"], mine, set()) == "r"
    assert shard_master(["t", "r"], mine, {"r"}) == "t"
    assert shard_master(["t", "r"], {"t": None, "r": None}, set()) is None
    views = {"s": view(line("s", S, "myself,master"), line("t", T, "master,fail"))}
    assert flagged_ids(views) == {"t"}


def test_migrate_timeout_stays_under_half_the_node_timeout_and_backoff_is_bounded():
    assert base_timeout_ms(2000) == 1000 and base_timeout_ms(60000) == 10000 and base_timeout_ms(100) == 200
    assert batches([b"k"], [10], base_ms=1000)[0].timeout_ms == 1000
    assert [backoff(n, 0.1, 1.0) for n in (1, 2, 3, 5, 9)] == [0.1, 0.2, 0.4, 1.0, 1.0]


GOOD_OPEN = {"op": "open", "source": "a", "source_id": "x", "target": "b", "target_id": "y", "slots": [[1, 2]]}


@pytest.mark.parametrize("entry, problem", [
    ([1, 2], "not a JSON object"),
    ({"op": "move", "slots": []}, "unknown op"),
    ({"op": "close", "slots": [[5, 2]]}, "slots must be"),
    ({"op": "close", "slots": [[0, 16384]]}, "slots must be"),
    ({"op": "close", "slots": "0-9"}, "slots must be"),
    ({**GOOD_OPEN, "source": 7}, "'source'"),
    ({**GOOD_OPEN, "mode": "teleport"}, "unknown mode"),
    ({"op": "fill", "shard": 0, "master": "t-7"}, "a fill entry needs a shard number"),
    ({"op": "fill", "shard": "4", "master": "t-7"}, "a fill entry needs a shard number"),
    ({"op": "fill", "shard": 4}, "non-empty string 'master'"),
    ({"op": "filled", "shards": [4, True]}, "a filled entry needs 'shards'"),
])
def test_a_damaged_journal_is_a_clear_error(tmp_path, entry, problem):
    path = tmp_path / "slots-journal.jsonl"
    path.write_text(json.dumps(GOOD_OPEN) + "\n" + json.dumps(entry) + "\n")
    with pytest.raises(OpsctlError) as caught:
        Journal(tmp_path).pending()
    assert str(path) + ":2" in caught.value.summary and problem in caught.value.summary
    assert "cluster fix" in caught.value.hint


def test_a_fill_stays_open_until_an_apply_marks_it_filled_and_keeps_the_journal_meanwhile(tmp_path):
    journal = Journal(tmp_path)
    journal.filled()  # nothing open: no file written
    assert not journal.path.exists()
    journal.fill(4, "t-7")
    journal.opened("t-1", "x", "t-7", "y", [5444])
    journal.closed([5444])
    journal.compact()  # every slot closed, but shard 4 is still to fill: kept
    assert journal.filling() == [4] and journal.pending() == []
    journal.fill(5, "t-9")
    journal.fill(4, "t-7")  # each move into it says so again
    assert journal.filling() == [4, 5]
    journal.filled()
    assert not journal.path.exists() and journal.filling() == []


# The journal as the code before the typed lines (dict entries, 5590220) wrote it: every op, each with its t.
OLD_JOURNAL = (
    '{"op": "open", "source": "t-1", "source_id": "ida", "target": "t-7", "target_id": "idb", "slots": [[1, 3], '
    '[7, 7]], "mode": "atomic", "t": 1796657462.144}\n'
    '{"op": "close", "slots": [[1, 1]], "t": 1796657462.334}\n'
    '{"op": "fill", "shard": 3, "master": "t-7", "t": 1796657462.404}\n'
    '{"op": "filled", "shards": [3], "t": 1796657462.603}\n'
    '{"op": "fill", "shard": 4, "master": "t-9", "t": 1796657462.7}\n')


def test_a_journal_the_previous_code_wrote_is_read_and_written_the_same(tmp_path, monkeypatch):
    path = tmp_path / "slots-journal.jsonl"
    path.write_text(OLD_JOURNAL)
    journal = Journal(tmp_path)
    assert [(p.source, p.target, p.slots, p.mode) for p in journal.pending()] == [("t-1", "t-7", ((2, 3), (7, 7)),
                                                                                    "atomic")]
    assert journal.filling() == [4]
    fresh = Journal(tmp_path / "fresh")
    times = iter([1796657462.144, 1796657462.334, 1796657462.404, 1796657462.603, 1796657462.7])
    monkeypatch.setattr("opsctl.slots.journal.time.time", lambda: next(times))
    fresh.opened("t-1", "ida", "t-7", "idb", [1, 2, 3, 7], mode="atomic")
    fresh.closed([1])
    fresh.fill(3, "t-7")
    fresh.filled()
    fresh.fill(4, "t-9")
    assert fresh.path.read_text() == OLD_JOURNAL


@pytest.mark.parametrize("line, named", [
    ({**GOOD_OPEN, "slots": [[1, 2], [3, 16384]]}, "slots[1][1]: is not a slot from 0 to 16383"),
    ({**GOOD_OPEN, "target_id": ""}, "target_id: is empty"),
    ({**GOOD_OPEN, "t": "noon"}, "t: expected a number, found string"),
    ({**GOOD_OPEN, "extra": 1}, "unknown field 'extra'"),
    ({"op": "close"}, "slots: is missing"),
    ({"op": "filled", "shards": [4, 0]}, "shards[1]: is not a shard number from 1 to 16384"),
])
def test_a_damaged_journal_line_names_its_field(tmp_path, line, named):
    (tmp_path / "slots-journal.jsonl").write_text(json.dumps(GOOD_OPEN) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(OpsctlError) as caught:
        Journal(tmp_path).pending()
    assert f"slots-journal.jsonl:2: the slot journal is damaged: {named}" in caught.value.summary
    assert caught.value.exit_code == 1


def test_only_a_torn_last_line_is_forgiven(tmp_path):
    good = json.dumps(GOOD_OPEN)
    assert len(parse_lines([good, good[:20]], "j")) == 1
    with pytest.raises(OpsctlError, match=r"j:1: .*not JSON"):
        parse_lines([good[:20], good], "j")
    link = tmp_path / "slots-journal.jsonl"
    link.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OpsctlError, match="symbolic link"):
        Journal(tmp_path).pending()
    (tmp_path / "j2").mkdir()
    (tmp_path / "j2" / "slots-journal.jsonl").write_bytes(b"\xff\xfe")
    with pytest.raises(OpsctlError, match="not UTF-8"):
        Journal(tmp_path / "j2").pending()


def test_lock_markers_parse_and_expire_by_the_servers_idle_not_a_clock():
    listing = (f"id=7 addr=1.2.3.4:5 name={marker_name('t1', 4, 'ops@h/pid9', 29.5)} age=1 idle=3\n"
               "id=8 addr=1.2.3.4:6 name= age=1 idle=0\nid=9 addr=x name=opsctl-lock:bad age=1 idle=0\n"
               f"id=10 addr=x name={marker_name('t1', 3, 'old@h/pid2', 30)} age=99 idle=31\n"
               "id=12 addr=x name=opsctl-lock:t1:x:me@h/pid1:30 age=1 idle=0\n"
               "id=13 addr=x name=opsctl-lock:before@h/pid3:30 age=1 idle=2\n"  # an opsctl before epochs
               f"id=11 addr=x name={marker_name('t1', 5, 'me@h/pid1', 30)} age=1 idle=0")
    markers = parse_markers(listing, "n1")
    assert markers == [Marker("ops@h/pid9", 30, 3, "7", "n1", 4), Marker("old@h/pid2", 30, 31, "10", "n1", 3),
                       Marker("before@h/pid3", 30, 2, "13", "n1", 0), Marker("me@h/pid1", 30, 0, "11", "n1", 5)]
    assert live_others(markers, {"n1": "11"}) == ([markers[0], markers[2]], [markers[1]])


def test_a_run_that_reaches_no_server_holds_no_lock_and_does_not_go_on(tmp_path):
    from opsctl.net.connector import Connector
    from opsctl.net.topolock import topology_lock
    from opsctl.state.specfile import read_spec
    from tests.support import make_spec, write_spec

    loaded = read_spec(write_spec(tmp_path, make_spec("cluster")))  # nothing runs on its ports
    with pytest.raises(RefusedError, match="a majority of its servers does not answer") as refused, \
            topology_lock(Connector(loaded)):
        pytest.fail("the block ran without a lock")
    assert "0 of 6 servers granted it (a majority is 4); 0 answered" in refused.value.detail
    assert "--force-lock" in refused.value.hint


# the slot maths and the fence constants stand in opsctl.plan beside the planner: they are not the planner
PURE_SLOT_MATHS = ("opsctl.plan.slotmath", "opsctl.plan.facts")


def test_slot_commands_load_no_client_library_nor_the_planner() -> None:
    """What cluster check/reshard/rebalance/fix run, imported: no redis-py (the engine, its probes and the topology
    lock talk raw RESP), no opsctl.runtime.opening and none of the planner (each a share of every run's start)."""
    import subprocess
    import sys

    code = ("import sys, opsctl.cli.main, opsctl.cli.commands.cluster, opsctl.state.specfile, "
                "opsctl.state.localdirs, opsctl.net.connector, "
            "opsctl.state.statelock, opsctl.net.topolock, opsctl.base.events, opsctl.cli.results, "
                "opsctl.slots.fix, opsctl.slots.reshard, "
            "opsctl.cluster.check; print(' '.join(sorted(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    modules = set(done.stdout.split())
    unwanted = sorted(m for m in modules if m.split(".")[0] in ("redis", "pydantic", "cryptography")
                      or m in ("opsctl.runtime.opening", "opsctl.runtime.drift")
                          or (m.startswith("opsctl.plan.") and not m.startswith(PURE_SLOT_MATHS)))
    assert not unwanted, unwanted


def test_a_journal_that_cannot_be_written_says_so(tmp_path, monkeypatch) -> None:
    """A full disk under the journal is a FileProblem naming the file (never an OSError that the mover would
    report as a node's lost connection)."""
    import errno
    import os

    from opsctl.state.safefs import FileProblem

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(FileProblem, match=r"slots-journal\.jsonl: cannot be written: the disk is full where .* free"):
        Journal(tmp_path).opened("a", "id-a", "b", "id-b", [1, 2, 3])
