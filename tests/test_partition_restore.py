"""Issue 23, classes 3 and 4, under a real split (tests/partition_restore.py, Valkey 9.1).

3: the source's replica is cut off from its master (its link still says connected) while the master acknowledges
1,000 writes; `restore --from-live --verify full` must copy them (it read the stale replica and said "all equal").
4: a target master is cut off from its replica during `restore --from DIR` and keeps acknowledging RESTOREs; the
restore must not say verified (it did, and the keys were gone after the heal); the same command after the heal
resumes and copies what the failover threw away (it was refused: "keys already exist")."""

from __future__ import annotations

import pytest

from tests.partition import unavailable
from tests.partition_restore import RestoreRun, run_in_namespace
from tests.support import missing, server_binary

pytestmark = pytest.mark.integration


def _run(scenario: str) -> RestoreRun:
    if (lacking := unavailable()) is not None:
        missing(lacking)
    server_binary("valkey")
    result = RestoreRun(**run_in_namespace(scenario))
    print(result)
    return result


def test_restore_from_live_copies_what_a_stale_replicas_master_acknowledged() -> None:
    result = _run("stale-replica")
    assert result.after_cut == result.expected, result
    assert result.rc == 0, result


def test_restore_is_not_called_verified_before_a_replica_holds_its_writes() -> None:
    result = _run("target-cut")
    under_cut = result.out.split("--- re-run:")[0]
    # Which refusal comes depends on the machine's speed: the copy done within the node timeout (8 s), the
    # durability check finds no replica of the cut master holding its writes; still copying then, the cut master
    # (a minority) refuses the next RESTORE with CLUSTERDOWN (seen beside two CPU hogs). Never "verified".
    refused = "not durable" in under_cut or "CLUSTERDOWN" in under_cut
    assert result.rc == 1 and refused and "verified" not in under_cut, result
    assert result.rerun_rc == 0 and result.after_rerun == result.expected, result
