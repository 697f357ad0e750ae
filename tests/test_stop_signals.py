"""SIGTERM and SIGINT sent to a running `opsctl backup`, `restore` and `failover` (issue 23, class 5): each stops at
its next safe point with exit 128 + the signal, leaves nothing half-done, says what it did, and the same command
run again converges. A backup keeps no folder (no .partial, no half backup); a restore reports the keys it wrote,
keeps its journal and the re-run resumes and verifies; a failover either lifts its fence (nothing promoted) or
finishes first (promoted, post-checks passed), never two writable masters nor a fenced one left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opsctl.failover.actions import KILL_AT
from tests.lifecycle import deployed, plan_json, run
from tests.support import CONDITION_BOUND
from tests.test_failover_interrupted import _client, _fenced, _master, _roles
from tests.test_restore_faults import keys_of, load, target_keys
from tests.test_restore_live import backup_dir, clients, cluster, restore, topologies
from tests.writer import Writer

pytestmark = pytest.mark.integration

BACKUP_KEYS = 400_000
RESTORE_KEYS = 300_000
EXIT = {signal.SIGTERM: 143, signal.SIGINT: 130}


def _opsctl(*argv: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "opsctl.cli.main", *argv],
                            env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _until(proc: subprocess.Popen[str], ready: object, timeout: float = CONDITION_BOUND) -> None:
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline and not ready():  # type: ignore[operator]
        time.sleep(0.005)
    assert proc.poll() is None, f"finished before the signal: {proc.communicate()}"


def _stopped(proc: subprocess.Popen[str], sig: signal.Signals | None) -> tuple[int, str, str]:
    """proc's exit code and output once it ended after sig (None: the signal is one it sends itself)."""
    if sig is not None:
        proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)  # faulthandler: where it hung
        out, err = proc.communicate()
        raise AssertionError(f"no stop within 60 s:\n{err}") from None
    return proc.returncode, out, err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_a_stopped_backup_keeps_nothing_and_the_next_one_verifies(tmp_path, capsys, sig) -> None:
    with deployed(tmp_path, capsys, "replication", "valkey") as (spec, loaded):
        load(clients(loaded)[0], BACKUP_KEYS)
        to = tmp_path / "backups"
        proc = _opsctl("backup", "-f", str(spec), "--to", str(to))
        _until(proc, lambda: to.is_dir() and any(p.name.endswith(".partial") for p in to.iterdir()))
        time.sleep(0.1)  # waiting for the replica, its BGSAVE, or copying its RDB
        started = time.monotonic()
        code, out, err = _stopped(proc, sig)
        took = time.monotonic() - started
        assert code == EXIT[sig], out + err
        assert f"stopped on {sig.name}" in err and "nothing was kept" in err and "Traceback" not in err, err
        assert sorted(p.name for p in to.iterdir()) == [], err  # no partial folder, no half backup
        assert took < 5, took  # the next chunk or poll, not the end of the save
        folder = backup_dir(capsys, spec, to)
        code, out, err = run(capsys, "backup", "verify", str(folder))
        assert code == 0 and f"{BACKUP_KEYS} keys" in out, err + out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_a_stopped_restore_says_what_it_wrote_and_the_rerun_resumes(tmp_path, capsys, sig) -> None:
    with topologies(tmp_path, capsys, "valkey", ("standalone", {}), cluster(3)) as deployed_:
        (s, s_loaded), (c, c_loaded) = deployed_
        load(clients(s_loaded)[0], RESTORE_KEYS)
        folder = backup_dir(capsys, s, tmp_path / "backups")
        proc = _opsctl("restore", "-f", str(c), "--from", str(folder))
        _until(proc, lambda: target_keys(c_loaded) > 0)
        code, out, err = _stopped(proc, sig)
        assert code == EXIT[sig], out + err
        assert f"stopped on {sig.name}" in err and "wrote " in err and "not verified" in err, err
        assert "Traceback" not in err, err
        assert 0 < target_keys(c_loaded) < RESTORE_KEYS, err  # stopped mid-copy
        journal = c.parent / ".opsctl" / c_loaded.spec.name / "restore-journal.json"
        assert json.loads(journal.read_text())["finished"] is False
        code, out, err = restore(capsys, c, "--from", str(folder))
        assert code == 0 and "(resumed)" in out, err + out
        assert keys_of(c_loaded) == {f"k:{i}".encode() for i in range(RESTORE_KEYS)}


def _failover(spec: Path, target: str, point: str) -> subprocess.Popen[str]:
    return _opsctl("failover", "-f", str(spec), "--yes", "--timeout", "3", "--to", target, "--no-failover-command",
                   env={KILL_AT: f"{point}:SIGTERM"})


def test_a_failover_stopped_before_the_promotion_lifts_its_fence(tmp_path, capsys) -> None:
    """SIGTERM arrives right after the fence went up: the wait for the replica is the safe point; the fence is
    lifted, nothing is promoted, the master takes writes again, and the failover run again succeeds."""
    with deployed(tmp_path, capsys, "replication", "redis") as (spec, loaded):
        old, target = loaded.layout.shards[0].master, loaded.layout.shards[0].replicas[0]
        with Writer(lambda: _client(loaded, old)) as writer:
            writer.wait_for_writes(200)
            code, out, err = _stopped(_failover(spec, target, "fenced"), None)  # SIGTERM: sent by itself at the point
            assert code == 143, out + err
            assert _fenced(loaded) == [] and _master(loaded) == old, err
            assert "stopped on SIGTERM" in err and "nothing was promoted" in err and "lifted" in err, err
            writer.wait_for_writes(len(writer.acked) + 200, timeout=5.0)  # the old master takes writes again
        assert writer.verify(_client(loaded, old)) == []
        code, out, err = run(capsys, "failover", "-f", str(spec), "--yes", "--to", target, "--no-failover-command")
        assert code == 0, out + err
        assert _master(loaded) == target and _fenced(loaded) == []
        assert plan_json(capsys, spec)["steps"] == []


def test_a_failover_stopped_after_the_promotion_finishes_first(tmp_path, capsys) -> None:
    """SIGTERM arrives right after REPLICAOF NO ONE: the failover finishes (old demoted, fence lifted,
    post-checks) before it stops; exit 143 says so; nothing is left for a re-run."""
    with deployed(tmp_path, capsys, "replication", "redis") as (spec, loaded):
        old, target = loaded.layout.shards[0].master, loaded.layout.shards[0].replicas[0]
        with Writer(lambda: _client(loaded, target)) as writer:
            code, out, err = _stopped(_failover(spec, target, "promoted"), None)
            assert code == 143, out + err
            assert _master(loaded) == target and _fenced(loaded) == [] and _roles(loaded)[old] == "slave", err
            assert "the failover finished first" in err and target in err, err
            writer.wait_for_writes(200)
        assert writer.verify(_client(loaded, target)) == []
        reports = list((spec.parent / ".opsctl" / loaded.spec.name / "failover").glob("*-succeeded.json"))
        assert len(reports) == 1, reports  # it counts for the cool-down
        assert plan_json(capsys, spec)["steps"] == []
