"""Issue 23, class 1, under a real split (tests/partition.py): the master's host of a Sentinel topology is cut off
from the other two hosts for 8 s while a client beside it keeps writing to it. Sentinel promotes a replica on the
majority side; whatever the old master acknowledged after the cut is thrown away when it rejoins. With opsctl's
default (min-replicas-to-write 1, min-replicas-max-lag 5) it stops acknowledging within the documented window
(lag + 2 s); without it, it acknowledged until Sentinel converted it, seconds after the heal."""

from __future__ import annotations

import pytest

from tests.partition import SplitResult, run_in_namespace, unavailable
from tests.support import FLAVORS, missing, server_binary

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("flavor", sorted(FLAVORS))
def test_a_cut_off_sentinel_master_stops_acknowledging_writes_within_the_documented_window(flavor) -> None:
    if (lacking := unavailable()) is not None:
        missing(lacking)
    server_binary(flavor)
    result = SplitResult(**run_in_namespace("sentinel-split", flavor=flavor, seed=23, cut=8))
    print(result)
    assert (result.to_write, result.lag) == ("1", "5")  # the default, rendered by opsctl
    assert set(result.peer_sources) <= set(result.host_addresses)  # replicas and sentinels: bind-source-addr
    assert result.promoted is not None and result.promoted < result.cut, "Sentinel did not fail over in the cut"
    assert result.master_stopped <= result.bound, result
    assert result.loss_window <= result.bound, result
