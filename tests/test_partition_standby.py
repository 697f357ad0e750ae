"""Issue 36 under a real split (tests/partition_standby.py): a standby's link (`opsctl follow`) cut from its
primary by iptables, with the link running, for longer than the primary's backlog holds (16 KB, a writer filling
it during the cut; the primary drops the silent link after its repl-timeout of 5 s). While cut the link must wait
and retry, saying so, neither dying nor spinning (it died once its lock on the primary lapsed, and said nothing
before); after the heal it says it starts over, copies again and is current: every acknowledged write on the
standby."""

from __future__ import annotations

import pytest

from tests.partition import unavailable
from tests.partition_standby import LinkCut, run_in_namespace
from tests.support import missing, server_binary

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("flavor", ["valkey", "redis"])
def test_a_link_cut_past_the_backlog_waits_then_resyncs_and_is_current_again(flavor: str) -> None:
    if (lacking := unavailable()) is not None:
        missing(lacking)
    server_binary(flavor)
    server_binary("valkey")
    result = LinkCut(**run_in_namespace(flavor))
    print(result)
    assert result.link_sources == ["127.0.0.1"], result  # the cut takes the link, not the writer beside the primary
    assert result.alive, result  # waited through the cut, saying so
    assert any("does not answer" in n and "waiting for it" in n for n in result.said_while_cut), result
    assert any("answers again" in n for n in result.start_over), result
    assert result.cpu_while_cut < 0.3 * result.cut, result  # and did not spin
    # what RedisStandbyLinkDown reads: the lost link says 0 while it waits (no lag can grow), 1 once it streams
    assert [line.split(",")[1] for line in result.link_up_while_cut] == ['shard="shard-1"} 0'], result
    assert [line.split(",")[1] for line in result.link_up_after] == ['shard="shard-1"} 1'], result
    assert any("must start over: backlog overrun" in n and "copying it again from scratch" in n
               for n in result.start_over), result
    assert result.lost == 0 and result.acked > 0, result
    shard = result.last_lag["shards"]["shard-1"]
    assert shard["phase"] == "stream" and 0 <= shard["lag_bytes"] < 100_000, result
