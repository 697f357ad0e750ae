"""Issue 33, item 7, under a real split (tests/partition_lock.py): two opsctl runs, one per side of a split of a
3 x 1 cluster (4 servers against 2), started at once: only the majority's side acts, the minority's exits 3
naming its grants and --force-lock; after the heal the minority's run proceeds. And the gap this closed: a run that
holds the lock when the split puts it on the minority's side counts it lost before a run on the majority's side
takes it over (before, it held on to the two servers it still reached and went on)."""

from __future__ import annotations

import pytest

from tests.partition import unavailable
from tests.partition_lock import SLOTS, LockRun, run_in_namespace
from tests.support import missing, server_binary

pytestmark = pytest.mark.integration


# Redis 7.0 runs the same in `make partitions` (soak): the lock is opsctl's, the server only its host
@pytest.mark.parametrize("flavor", [pytest.param("redis", marks=pytest.mark.soak), "valkey"])
def test_only_the_majoritys_side_acts_and_a_cut_off_holder_stops_first(flavor: str) -> None:
    if (lacking := unavailable()) is not None:
        missing(lacking)
    server_binary(flavor)
    result = LockRun(**run_in_namespace(flavor))
    print(result)
    for out in (result.majority_out, result.minority_out, result.again_out, result.holder_said):
        assert "Traceback" not in out and "internal error" not in out, result
    assert result.majority_rc == 0 and f"moved {SLOTS} slots" in result.majority_out, result
    assert result.minority_rc == 3, result
    assert "2 of 6 servers granted it (a majority is 4)" in result.minority_out, result
    assert "--force-lock" in result.minority_out, result
    assert result.again_rc == 0 and result.moved == 2 * SLOTS, result  # after the heal it proceeds
    # the holder cut off with 2 of its 6 servers
    assert result.holder.startswith("held 6 "), result
    assert "fewer than 3 of its 6 servers confirmed it" in result.holder_said, result
    assert result.holder_lost is not None and result.taken is not None, result
    assert result.holder_lost < result.taken, result
    assert result.taker.split()[0] == "4", result  # the majority's side: 4 of 6
