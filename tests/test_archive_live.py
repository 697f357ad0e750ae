"""Point-in-time recovery on real servers and a real local S3 server (issue 27): a 3-master cluster (one replica
each; Valkey 9.1 and Redis 7.0) under a writer that records each acknowledged write with its time, `backup
--continuous` to s3://, the archiver SIGKILLed twice and resumed (no gap reported), shard 1 failed over under it
(followed), a burst of deletes at T, then `restore --to-time T-1s` into a 5-master cluster: every write
acknowledged before T-1s is there with its value, none of the deletes. A tampered segment is refused by name with
nothing written; a time before the archive is refused; SIGTERM closes the open segments (a normal stop: exit 0). The RPO
(acknowledgement to segment durable) is printed with -s. A gap starts a new base; a time retention dropped is
refused by name."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opsctl.backup.offsite import open_store
from opsctl.backup.segment import decode_segment, parse_name
from opsctl.backup.store import parse_location
from opsctl.backup.timeline import iso, read_bases
from tests.lifecycle import run
from tests.s3server import SECRET, S3Server, s3_prefix_fixture, s3_server_fixture  # noqa: F401 (fixtures)
from tests.support import CONDITION_BOUND, PASSWORD, cluster_check
from tests.test_restore_live import clients, cluster, restore, topologies
from tests.writer import Writer, cluster_client

pytestmark = pytest.mark.integration

MARGIN = 0.25  # s: a write acknowledged this close before the cut may be read by the archiver just after it


class Archiver:
    """`opsctl backup --continuous` as its own process, its JSON events in a file."""

    def __init__(self, spec: Path, url: str, log: Path, extra: list[str] | None = None) -> None:
        argv = [sys.executable, "-m", "opsctl.cli.main", "backup", "-f", str(spec), "--to", url, "--continuous",
                "--output", "json", *(extra or [])]
        self.log = log
        self.proc = subprocess.Popen(argv, stdout=log.open("wb"), stderr=log.with_suffix(".err").open("wb"),
                                     env=os.environ.copy())

    def events(self) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{")]

    def wait_segments(self, count: int, timeout: float = CONDITION_BOUND, after: float = 0.0, shards: int = 3) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.with_suffix(".err").read_text()
            done = [e for e in self.events() if e["event"] == "segment-archived" and e["durable"] >= after]
            if len({e["shard"] for e in done}) == shards and len(done) >= count:
                return
            time.sleep(0.1)
        raise AssertionError(f"no {count} segments in {timeout}s: {self.log.read_text()[-2000:]}")

    def kill(self, sig: int = signal.SIGKILL) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(CONDITION_BOUND)


def say(capsys, text: str) -> None:
    """A measurement, shown with -s (docs/backup.md quotes them)."""
    with capsys.disabled():
        print(text)


def segments_of(url: str) -> dict[str, list]:
    """Every archived segment's commands, by object name."""
    store = open_store(parse_location(url))
    out = {}
    for name in store.names():
        seg = parse_name(name)
        if seg is not None and "/stream/" in name:
            out[name.rpartition("/")[2]] = decode_segment(seg, store.get_bytes(name) or b"", name)[1]
    return out


def rpo(acked: dict[str, float], events: list[dict], url: str, since: float, until: float) -> list[float]:
    """For each write acknowledged in [since, until): its segment's durable time minus its acknowledgement."""
    durable = {e["name"]: e["durable"] for e in events if e["event"] == "segment-archived"}
    lags = []
    for name, entries in segments_of(url).items():
        for entry in entries:
            at = acked.get(entry.args[1].decode()) if entry.args[0].upper() == b"SET" else None
            if at is not None and since <= at < until and name in durable:
                lags.append(durable[name] - at)
    return sorted(lags)


@pytest.mark.parametrize("flavor", ["valkey", pytest.param("redis", marks=pytest.mark.second_flavor)])
def test_continuous_archive_and_restore_to_a_time(tmp_path, capsys, s3_server: S3Server, s3_prefix, flavor) -> None:
    shapes = ("cluster", {}), cluster(5), cluster(3)
    with topologies(tmp_path, capsys, flavor, *shapes) as ((src, src_loaded), (dst, dst_loaded), (other, o_loaded)):
        code, out, err = restore(capsys, dst, "--from", s3_prefix, "--to-time", iso(time.time()))
        assert code == 1 and f"no backup at {s3_prefix}" in err, err + out  # nothing there: no empty archive

        seed = cluster_client(src_loaded)
        for i in range(2000):
            seed.set(f"pre:{i}", i)
        clock = time.time() - time.monotonic()
        with Writer(lambda: cluster_client(src_loaded), pause=0.001) as writer:
            first = Archiver(src, s3_prefix, tmp_path / "a1.jsonl")
            first.wait_segments(6)
            assert first.kill() == -signal.SIGKILL
            writer.wait_for_more(200)  # writes while no archiver runs: the next one resumes over them
            second = Archiver(src, s3_prefix, tmp_path / "a2.jsonl")
            second.wait_segments(3)
            assert second.kill() == -signal.SIGKILL
            third = Archiver(src, s3_prefix, tmp_path / "a3.jsonl")
            third.wait_segments(6)
            promoted = fail_over_shard_1(src_loaded)
            third.wait_segments(3, after=time.time() + 1.0)
            resumed_at = time.time()
            # a time window under test, so a sleep: the RPO is measured over it, and the doomed writes (2 s before
            # the cut) and the restore point (1 s before it) fall inside it
            time.sleep(3.0)
            cut_at = time.time()  # T: the burst of deletes
            doomed = [k for k, t in zip(writer.acked, writer.ack_times, strict=False) if t + clock < cut_at - 2][:500]
            pipe = seed.pipeline()
            for key in doomed:
                pipe.delete(key)
            pipe.execute()
            writer.wait_for_writes(len(writer.acked) + 500)
        acked = {k: t + clock for k, t in zip(writer.acked, writer.ack_times, strict=True)}
        written = dict(writer.acked)
        third.wait_segments(3, after=time.time() + 1.5)
        assert third.kill(signal.SIGTERM) == 0  # open segments closed, then stopped
        notes = [e["text"] for e in first.events() + second.events() + third.events() if e["event"] == "note"]
        assert sum("resuming the archive" in n for n in notes) == 2 and not [n for n in notes if "gap" in n], notes
        assert any("shard 1: the stream broke" in n for n in notes), notes  # the failover, followed
        assert cluster_check(promoted.endpoint).returncode == 0
        out_all = "".join(p.read_text() for p in tmp_path.glob("a*.json*")) + "".join(
            p.read_text() for p in tmp_path.glob("a*.err"))
        assert SECRET not in out_all and PASSWORD not in out_all

        lags = rpo(acked, third.events(), s3_prefix, resumed_at, cut_at)
        rate = sum(resumed_at <= t < cut_at for t in acked.values()) / (cut_at - resumed_at)
        say(capsys, f"RPO at {rate:.0f} acknowledged writes/s: {len(lags)} writes, median {lags[len(lags) // 2]:.3f}s, "
              f"p99 {lags[int(len(lags) * 0.99)]:.3f}s, max {lags[-1]:.3f}s")
        assert lags  # every measured write found in a segment (the bound itself is bench/pitr.py's)

        until = cut_at - 1.0
        code, out, err = restore(capsys, dst, "--from", s3_prefix, "--to-time", iso(until))
        assert code == 0 and "verified" in out and "replayed to" in out, err + out
        assert out.count("shard-") >= 3 and "last command read" in out
        assert cluster_check(dst_loaded.layout.servers[0].endpoint).returncode == 0
        target = cluster_client(dst_loaded)
        before = [k for k, t in acked.items() if t <= until - MARGIN]
        values = target.mget_nonatomic(before)
        lost = [k for k, v in zip(before, values, strict=True) if v != written[k]]
        assert not lost, lost[:10]
        assert all(target.get(k) is not None for k in doomed)  # none of the deletes
        assert all(target.get(f"pre:{i}") == str(i) for i in range(0, 2000, 97))
        after = [k for k, t in acked.items() if t > until + MARGIN]
        assert sum(target.get(k) is not None for k in after[:300]) == 0  # nothing read after the time
        grey = [k for k, t in acked.items() if until - MARGIN < t <= until]
        say(capsys, out.splitlines()[0])
        say(capsys, f"restore to {iso(until)}: {len(before)} writes acknowledged before it present; "
              f"{sum(target.get(k) is None for k in grey)} of {len(grey)} in the last {MARGIN}s before it missing")

        tampered_segment_is_refused(capsys, other, o_loaded, s3_prefix, until)
        retention_refuses_by_name(capsys, other, s3_prefix, until)


def fail_over_shard_1(loaded):
    """A graceful CLUSTER FAILOVER of shard 1 while the archiver reads it; the promoted replica."""
    from tests.support import admin_for

    replica = loaded.layout.node(loaded.layout.shards[0].replicas[0])
    with admin_for(loaded, replica) as admin:
        admin.call("CLUSTER", "FAILOVER")
        deadline = time.monotonic() + CONDITION_BOUND
        while admin.call("ROLE")[0] not in (b"master", "master"):
            assert time.monotonic() < deadline, "the failover did not happen in time"
            time.sleep(0.05)
    return replica


def tampered_segment_is_refused(capsys, spec: Path, loaded, url: str, until: float) -> None:
    store = open_store(parse_location(url))
    name = next(n for n in store.names() if "/stream/shard-2/" in n)
    data = store.get_bytes(name) or b""
    store.put_bytes(name, data[: len(data) - 7])  # cut short
    code, out, err = restore(capsys, spec, "--from", url, "--to-time", iso(until))
    assert code == 1 and store.where(name) in err and "sha256" in err, err + out
    assert sum(c.dbsize() for c in clients(loaded)) == 0  # nothing written
    store.put_bytes(name, data)


def retention_refuses_by_name(capsys, spec: Path, url: str, until: float) -> None:
    code, out, err = run(capsys, "backup", "list", "--from", url)
    assert code == 0 and "archive base" in out and "complete until" in out, err + out
    bases = read_bases(open_store(parse_location(url)))
    assert len(bases) == 1
    code, out, err = run(capsys, "backup", "prune", "--from", url, "--keep-days", "0")
    assert code == 0 and "dropped 0 base(s)" in out, err + out  # the newest base always stays
    code, out, err = restore(capsys, spec, "--from", url, "--to-time", iso(bases[0].taken - 60))
    assert code == 3 and "reaches back" in err, err


def test_a_gap_starts_a_new_base_and_retention_refuses_by_name(tmp_path, capsys, s3_server: S3Server,
                                                               s3_prefix) -> None:
    """Replication topology (a master, two replicas): the archiver stopped while the master writes more than its
    backlog holds; restarted, it reports the gap and takes a new base. Prune then drops the first base (time moved
    two days on), and a restore to a time only it served is refused naming retention; a later time restores."""
    from opsctl.backup.timeline import DAY, prune
    from tests.support import admin_for

    shapes = ("replication", {}), ("standalone", {})
    with topologies(tmp_path, capsys, "valkey", *shapes) as ((src, src_loaded), (dst, dst_loaded)):
        master = next(n for n in src_loaded.layout.servers if n.role == "master")
        client = clients(src_loaded)[0]
        client.set("early", "1")
        first = Archiver(src, s3_prefix, tmp_path / "g1.jsonl")
        first.wait_segments(1, shards=1)
        client.set("in-first", "1")
        first.wait_segments(1, shards=1, after=time.time() + 0.5)
        in_first = time.time()
        assert first.kill(signal.SIGTERM) == 0
        with admin_for(src_loaded, master) as admin:
            admin.config_set("repl-backlog-size", "16384")
        for i in range(300):
            client.set(f"bulk:{i}", "x" * 10_000)  # 3 MB: far past the backlog
        second = Archiver(src, s3_prefix, tmp_path / "g2.jsonl")
        second.wait_segments(1, shards=1)
        client.set("late", "1")
        second.wait_segments(1, shards=1, after=time.time() + 0.5)
        assert second.kill(signal.SIGTERM) == 0
        notes = [e["text"] for e in second.events() if e["event"] == "note"]
        assert any("gap:" in n and "backlog overrun" in n and "new base" in n for n in notes), notes
        store = open_store(parse_location(s3_prefix))
        bases = sorted(read_bases(store), key=lambda b: b.taken)
        assert len(bases) == 2 and all(b.archived for b in bases)

        dropped = prune(store, keep_days=1, now=time.time() + 2 * DAY)
        assert dropped == [bases[0].name]
        code, out, err = restore(capsys, dst, "--from", s3_prefix, "--to-time", iso(in_first))
        assert code == 3 and "dropped by retention" in err and "nothing was written" in err, err + out
        last = max(e["last"] for e in second.events() if e["event"] == "segment-archived")
        code, out, err = restore(capsys, dst, "--from", s3_prefix, "--to-time", iso(last + 0.001))
        assert code == 0 and bases[1].name in out, err + out
        restored = clients(dst_loaded)[0]
        assert restored.get("late") == b"1" and restored.get("bulk:299") == b"x" * 10_000


def test_bases_taken_while_archiving_overlap_their_streams(tmp_path, capsys, s3_server: S3Server,
                                                          s3_prefix) -> None:
    """--base-every: a new base is taken in the background while the old chain goes on, so a restore to any
    moment around the switch is served (by the older chain where the new one has not begun) and a later one starts
    from the new base."""
    import threading

    shapes = ("replication", {}), ("standalone", {}), ("standalone", {})
    with topologies(tmp_path, capsys, "valkey", *shapes) as ((src, src_loaded), (dst, dst_loaded), (late, l_loaded)):
        client = clients(src_loaded)[0]
        acked: dict[str, float] = {}
        done = threading.Event()

        def write() -> None:
            n = 0
            while not done.is_set():
                client.set(f"k:{n}", n)
                acked[f"k:{n}"] = time.time()
                n += 1
                time.sleep(0.005)

        archiver = Archiver(src, s3_prefix, tmp_path / "b.jsonl", ["--base-every", "0.002"])  # every 7.2 s
        writer = threading.Thread(target=write)
        writer.start()
        try:
            deadline = time.monotonic() + 90
            while sum(e["event"] == "note" and e["text"].startswith("base ") for e in archiver.events()) < 2:
                assert time.monotonic() < deadline and archiver.proc.poll() is None, archiver.log.read_text()
                time.sleep(0.2)
            archiver.wait_segments(2, shards=1, after=time.time() + 1.0)
        finally:
            done.set()
            writer.join()
        archiver.wait_segments(1, shards=1, after=time.time() + 1.0)
        assert archiver.kill(signal.SIGTERM) == 0
        bases = sorted((b for b in read_bases(open_store(parse_location(s3_prefix))) if b.archived),
                       key=lambda b: b.taken)
        assert len(bases) >= 2
        switch = bases[1].taken + 0.02  # the switch: the new chain, or the older one where the new has not begun
        code, out, err = restore(capsys, dst, "--from", s3_prefix, "--to-time", iso(switch))
        assert code == 0 and (bases[0].name in out or bases[1].name in out), err + out
        restored = clients(dst_loaded)[0]
        wanted = [k for k, t in acked.items() if t <= switch - MARGIN]
        assert wanted and all(v is not None for v in restored.mget(wanted))
        last = max(e["last"] for e in archiver.events() if e["event"] == "segment-archived")
        code, out, err = restore(capsys, late, "--from", s3_prefix, "--to-time", iso(last + 0.001))
        assert code == 0 and bases[-1].name in out, err + out
        assert clients(l_loaded)[0].dbsize() >= len(acked) - 5
