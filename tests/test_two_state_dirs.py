"""Issue 23, item 7d: two runs from different state dirs on one topology. The state-dir lock cannot see the other
run; the topology lock is held in the servers, so while a reshard runs, `apply`, `cluster fix` and another
reshard from another state dir are refused (exit 3) naming the holder (user@host/pid), and change nothing; the
holder finishes undisturbed. (Two runs on different sides of a split: docs/runbooks/partitions.md.)"""

from __future__ import annotations

import pytest

from tests.lifecycle import deployed, run
from tests.test_slots_reshard import preload, referee_ok
from tests.test_slots_signals import start_reshard, wait_started

pytestmark = pytest.mark.integration


def test_a_run_from_another_state_dir_is_refused_and_told_who_holds_the_topology(tmp_path, capsys) -> None:
    with deployed(tmp_path, capsys, "cluster", "valkey") as (spec, loaded):
        preload(loaded, 20000)
        source, target = loaded.layout.shards[0].master, loaded.layout.shards[1].master
        proc = start_reshard(spec, source, target, 4000, "--key-by-key", "--max-keys-per-sec", "2000")
        try:
            wait_started(proc, spec, loaded)
            other = str(tmp_path / "other-state")
            for argv in (["apply", "-f", str(spec), "--auto-approve"], ["cluster", "fix", "-f", str(spec)],
                         ["cluster", "reshard", "-f", str(spec), "--auto-approve", "--from", target, "--to", source,
                          "--slots", "10"]):
                code, out, err = run(capsys, *argv, "--state-dir", other)
                assert proc.poll() is None, "the reshard ended before the second run was tried"
                assert code == 3, (argv, out + err)
                assert "another opsctl run holds this topology" in err and f"/pid{proc.pid}" in err, (argv, err)
            out, err = proc.communicate(timeout=120)
        except BaseException:
            proc.kill()
            raise
        assert proc.returncode == 0, out + err
        referee_ok(loaded)
        code, out, err = run(capsys, "cluster", "check", "-f", str(spec))
        assert code == 0, out + err
        code, out, err = run(capsys, "plan", "-f", str(spec))
        assert code == 0, out + err
