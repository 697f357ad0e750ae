"""A standby against real servers (issue 36, docs/standby.md): a 3-master Valkey cluster under a writer followed by
a standby cluster (`opsctl follow`), the link SIGKILLed and resumed (a partial resync: INCRs applied once), then
`opsctl switchover`: every acknowledged write on the standby, the old primary refusing writes, the standby taking
them, the pause measured; an apply of the switched-over standby that still says follows: refused."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis

from opsctl.base.poll import wait_for
from opsctl.render.exporteruser import FOLLOWER_USER, follower_secret
from opsctl.spec.load import LoadedSpec
from tests.lifecycle import applied, deployed, run
from tests.support import CONDITION_BOUND, PASSWORD, make_spec, started
from tests.test_migrate_live import Migrate, source_client
from tests.writer import Writer, cluster_client

pytestmark = pytest.mark.integration

Shape = tuple[str, str, dict[str, Any]]  # topology, flavor, make_spec's sections
CLUSTER3 = {"cluster": {"masters": 3, "replicas_per_master": 0}}
STANDALONE = {"hosts": 1}


class Follow(Migrate):
    """opsctl follow as a subprocess, its JSON events read as they come (the migrate engine's: migrate-lag,
    cutover-done)."""

    def __init__(self, standby: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        argv = [sys.executable, "-m", "opsctl.cli.main", "follow", "-f", str(standby), "--output", "json", *extra]
        self.proc = started(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                             env={**os.environ, **(env or {})}))
        self.events: list[dict[str, Any]] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()


@contextmanager
def primary_and_standby(tmp_path: Path, capsys: pytest.CaptureFixture[str], primary: Shape,
                        standby: Shape) -> Iterator[tuple[Path, LoadedSpec, Path, LoadedSpec]]:
    """(primary spec, loaded, standby spec, loaded): the primary deployed in tmp_path/primary, a standby of it (its
    spec's follows: names the primary's) applied in tmp_path/standby, fenced and empty; both destroyed afterwards
    (the standby first). A shape is (topology, flavor, make_spec's sections)."""
    with ExitStack() as stack:
        (tmp_path / "primary").mkdir()
        (tmp_path / "standby").mkdir()
        topology, flavor, sections = primary
        p, p_loaded = stack.enter_context(deployed(tmp_path / "primary", capsys, topology, flavor, **sections))
        topology, flavor, sections = standby
        s, s_loaded = stack.enter_context(applied(tmp_path / "standby", capsys, make_spec(
            topology, flavor, **sections, follows={"spec": str(p)})))
        yield p, p_loaded, s, s_loaded


def test_a_cluster_followed_killed_resumed_and_switched_over(tmp_path, capsys) -> None:
    with ExitStack() as stack:
        _, p_loaded, s, s_loaded = stack.enter_context(primary_and_standby(
            tmp_path, capsys, ("cluster", "valkey", CLUSTER3), ("cluster", "valkey", CLUSTER3)))
        primary = cluster_client(p_loaded)
        standby = cluster_client(s_loaded)
        writer = stack.enter_context(Writer(lambda: cluster_client(p_loaded)))
        writer.wait_for_writes(300)
        follow = Follow(s)
        follow.streaming()

        def status() -> str:
            return run(capsys, "status", "-f", str(s))[1]
        wait_for(lambda: "following, shard-1 stream lag" in status() or None, CONDITION_BOUND, "status showing the lag",
                 last_reason=status)
        with pytest.raises(redis.exceptions.ResponseError, match=r"(?i)no permissions"):
            standby.set("client-write", "1")  # the fence, while following
        follow.proc.send_signal(signal.SIGKILL)
        follow.wait()
        for _ in range(100):
            primary.incr("bumps")
        follow = Follow(s)
        follow.streaming()
        wait_for(lambda: standby.get("bumps") == "100" or None, CONDITION_BOUND, "the INCRs on the standby")
        writer.wait_for_more(200)
        code, out, err = run(capsys, "switchover", "-f", str(s), "--auto-approve")
        switched = time.monotonic()
        assert code == 0 and "cutover done" in out, out + err
        assert follow.wait() == 0, follow.stderr()
        said = follow.stderr() + json.dumps(follow.events) + out + err
        assert follower_secret(s_loaded).reveal() not in said and PASSWORD not in said  # no secret in any output
        assert "standby switched over from" in status()
        writer.wait_for_refusal()  # the old primary refuses writes (NOREPLICAS)
        writer.stop()
        last_ack = max(writer.ack_times)
        assert writer.verify(standby) == []  # every acknowledged write on the standby
        assert standby.get("bumps") == "100"  # INCR applied once across the kill
        assert standby.set("after", "1") and standby.get("after") == "1"  # the standby takes writes
        with pytest.raises(redis.exceptions.ResponseError, match="NOREPLICAS"):
            primary.set("after", "1")
        pause = float(re.search(r"write pause ([0-9.]+)s", out).group(1))  # type: ignore[union-attr]
        split = [e["text"] for e in follow.events if e.get("event") == "note" and "switchover:" in e["text"]]
        lags = [float(r["lag_seconds"]) for e in follow.events if e.get("event") == "migrate-lag"
                for r in e["shards"].values() if r.get("phase") == "stream"]
        with capsys.disabled():  # the figures docs/standby.md quotes
            print(f"\nswitchover: {out.strip()}; last acknowledged write {switched - last_ack:.3f}s before the "
                  f"switchover returned; {len(writer.acked)} writes acknowledged; streaming lag max "
                  f"{max(lags, default=0):.3f}s over {len(lags)} shard reports (pause {pause:.3f}s); {split}")
        code, out, err = run(capsys, "apply", "-f", str(s), "--auto-approve")
        assert code == 3 and "remove follows: from the spec" in err, out + err
        # the way back begins by removing follows: (docs/standby.md): apply takes it as acknowledged
        s.write_text(s.read_text().split("follows:")[0])
        code, out, err = run(capsys, "apply", "-f", str(s), "--auto-approve")
        assert code == 0, out + err
        assert standby.set("after-apply", "1")


def test_a_link_past_the_backlog_resyncs_the_standby_from_scratch(tmp_path, capsys) -> None:
    """Redis 7.0 primary, Valkey 9.1 standby: the link killed, the primary's backlog overrun meanwhile and a key
    deleted there; the same `follow` says so, empties the standby, copies it again and switches over."""
    with ExitStack() as stack:
        _, p_loaded, s, s_loaded = stack.enter_context(primary_and_standby(
            tmp_path, capsys, ("standalone", "redis", {}), ("standalone", "valkey", STANDALONE)))
        primary = source_client(p_loaded)
        standby = source_client(s_loaded)
        primary.set("stale", "1")
        follow = Follow(s)
        follow.streaming()
        wait_for(lambda: standby.get("stale") == "1" or None, CONDITION_BOUND, "the key on the standby")
        follow.proc.send_signal(signal.SIGKILL)
        follow.wait()
        primary.execute_command(p_loaded.command_name(p_loaded.layout.servers[0], "CONFIG"), "SET",
                                "repl-backlog-size", "16384")
        primary.delete("stale")
        for i in range(100):
            primary.set(f"fill:{i}", "x" * 10_000)
        follow = Follow(s)
        follow.streaming()
        notes = [e.get("text", "") for e in follow.events if e.get("event") == "note"]
        assert any("must start over: backlog overrun" in n and "copying it again from scratch" in n
                   for n in notes), notes
        assert standby.get("stale") is None and standby.get("fill:99") == "x" * 10_000
        code, out, err = run(capsys, "switchover", "-f", str(s), "--auto-approve")
        assert code == 0 and "cutover done" in out, out + err
        assert follow.wait() == 0, follow.stderr()
        assert standby.set("after", "1")


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_switchover_with_the_primary_lost_reports_what_the_standby_holds(tmp_path, capsys, flavor) -> None:
    """The primary SIGSTOPped (its site gone) after the writer stopped and the standby applied every write: the
    recovery point is the stream's offset the standby applied up to, read after the last acknowledged write."""
    with ExitStack() as stack:
        p, p_loaded, s, s_loaded = stack.enter_context(primary_and_standby(
            tmp_path, capsys, ("standalone", flavor, {}), ("standalone", "valkey", STANDALONE)))
        standby = source_client(s_loaded)
        follow = Follow(s)
        follow.streaming()
        with Writer(lambda: source_client(p_loaded)) as writer:
            writer.wait_for_writes(500)
        last_ack = time.time()
        written = source_client(p_loaded).info("replication")["master_repl_offset"]  # just after the last write
        wait_for(lambda: writer.verify(standby) == [] or None, CONDITION_BOUND,
                 "every acknowledged write on the standby")
        stopped = source_client(p_loaded).info("replication")["master_repl_offset"]  # PINGs since, maybe
        pid = int((p.parent / ".opsctl" / p_loaded.spec.name / p_loaded.layout.servers[0].name / "server.pid")
                  .read_text())
        os.kill(pid, signal.SIGSTOP)
        stack.callback(os.kill, pid, signal.SIGCONT)  # so the destroy can stop it
        code, out, err = run(capsys, "switchover", "-f", str(s), "--primary-lost", "--auto-approve")
        assert code == 1 and "`opsctl follow` still runs" in err, out + err
        follow.proc.send_signal(signal.SIGKILL)
        follow.wait()
        code, out, err = run(capsys, "switchover", "-f", str(s), "--primary-lost", "--auto-approve", "--output",
                             "json")
        assert code == 0, out + err
        report = json.loads(out)
        point = report["recovery"]["shard-1"]
        # the standby applied the stream up to the last write at least (and at most the PINGs since)
        assert written <= point["offset"] <= stopped, (point, written, stopped)
        assert point["at"] >= last_ack - 1, (point, last_ack)
        assert writer.verify(standby) == [] and standby.set("after", "1")
        assert not [k for k in standby.scan_iter("opsctl-migrate:*")], "markers left on the promoted standby"
        code, out, err = run(capsys, "apply", "-f", str(s), "--auto-approve")
        assert code == 3 and "remove follows: from the spec" in err and "primary-lost" in err, out + err


def test_a_switchover_that_fails_verification_leaves_everything_as_it_was(tmp_path, capsys) -> None:
    """A key on the standby the primary does not have: the switchover's verification fails; the primary takes
    writes again, the standby stays fenced and the link follows on; without that key the next switchover passes."""
    with ExitStack() as stack:
        _, p_loaded, s, s_loaded = stack.enter_context(primary_and_standby(
            tmp_path, capsys, ("standalone", "redis", {}), ("standalone", "valkey", STANDALONE)))
        node = s_loaded.layout.servers[0]
        as_follower = redis.Redis(host=node.address, port=node.port, username=FOLLOWER_USER,
                                  password=follower_secret(s_loaded).reveal(), decode_responses=True)
        standby = source_client(s_loaded)
        writer = stack.enter_context(Writer(lambda: source_client(p_loaded)))
        follow = Follow(s)
        follow.streaming()
        as_follower.set("only-on-the-standby", "1")
        code, out, err = run(capsys, "switchover", "-f", str(s), "--auto-approve")
        assert code == 1 and "failed verification" in out, out + err
        writer.wait_for_more(100)  # the primary takes writes again
        with pytest.raises(redis.exceptions.ResponseError, match=r"(?i)no permissions"):
            standby.set("client-write", "1")  # the standby still fenced
        follow.streaming(after=len(follow.events))  # and followed on
        assert follow.proc.poll() is None
        as_follower.delete("only-on-the-standby")
        code, out, err = run(capsys, "switchover", "-f", str(s), "--auto-approve")
        assert code == 0 and "cutover done" in out, out + err
        writer.stop()
        assert follow.wait() == 0 and writer.verify(standby) == []


def test_fail_back_makes_the_old_primary_a_standby_and_switches_over_again(tmp_path, capsys) -> None:
    """A followed by B (both Redis 7.0: a Valkey 9.1 snapshot is not one Redis 7.0 reads, so a way back from Valkey
    to Redis is refused by the copy), switched over; then follows: moves into A's spec: A's apply fences it (the
    cutover's NOREPLICAS fence replaced), its follow empties what A held (asked: --auto-approve) and copies B's, and
    a switchover makes A the primary again with every write B took."""
    with ExitStack() as stack:
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        a, a_loaded = stack.enter_context(deployed(tmp_path / "a", capsys, "standalone", "redis"))
        b, b_loaded = stack.enter_context(applied(tmp_path / "b", capsys, make_spec(
            "standalone", "redis", hosts=1, follows={"spec": str(a)})))
        site_a, site_b = source_client(a_loaded), source_client(b_loaded)
        site_a.set("from-a", "1")
        follow = Follow(b)
        follow.streaming()
        code, out, err = run(capsys, "switchover", "-f", str(b), "--auto-approve")
        assert code == 0 and follow.wait() == 0, out + err
        site_b.set("from-b", "2")  # B takes writes; A refuses them
        with pytest.raises(redis.exceptions.ResponseError, match="NOREPLICAS"):
            site_a.set("late-on-a", "x")
        b.write_text(b.read_text().split("follows:")[0])  # B is the primary now
        code, out, err = run(capsys, "apply", "-f", str(b), "--auto-approve")
        assert code == 0, out + err
        a.write_text(a.read_text() + f"follows: {{spec: {b}}}\n")
        code, out, err = run(capsys, "apply", "-f", str(a), "--auto-approve")  # fences A first, then its steps
        assert code == 0 and "its NOREPLICAS fence replaced" in err, out + err
        with pytest.raises(redis.exceptions.ResponseError, match=r"(?i)no permissions"):
            site_a.set("late-on-a", "x")  # the ACL fence, whatever apply did to min-replicas-to-write
        follow = Follow(a, "--auto-approve")
        follow.streaming()
        assert any("emptied" in e.get("text", "") for e in follow.events if e.get("event") == "note")
        site_b.set("more-from-b", "3")
        wait_for(lambda: site_a.get("more-from-b") == "3" or None, CONDITION_BOUND, "B's write on A")
        code, out, err = run(capsys, "switchover", "-f", str(a), "--auto-approve")
        assert code == 0 and follow.wait() == 0, out + err
        assert [site_a.get(k) for k in ("from-a", "from-b", "more-from-b")] == ["1", "2", "3"]
        assert site_a.set("back-on-a", "4")
        with pytest.raises(redis.exceptions.ResponseError, match="NOREPLICAS"):
            site_b.set("late-on-b", "x")


@pytest.mark.parametrize("point", ["migrate-fenced", "migrate-verified", "standby-recorded"])
def test_a_switchover_killed_at_each_step_is_finished_by_running_it_again(tmp_path, capsys, point) -> None:
    """The link SIGKILLed after the primary's fence, after the verification, and after the switch was recorded
    (before the lift): the same `switchover` again converges: the primary fenced, every acknowledged write on the
    standby, which takes writes."""
    with ExitStack() as stack:
        _, p_loaded, s, s_loaded = stack.enter_context(primary_and_standby(
            tmp_path, capsys, ("standalone", "valkey", {}), ("standalone", "valkey", STANDALONE)))
        standby = source_client(s_loaded)
        with Writer(lambda: source_client(p_loaded)) as writer:
            writer.wait_for_writes(300)
            follow = Follow(s, env={"OPSCTL_FAILOVER_KILL_AT": point})
            follow.streaming()
            code, out, err = run(capsys, "switchover", "-f", str(s), "--auto-approve")
            assert code == 1 and "stopped before it reported" in err, out + err
            assert follow.wait() == -9
            with pytest.raises(redis.exceptions.ResponseError, match="NOREPLICAS"):
                source_client(p_loaded).set("while-killed", "1")  # the primary stays fenced meanwhile
            code, out, err = run(capsys, "switchover", "-f", str(s), "--auto-approve")
            assert code == 0 and ("cutover done" in out or "was switched over" in out), out + err
        assert writer.verify(standby) == [] and standby.set("after", "1")
        assert not [k for k in standby.scan_iter("opsctl-migrate:*")], "markers left on the standby"
        code, out, err = run(capsys, "switchover", "-f", str(s), "--auto-approve")
        assert code == 0 and "was switched over" in out, out + err  # converged: again changes nothing


def test_a_redis_sentinel_primary_followed_by_a_valkey_cluster_with_its_textfile(tmp_path, capsys) -> None:
    """Redis 7.0 Sentinel primary (a master, its replicas and Sentinels) followed by a 3-master Valkey 9.1 cluster
    standby under a writer, `follow --metrics-textfile DIR`: the file says the link runs and the source shard's lag
    and last applied write while it streams; then `switchover`: every acknowledged write on the standby, the old
    primary refuses writes, the standby takes them, and the textfile is gone (no alert for a promoted standby)."""
    from opsctl.metrics.signals import textfile_name

    with ExitStack() as stack:
        (tmp_path / "textfiles").mkdir()
        _, p_loaded, s, s_loaded = stack.enter_context(primary_and_standby(
            tmp_path, capsys, ("sentinel", "redis", {}), ("cluster", "valkey", CLUSTER3)))
        standby = cluster_client(s_loaded)
        writer = stack.enter_context(Writer(lambda: source_client(p_loaded)))
        writer.wait_for_writes(300)
        started = time.time()
        follow = Follow(s, "--metrics-textfile", str(tmp_path / "textfiles"))
        follow.streaming()
        path = tmp_path / "textfiles" / textfile_name(s_loaded.spec.name, "follow")
        name = re.escape(s_loaded.spec.name)

        def applied_at() -> float | None:  # a write the writer made after the link started, applied and reported
            text = path.read_text() if path.exists() else ""
            found = re.search(rf'opsctl_standby_last_applied_timestamp_seconds{{topology="{name}",shard="shard-1"}} '
                              r"([0-9.]+)", text)
            streaming = "opsctl_standby_lag_seconds{" in text  # a lag is written only while the shard streams
            return float(found.group(1)) if found and float(found.group(1)) > started and streaming else None
        wait_for(applied_at, CONDITION_BOUND, "the textfile reporting an applied write",
                 last_reason=lambda: path.read_text() if path.exists() else "no textfile")
        text = path.read_text()
        assert f'opsctl_standby_following{{topology="{s_loaded.spec.name}"}} 1\n' in text, text
        lag = re.search(rf'opsctl_standby_lag_seconds{{topology="{name}",shard="shard-1"}} ([0-9.]+)', text)
        assert lag and 0 <= float(lag.group(1)) < 10, text  # under RedisStandbyLagging's bound
        assert f'opsctl_standby_lag_bytes{{topology="{s_loaded.spec.name}",shard="shard-1"}} ' in text, text
        assert path.stat().st_mode & 0o777 == 0o644
        writer.wait_for_more(200)
        code, out, err = run(capsys, "switchover", "-f", str(s), "--auto-approve")
        assert code == 0 and "cutover done" in out, out + err
        assert follow.wait() == 0, follow.stderr()
        assert not path.exists()
        writer.wait_for_refusal()  # the old primary refuses writes (NOREPLICAS)
        writer.stop()
        assert writer.verify(standby) == []  # every acknowledged write on the standby
        assert standby.set("after", "1") and standby.get("after") == "1"  # the standby takes writes
        with pytest.raises(redis.exceptions.ResponseError, match="NOREPLICAS"):
            source_client(p_loaded).set("after", "1")
