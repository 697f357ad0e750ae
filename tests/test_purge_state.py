"""Review 3, finding 8: `destroy --purge` leaves no file of the topology in its state dir: the slot, restore and
migration journals, the failover reports (they name the purged nodes' ids and addresses) and the lock file go, on
the path that stops nodes and on the one with nothing left to stop (a purge killed after its last node); a dry run
names them and removes nothing. The lock file goes under the lock: a run that waited on it locks a new one."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import pytest

from opsctl.state.statelock import LOCK_NAME, state_lock
from tests.lifecycle import deployed, run
from tests.support import CONDITION_BOUND, make_spec, write_spec

LEFTOVERS = ("slots-journal.jsonl", "restore-journal.json", "migrate-journal.json",
             "failover/1.0-shard1-succeeded.json")


def _leave(state: Path) -> None:
    for name in LEFTOVERS:
        (state / name).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        (state / name).write_text("{}\n")


def _files(state: Path) -> list[str]:
    return sorted(str(p.relative_to(state)) for p in state.rglob("*") if not p.is_dir()) if state.exists() else []


@pytest.mark.integration
def test_a_purge_leaves_no_journal_report_or_lock(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with deployed(tmp_path, capsys, "cluster", "valkey") as (spec, loaded):
        state = tmp_path / ".opsctl" / loaded.spec.name
        _leave(state)
        code, out, err = run(capsys, "destroy", "-f", str(spec), "--purge", "--auto-approve")
        assert code == 0, err + out
        left = [f for f in _files(state) if not f.startswith("tls/")]
        assert left == [], left  # before: .lock and failover/..., restore and migrate journals


def test_a_purge_with_nothing_deployed_removes_what_a_killed_purge_left(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    data = make_spec("cluster")
    spec = write_spec(tmp_path, data)
    state = tmp_path / ".opsctl" / data["name"]
    _leave(state)
    (state / LOCK_NAME).write_text("")
    code, out, err = run(capsys, "destroy", "-f", str(spec), "--purge", "--dry-run")
    assert code == 0 and out.count("would remove") == len(LEFTOVERS) + 1, out  # the lock file too
    assert len(_files(state)) == len(LEFTOVERS) + 1
    code, out, err = run(capsys, "destroy", "-f", str(spec), "--purge", "--auto-approve")
    assert code == 0 and "removed" in out, err + out
    assert _files(state) == [], _files(state)  # before: every one of them stayed, ready for a fresh deploy to read
    code, out, err = run(capsys, "destroy", "-f", str(spec), "--purge", "--auto-approve")
    assert code == 0 and "removed" not in out and not (state / LOCK_NAME).exists(), out  # no lock made for nothing


def _lock_opens(state: Path) -> int:
    """How many open files of this process are the state dir's lock file (removed or not)."""
    target, count = str(state / LOCK_NAME), 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own fd is gone by now
            count += os.readlink(f"/proc/self/fd/{fd}").removesuffix(" (deleted)") == target
    return count


def test_a_run_that_waited_on_a_removed_lock_file_locks_the_new_one(tmp_path: Path) -> None:
    """A run waits on the lock; the holder purges and removes the lock file, then ends: the waiter holds the lock
    of the file the state dir names, so a third run is refused (before: it locked a file nobody else saw)."""
    from opsctl.base.errors import OpsctlError
    from opsctl.base.poll import wait_for
    from opsctl.state.statelock import remove_lock_file

    holding, release = threading.Event(), threading.Event()

    def waiter() -> None:
        with state_lock(tmp_path, timeout=30):
            holding.set()
            release.wait(30)

    thread = threading.Thread(target=waiter)
    with state_lock(tmp_path):
        thread.start()
        wait_for(lambda: _lock_opens(tmp_path) >= 2 or None, CONDITION_BOUND, "the waiter to open the lock file")
        remove_lock_file(tmp_path)
    try:
        assert holding.wait(10)
        with pytest.raises(OpsctlError, match="another opsctl run holds the lock"), state_lock(tmp_path):
            pass
    finally:
        release.set()
        thread.join()
