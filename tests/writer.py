"""A concurrent writer that records every acknowledged write: the referee for data-moving operations.

It writes `w:<n>` = `<n>` (and a few keys with hash tags) as fast as the client allows, remembers each
write the server acknowledged and when, retries on errors (MOVED/ASK are handled by the cluster client),
and afterwards checks that every acknowledged key still holds its value.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redis.backoff import ExponentialBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry

from opsctl.base.poll import wait_for
from opsctl.spec.load import LoadedSpec
from tests.support import CONDITION_BOUND, PASSWORD


def cluster_client(loaded: LoadedSpec, **tls: Any) -> RedisCluster:
    """tls: redis-py's ssl options (tests.support.tls_client_options) for a TLS cluster."""
    nodes = [ClusterNode(n.address, n.port) for n in loaded.layout.servers]
    return RedisCluster(startup_nodes=nodes, password=PASSWORD, decode_responses=True,
                        socket_timeout=2.0, retry=Retry(ExponentialBackoff(cap=0.05, base=0.005), 10), **tls)


@dataclass
class Writer:
    """Run with `with Writer(make_client) as w:`; `w.verify()` afterwards."""

    make_client: Callable[[], Any]
    prefix: str = "w"
    pause: float = 0.0
    acked: dict[str, str] = field(default_factory=dict)
    ack_times: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Writer:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=30)

    def wait_for_writes(self, count: int, timeout: float = CONDITION_BOUND) -> None:
        deadline = time.monotonic() + timeout
        while len(self.acked) < count and time.monotonic() < deadline:
            time.sleep(0.005)

    def wait_for_more(self, count: int, timeout: float = CONDITION_BOUND) -> None:
        """Until `count` writes more than now are acknowledged: a test's premise, so a timeout fails it."""
        target = len(self.acked) + count
        wait_for(lambda: len(self.acked) >= target or None, timeout, f"{count} more acknowledged writes",
                 last_reason=lambda: f"{len(self.acked)} of {target} acknowledged, last errors {self.errors[-2:]}")

    def wait_for_tries(self, count: int, timeout: float = CONDITION_BOUND) -> None:
        """Until `count` writes more than now were tried, acknowledged or refused (the node was written to)."""
        target = len(self.acked) + len(self.errors) + count
        wait_for(lambda: len(self.acked) + len(self.errors) >= target or None, timeout, f"{count} more writes tried")

    def wait_for_refusal(self, timeout: float = CONDITION_BOUND) -> None:
        """Until a write after now is refused (a fence, a cutover, a demoted master)."""
        target = len(self.errors) + 1
        wait_for(lambda: len(self.errors) >= target or None, timeout, "a write refused",
                 last_reason=lambda: f"{len(self.acked)} acknowledged, none refused")

    def _run(self) -> None:
        client = self.make_client()
        n = 0
        while not self._stop.is_set():
            key = f"{self.prefix}:{n}" if n % 10 else f"{self.prefix}:{{tag{n % 7}}}:{n}"
            try:
                client.set(key, str(n))
            except Exception as exc:  # redis-py's cluster client can raise anything mid-failover
                self.errors.append(f"{time.monotonic():.3f} {type(exc).__name__}: {exc}")
                time.sleep(0.01)
                with contextlib.suppress(Exception):
                    client = self.make_client()
                continue
            self.acked[key] = str(n)
            self.ack_times.append(time.monotonic())
            n += 1
            if self.pause:
                time.sleep(self.pause)

    @property
    def max_gap_ms(self) -> float:
        times = self.ack_times
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0) * 1000

    def verify(self, client: Any) -> list[str]:
        """Acknowledged keys that are missing or changed, each with what was expected (empty = nothing lost)."""
        return [f"{key}: expected {self.acked[key]!r}, got {value!r}" for key, value in self.lost(client)]

    def lost(self, client: Any) -> list[tuple[str, str | None]]:
        """(key, value found) for every acknowledged key that is missing or changed."""
        found = []
        keys = list(self.acked)
        for i in range(0, len(keys), 500):
            batch = keys[i:i + 500]
            pipe = client.pipeline()
            for key in batch:
                pipe.get(key)
            found += [(key, value) for key, value in zip(batch, pipe.execute(), strict=True)
                      if value != self.acked[key]]
        return found


def dataset_checksum(client: RedisCluster, match: str = "*") -> tuple[int, str]:
    """Count and order-independent checksum of every key and string value in the cluster (SCAN on masters)."""
    digest = 0
    count = 0
    for node in client.get_primaries():
        conn = client.get_redis_connection(node)
        for key in conn.scan_iter(match=match, count=1000):
            value = conn.get(key)
            digest ^= int.from_bytes(hashlib.sha256(f"{key}={value}".encode()).digest()[:8], "big")
            count += 1
    return count, f"{digest:016x}"
