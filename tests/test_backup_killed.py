"""`backup` SIGKILLed mid-save (issue 23, item 7b): the next run succeeds, nothing half-written passes for a
backup (a folder without the leading dot verifies, its manifest was written last), and the half-written folders
of killed runs are swept by the next run. Valkey 9.1, a master and a replica (the replica saves)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.lifecycle import deployed, run
from tests.test_restore_faults import load
from tests.test_restore_live import clients

pytestmark = pytest.mark.integration

KEYS = 400_000


def _killed_backup(spec: Path, to: Path, after: float, until_done: bool = False) -> int:
    """The backup as its own process, SIGKILLed `after` seconds in (until_done: let it finish)."""
    argv = [sys.executable, "-m", "opsctl.cli.main", "backup", "-f", str(spec), "--to", str(to)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy())
    try:
        return proc.wait(after)
    except subprocess.TimeoutExpired:
        assert not until_done
        proc.send_signal(signal.SIGKILL)
        return proc.wait()


def _killed_when_saving(spec: Path, to: Path) -> int:
    """The backup SIGKILLed as soon as a new half-written folder appears (polled every millisecond)."""
    before = set(to.iterdir())
    argv = [sys.executable, "-m", "opsctl.cli.main", "backup", "-f", str(spec), "--to", str(to)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy())
    while proc.poll() is None and not any(p.name.endswith(".partial") for p in set(to.iterdir()) - before):
        time.sleep(0.001)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    return proc.wait()


def test_a_killed_backup_leaves_nothing_taken_for_a_backup(tmp_path, capsys) -> None:
    rng = random.Random(23)
    with deployed(tmp_path, capsys, "replication", "valkey") as (spec, loaded):
        load(clients(loaded)[0], KEYS)
        to = tmp_path / "backups"
        start = time.monotonic()
        assert _killed_backup(spec, to, 600.0, until_done=True) == 0
        took = time.monotonic() - start
        delays = [took * (i + rng.random()) / 7.5 for i in range(6)]  # over 0-80% of the run: the last one mid-save
        codes = [_killed_backup(spec, to, delay) for delay in delays]
        half = [p.name for p in to.iterdir() if p.name.endswith(".partial")]
        for _ in range(10):  # none landed mid-save (its window is short; the start's time varies with the load)
            if half:
                break
            codes.append(_killed_when_saving(spec, to))
            half = [p.name for p in to.iterdir() if p.name.endswith(".partial")]
        assert codes.count(-signal.SIGKILL) >= 4 and half, (delays, codes)  # most runs killed, some mid-save
        code, out, err = run(capsys, "backup", "-f", str(spec), "--to", str(to), "--output", "json")
        assert code == 0, err + out
        newest = Path(json.loads(out.splitlines()[-1])["dir"])
        left = sorted(p.name for p in to.iterdir())
        assert not [name for name in left if name.endswith(".partial")], (delays, left)
        for folder in to.iterdir():  # every folder that looks complete is: a killed run left none half-written
            code, out, err = run(capsys, "backup", "verify", str(folder))
            assert code == 0, (folder.name, delays, err + out)
        code, out, err = run(capsys, "backup", "verify", str(newest))
        assert code == 0 and f"{KEYS} keys" in out, err + out
