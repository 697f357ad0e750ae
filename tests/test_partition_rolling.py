"""Issue 23, item 7c, under a real split (tests/partition_rolling.py): a host cut off for 6 s (node timeout 2 s)
while `opsctl restart` rolls through a 3 x 1 cluster. The restart may stop (a failover it asked for cannot
complete while the cluster is split: it says so, exit 1); the same restart run again after the heal finishes,
the plan is empty, every slot is served, and the only acknowledged writes lost are those the cut-off master took
before it saw itself cut (the node timeout bounds them)."""

from __future__ import annotations

import pytest

from tests.partition import unavailable
from tests.partition_rolling import RollingRun, run_in_namespace
from tests.support import missing, server_binary

pytestmark = pytest.mark.integration


@pytest.mark.soak
@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_rolling_restart_under_a_split_finishes_when_run_again(flavor: str) -> None:
    if (lacking := unavailable()) is not None:
        missing(lacking)
    server_binary(flavor)
    result = RollingRun(**run_in_namespace(flavor, seed=1))
    print(result)
    for out in (result.restart_out, result.again_out):
        assert "Traceback" not in out and "internal error" not in out, result
    assert result.restart_rc in (0, 1), result
    assert result.again_rc == 0, result
    assert result.applies == 0, result  # the plan was empty after the restart ran again
    assert result.check_ok, result
    assert result.first_lost >= -0.5 and result.last_lost <= result.loss_bound, result
