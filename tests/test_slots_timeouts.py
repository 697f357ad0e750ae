"""Every wait of a slot move is bounded (issue 23, class 2): an engine connection waits for a node's next reply
a few node timeouts (plus the longest MIGRATE it has in flight), not the 300 s that outlasted a split in which a
silent source (packets dropped) held a round trip until the heal. Pure, plus a silent socket."""

from __future__ import annotations

import socket
import time

import pytest

from opsctl.net.rawpipe import PIPE_ERRORS, RawPipe
from opsctl.slots.batching import base_timeout_ms, engine_timeout_s, timeout_ms, trip_timeout_s


@pytest.mark.parametrize("node_timeout_ms", [500, 2000, 5000, 15000])
def test_the_engine_waits_a_few_node_timeouts(node_timeout_ms: int) -> None:
    wait = engine_timeout_s(node_timeout_ms)
    assert wait >= base_timeout_ms(node_timeout_ms) / 1000 + node_timeout_ms / 1000  # a MIGRATE it may be running
    assert wait <= 3 * node_timeout_ms / 1000 + 20
    assert engine_timeout_s(2000) == 15.0 and engine_timeout_s(5000) == 22.5


def test_a_big_keys_migrate_gets_its_own_time_on_top() -> None:
    big = timeout_ms(512 * 1024 * 1024, base_timeout_ms(5000))
    assert trip_timeout_s([big, 2500], 5000) == big / 1000 + engine_timeout_s(5000)
    assert trip_timeout_s([], 5000) == engine_timeout_s(5000)


def test_a_silent_node_fails_the_round_trip_after_its_timeout() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        peer, _ = server.accept()  # accepts, never answers: a split that drops every packet looks the same
        pipe = RawPipe.on_socket(client, "silent")
        pipe.settimeout(0.2)
        started = time.monotonic()
        with pytest.raises(PIPE_ERRORS):
            pipe.call("PING")
        assert time.monotonic() - started < 30  # a hang guard: the 0.2 s timeout ended it, not a hang
        pipe.close()
        peer.close()
