"""Issue 23, item 7c, under a real split (tests/partition_scale.py): the second shard's master's host cut off for 6 s
(node timeout 2 s) while `apply` scales a 3 x 1 cluster to 4 masters and moves slots into the new one. The apply
may stop (it says how to go on); the same apply run again after the heal finishes the scale-out (the journal's
fill entries): the plan is empty, the four masters hold their shares, every slot is served, the preloaded keys
are intact, and the only acknowledged writes lost are those the cut-off master took before it saw itself cut."""

from __future__ import annotations

import pytest

from tests.partition import unavailable
from tests.partition_scale import ScaleRun, run_in_namespace
from tests.support import missing, server_binary

pytestmark = pytest.mark.integration


@pytest.mark.soak
@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_scale_out_under_a_split_finishes_when_applied_again(flavor: str) -> None:
    if (lacking := unavailable()) is not None:
        missing(lacking)
    server_binary(flavor)
    result = ScaleRun(**run_in_namespace(flavor, seed=1))
    print(result)
    for out in (result.restart_out, result.again_out):
        assert "Traceback" not in out and "internal error" not in out, result
    assert result.restart_rc in (0, 1) and result.again_rc == 0, result
    assert result.applies == 0, result  # the plan was empty after the second apply
    assert result.check_ok and result.preload_equal, result
    assert len(result.shares) == 4 and all(abs(n - 4096) <= 1 for n in result.shares), result
    assert result.first_lost >= -0.5 and result.last_lost <= result.loss_bound, result
