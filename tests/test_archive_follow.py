"""`backup --continuous` follows the fleet `apply` changes (issue 33, found by tests/test_day2.py): a cluster of 3
masters under a writer and a running archiver, grown to 4 by apply. The archiver places the spec again from the
records, says the shards changed, records that the old base serves a restore only up to then and takes a new base
that holds the fourth shard; then shard 4's master moves (a failover) to its replica, a node placed after the
archiver started, and the archiver follows it. A restore to a time after both holds every write acknowledged
before it, the new shard's included; a restore into the change's window is refused naming it. Before, the running
archiver kept its 3 shards: shard 4's writes were in no archive, a restore after the grow missed them and said
nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from opsctl.backup.timeline import CHANGED, iso, parse_changed
from opsctl.base.poll import Pending, wait_for
from opsctl.providers.localfiles import deployed_records_in
from opsctl.spec.layout import Layout
from opsctl.spec.placement import with_placement
from opsctl.state.specfile import read_spec
from tests.lifecycle import applied, run
from tests.support import CONDITION_BOUND, PASSWORD, make_spec
from tests.writer import Writer, cluster_client

pytestmark = pytest.mark.integration

MARGIN = 0.25  # s: a write acknowledged this close before the cut may be read by the archiver just after it


def placed(spec: Path) -> Layout:
    """The nodes deployed, as every command places them."""
    loaded = read_spec(spec)
    return with_placement(loaded, deployed_records_in(loaded, spec.parent / ".opsctl" / loaded.spec.name)).layout


class Archiver:
    """`opsctl backup --continuous --output json` as its own process, its events in a file."""

    def __init__(self, spec: Path, to: Path, log: Path) -> None:
        argv = [sys.executable, "-m", "opsctl.cli.main", "backup", "-f", str(spec), "--to", str(to), "--continuous",
                "--output", "json"]
        self.log, self.err = log, log.with_suffix(".err")
        self.proc = subprocess.Popen(argv, stdout=log.open("wb"), stderr=self.err.open("wb"), env=os.environ.copy())

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{")]

    def notes(self) -> list[str]:
        return [e["text"] for e in self.events() if e["event"] == "note"]

    def wait(self, shards: int, after: float, what: str) -> None:
        """Every one of `shards` shards has a segment the archiver stored after `after` (wall clock)."""
        def covered() -> bool | Pending:
            assert self.proc.poll() is None, self.err.read_text()[-3000:]
            done = {e["shard"] for e in self.events() if e["event"] == "segment-archived" and e["durable"] >= after}
            return len(done) >= shards or Pending(f"shards {sorted(done)}; notes {self.notes()[-4:]}")
        wait_for(covered, CONDITION_BOUND, what, 0.1)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(CONDITION_BOUND)


def shard_nodes(spec: Path, index: int) -> list[tuple[str, int]]:
    layout = placed(spec)
    shard = next(s for s in layout.shards if s.index == index)
    return [(layout.node(n).address, layout.node(n).port) for n in shard.members]


def fail_over(spec: Path, index: int) -> tuple[str, int]:
    """CLUSTER FAILOVER on the shard's replica, waited for until it serves as master; its endpoint."""
    for address, port in shard_nodes(spec, index):
        node = redis.Redis(host=address, port=port, password=PASSWORD, socket_timeout=5)
        if node.info("replication")["role"] == "slave":
            wait_for(lambda n=node: n.info("replication")["master_link_status"] == "up" or None, CONDITION_BOUND,
                     "the replica linked", 0.05)
            node.execute_command("CLUSTER", "FAILOVER")
            wait_for(lambda n=node: n.info("replication")["role"] == "master" or None, CONDITION_BOUND,
                     "the promotion", 0.05)
            return address, port
    raise AssertionError(f"shard {index} has no replica")


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_running_archive_follows_a_grown_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   flavor: str) -> None:
    archive = tmp_path / "archive"
    with applied(tmp_path, capsys, make_spec("cluster", flavor)) as (spec, loaded):
        archiver = Archiver(spec, archive, tmp_path / "archive.jsonl")
        clock = time.time() - time.monotonic()
        try:
            with Writer(lambda: cluster_client(loaded), pause=0.002) as writer:
                archiver.wait(3, 0.0, "the first base's segments")
                data = yaml.safe_load(spec.read_text())
                spec.write_text(yaml.safe_dump({**data, "cluster": {**data["cluster"], "masters": 4}},
                                               sort_keys=False))
                grew = time.time()
                code, out, err = run(capsys, "apply", "-f", str(spec), "--auto-approve")
                assert code == 0, err + out
                archiver.wait(4, time.time(), "shard 4 archived by the running archiver")
                changed = [n for n in archiver.notes() if "became 1, 2, 3, 4" in n]
                assert changed and "taking a new base" in changed[0], archiver.notes()

                moved_to = fail_over(spec, 4)  # to a node placed after the archiver started
                moved = time.time()
                archiver.wait(4, moved + 0.5, "shard 4 archived from its new master")
                cut = time.time()
                writer.wait_for_writes(len(writer.acked) + 200)
                archiver.wait(4, cut + 1.0, "the archive read past the cut")
        finally:
            code = archiver.stop()
        assert code == 0, archiver.err.read_text()[-2000:]
        assert "error:" not in archiver.err.read_text()
        assert any("shard 4: the stream broke" in n for n in archiver.notes()), archiver.notes()

        bases = sorted(p.name for p in archive.iterdir() if (p / "archive.json").exists())
        assert len(bases) == 2, bases
        first, second = (json.loads((archive / b / "archive.json").read_text()) for b in bases)
        assert sorted(first["shards"]) == ["1", "2", "3"] and sorted(second["shards"]) == ["1", "2", "3", "4"]
        change = parse_changed((archive / bases[0] / CHANGED).read_text(), CHANGED)
        assert grew - 3.0 <= change.until <= second["taken"] and change.until < moved, (change, grew)

        client = cluster_client(read_spec(spec))
        new_shard = {f"{a}:{p}" for a, p in shard_nodes(spec, 4)}
        assert f"{moved_to[0]}:{moved_to[1]}" in new_shard
        acked = [(k, v, t + clock) for (k, v), t in zip(writer.acked.items(), writer.ack_times, strict=True)]
        before = {k: v for k, v, t in acked if t <= cut - MARGIN}
        on_new = [k for k, _, t in acked if moved < t <= cut - MARGIN
                  and client.get_node_from_key(k).name in new_shard]
        after = [k for k, _, t in acked if t > cut + MARGIN]
        assert on_new and after, (len(on_new), len(after))

    target_spec = make_spec("standalone", flavor)
    target_dir = tmp_path / "restored"
    target_dir.mkdir(mode=0o711)
    with applied(target_dir, capsys, target_spec) as (target, _):
        window = change.until + min(0.5, (second["taken"] - change.until) / 2)
        code, out, err = run(capsys, "restore", "-f", str(target), "--from", str(archive), "--to-time", iso(window),
                             "--dry-run")
        assert code == 3 and "is after the topology changed under base" in err, err + out
        assert "shards 1, 2, 3 became 1, 2, 3, 4" in err, err

        code, out, err = run(capsys, "restore", "-f", str(target), "--from", str(archive), "--to-time", iso(cut),
                             "--auto-approve")
        assert code == 0 and "verified" in out and "shard-4 at" in out, err + out
        node = redis.Redis(host=target_spec["hosts"][0]["address"], port=target_spec["standalone"]["port"],
                           password=PASSWORD, decode_responses=True, socket_timeout=5)
        keys = list(before)
        found = [v for i in range(0, len(keys), 1000) for v in node.mget(keys[i:i + 1000])]
        assert [k for k, v in zip(keys, found, strict=True) if v != before[k]] == []
        assert all(node.get(k) == before[k] for k in on_new)
        assert sum(v is not None for v in node.mget(after[:300])) == 0


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_running_archive_takes_a_new_base_when_slots_move(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             flavor: str) -> None:
    """`cluster reshard` under a running archive: the slots moved between shards it archives (each moved key the
    target's RESTORE in one stream, the source's DEL in another, read apart), so the base is recorded as serving up
    to the last look before, a new base is taken, and a restore into the reshard's window is refused naming it."""
    archive = tmp_path / "archive"
    with applied(tmp_path, capsys, make_spec("cluster", flavor)) as (spec, loaded):
        archiver = Archiver(spec, archive, tmp_path / "archive.jsonl")
        try:
            with Writer(lambda: cluster_client(loaded), pause=0.002):
                archiver.wait(3, 0.0, "the first base's segments")
                source, target = (loaded.layout.shards[i].master for i in (0, 1))
                code, out, err = run(capsys, "cluster", "reshard", "-f", str(spec), "--from", source, "--to", target,
                                     "--slots", "100", "--auto-approve")
                assert code == 0, err + out
                moved = time.time()
                wait_for(lambda: len([n for n in archiver.notes() if n.startswith("base ")]) >= 2 or None,
                         CONDITION_BOUND, "a new base", 0.1, last_reason=lambda: str(archiver.notes()[-3:]))
                archiver.wait(3, time.time(), "the new base's segments")
        finally:
            code = archiver.stop()
        assert code == 0, archiver.err.read_text()[-2000:]
        assert any(n.startswith("the topology changed (slots moved between shards 1, 2, 3)") for n in
                   archiver.notes()), archiver.notes()
        bases = sorted(p.name for p in archive.iterdir() if (p / "archive.json").exists())
        change = parse_changed((archive / bases[0] / CHANGED).read_text(), CHANGED)
        second = json.loads((archive / bases[1] / "archive.json").read_text())
        assert change.was == change.now == (1, 2, 3) and change.until < moved <= second["taken"], change

    target_dir = tmp_path / "restored"
    target_dir.mkdir(mode=0o711)
    with applied(target_dir, capsys, make_spec("standalone", flavor)) as (target, _):
        code, out, err = run(capsys, "restore", "-f", str(target), "--from", str(archive), "--to-time",
                             iso((change.until + moved) / 2), "--dry-run")
        assert code == 3 and f"is after the topology changed under base {bases[0]}" in err, err + out
        segments = [e for e in archiver.events() if e["event"] == "segment-archived"]
        served = min(max(e["last"] for e in segments if e["shard"] == n) for n in (1, 2, 3))
        assert served > second["taken"]
        code, out, err = run(capsys, "restore", "-f", str(target), "--from", str(archive), "--to-time",
                             iso(served), "--dry-run")  # the new base serves it
        assert code == 0 and bases[1] in out + err, err + out
