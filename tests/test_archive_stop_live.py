"""`backup --continuous` off a terminal, as a service runs it (issue 33 item 8): a heartbeat line every few seconds,
also while no write comes, counting the segments stored; SIGTERM is a normal stop: every open segment stored, a
closing line on stdout (the result, review 3 finding 14: it was on stderr), exit 0, no `error:`. A local folder as
the store, one standalone server of each flavor."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from opsctl.base.poll import wait_for
from tests.lifecycle import deployed
from tests.support import CONDITION_BOUND, PASSWORD

pytestmark = pytest.mark.integration

HEARTBEAT = re.compile(r"^archiving base \S+: (\d+) segments? \(\S+\) stored; shard 1 at offset (\d+)$", re.M)


def beats(err: Path) -> list[tuple[int, int]]:
    """The heartbeat lines so far: (segments stored, shard 1's archived offset)."""
    return [(int(m[1]), int(m[2])) for m in HEARTBEAT.finditer(err.read_text())]


def beat_after(err: Path, line: str) -> bool | None:
    """Whether a heartbeat line follows `line` in the archiver's stderr."""
    text = err.read_text()
    return (line in text and HEARTBEAT.search(text.split(line, 1)[1]) is not None) or None


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_continuous_backup_beats_off_a_terminal_and_stops_normally(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                   flavor: str) -> None:
    with deployed(tmp_path, capsys, "standalone", flavor, hosts=1) as (spec, loaded):
        out, err = tmp_path / "archive.out", tmp_path / "archive.err"
        argv = [sys.executable, "-m", "opsctl.cli.main", "backup", "-f", str(spec), "--to", str(tmp_path / "b"),
                "--continuous"]
        with out.open("wb") as stdout, err.open("wb") as stderr:  # files: no terminal, as under systemd or CI
            archiver = subprocess.Popen(argv, stdout=stdout, stderr=stderr)
        try:
            idle = wait_for(lambda: beats(err) or None, CONDITION_BOUND, "a heartbeat with no write coming", 0.1,
                            last_reason=err.read_text)
            # alive; what it stored so far (nothing, or the master's PINGs when the first beat came late on a loaded
            # machine: a ping every repl-ping-replica-period is part of the stream)
            stored = idle[0][0]
            node = loaded.layout.nodes[0]
            client = redis.Redis(host=node.address, port=node.port, password=PASSWORD, socket_timeout=5)
            for i in range(20):
                client.set(f"k{i}", i)
            offset = int(client.info("replication")["master_repl_offset"])
            wait_for(lambda: [b for b in beats(err) if b[0] > stored and b[1] >= offset] or None,  # (and PINGs)
                     CONDITION_BOUND, "a heartbeat counting the segment of the writes", 0.1, last_reason=err.read_text)
        finally:
            archiver.send_signal(signal.SIGTERM)
            code = archiver.wait(CONDITION_BOUND)
        text = err.read_text()
        assert code == 0, text
        closing = re.fullmatch(r"the continuous archive stopped on SIGTERM: every segment read is archived: "
                               r"shard 1 up to offset (\d+)\n", out.read_text())
        assert closing is not None and int(closing[1]) >= offset, (out.read_text(), text)
        assert "error:" not in text and "Traceback" not in text and "\r" not in text and "\x1b" not in text
        assert "stopped on" not in text and PASSWORD not in text


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_stop_while_a_shard_has_no_master_is_a_normal_stop(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             flavor: str) -> None:
    """The master of a replication topology SIGKILLed under the archive (its replica stays a replica: nothing
    promotes it): the archiver waits for the shard's master (up to --reconnect-timeout). SIGTERM then is still a
    normal stop, at once: exit 0 and the closing line (before, it was not heard until the wait timed out: exit 1,
    "cannot attach to shard 1's master", after 120 s by default). The wait is said once and the heartbeat goes on
    meanwhile (issue 33: the wait once held the whole loop)."""
    import os

    with deployed(tmp_path, capsys, "replication", flavor, hosts=2) as (spec, loaded):
        out, err = tmp_path / "archive.out", tmp_path / "archive.err"
        argv = [sys.executable, "-m", "opsctl.cli.main", "backup", "-f", str(spec), "--to", str(tmp_path / "b"),
                "--continuous", "--reconnect-timeout", "600"]
        with out.open("wb") as stdout, err.open("wb") as stderr:
            archiver = subprocess.Popen(argv, stdout=stdout, stderr=stderr)
        try:
            wait_for(lambda: beats(err) or None, CONDITION_BOUND,
                     "the archive's first heartbeat", 0.1, last_reason=err.read_text)
            master = loaded.layout.node(loaded.layout.shards[0].master)
            folder = spec.parent / ".opsctl" / loaded.spec.name / master.name
            os.kill(int((folder / "server.pid").read_text()), signal.SIGKILL)
            wait_for(lambda: "shard 1: the stream broke" in err.read_text() or None, CONDITION_BOUND,
                     "the archiver to lose its master", 0.1, last_reason=err.read_text)
            wait_for(lambda: beat_after(err, "shard 1: waiting for its master ("),  # said once; the loop goes on
                     CONDITION_BOUND, "a heartbeat while the shard waits for its master", 0.1,
                     last_reason=err.read_text)
        finally:
            archiver.send_signal(signal.SIGTERM)
            try:
                code = archiver.wait(CONDITION_BOUND)
            except subprocess.TimeoutExpired:
                archiver.kill()
                archiver.wait(10)
                raise
        text = err.read_text()
        assert code == 0 and out.read_text().startswith("the continuous archive stopped on SIGTERM: "), text
        assert "error:" not in text and "Traceback" not in text, text


def test_a_base_waits_while_another_run_holds_the_topology(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The base the archive cannot go on without (the first, or after a gap) is a service's wait while an apply or
    a reshard holds the topology lock: said, tried again, taken once the lock is free; before, the archiver exited 3
    (a gap answered during the apply that replaced a dead host ended the day-2 test's archive). Valkey only: the
    waiting is opsctl's own, the same for both servers."""
    from opsctl.net.connector import Connector
    from opsctl.net.topolock import topology_lock

    with deployed(tmp_path, capsys, "standalone", "valkey", hosts=1) as (spec, loaded):
        out, err = tmp_path / "archive.out", tmp_path / "archive.err"
        argv = [sys.executable, "-m", "opsctl.cli.main", "backup", "-f", str(spec), "--to", str(tmp_path / "b"),
                "--continuous"]
        with topology_lock(Connector(loaded)):
            with out.open("wb") as stdout, err.open("wb") as stderr:
                archiver = subprocess.Popen(argv, stdout=stdout, stderr=stderr)
            try:
                wait_for(lambda: "a base waits: another opsctl run holds this topology" in err.read_text() or None,
                         CONDITION_BOUND, "the archiver to say its base waits", 0.1, last_reason=err.read_text)
                assert archiver.poll() is None, err.read_text()  # waiting, not exited
            except BaseException:
                archiver.kill()
                raise
        try:
            wait_for(lambda: beats(err) or None, CONDITION_BOUND, "a heartbeat once the base is taken", 0.1,
                     last_reason=err.read_text)
        finally:
            archiver.send_signal(signal.SIGTERM)
            code = archiver.wait(CONDITION_BOUND)
        assert code == 0, err.read_text()
