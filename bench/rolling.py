"""bench/rolling: a rolling restart by opsctl under concurrent writers that must lose nothing.

Prints the total time of `opsctl restart` and each writer's max write gap (ms between two acknowledged writes),
next to the same writer's largest gap while idle. A sentinel topology runs two writers that discover the
master through Sentinel the two ways clients do: redis-py's `Sentinel` (SENTINEL MASTERS; left alone, the
leading sentinel names the new master there only once it has re-pointed every replica, ~2 s) and
GET-MASTER-ADDR-BY-NAME (Jedis, Lettuce, go-redis; left alone, once a sentinel confirmed the promotion through
its once-a-second INFO). opsctl tells every sentinel right after the promotion (opsctl.failover.announce), so
both should see it within ms of the replica answering ROLE master: the floor is that promotion, which the
timeline shows. With `--timeline` it prints, per failover, when each step became visible (polled every 5 ms).

    .venv/bin/python bench/rolling.py [--flavor valkey redis] [--topology cluster sentinel] [--timeline]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opsctl.spec.layout import sentinel_master_name  # noqa: E402
from opsctl.spec.load import LoadedSpec  # noqa: E402
from opsctl.state.specfile import read_spec  # noqa: E402
from tests.support import PASSWORD, PASSWORD_ENV, make_spec, server_tmpdir, write_spec  # noqa: E402
from tests.test_rolling import sentinel_client  # noqa: E402
from tests.writer import Writer, cluster_client  # noqa: E402

OPSCTL = [sys.executable, "-m", "opsctl.cli.main"]


def env() -> dict[str, str]:
    return {**os.environ, PASSWORD_ENV: PASSWORD}


def opsctl(*argv: str) -> float:
    started = time.monotonic()
    subprocess.run([*OPSCTL, *argv], env=env(), check=True, capture_output=True)
    return time.monotonic() - started


def addr_client(loaded: LoadedSpec) -> redis.Redis:
    """Discovery as Jedis, Lettuce and go-redis do it: GET-MASTER-ADDR-BY-NAME on the first sentinel that answers."""
    name = sentinel_master_name(loaded.spec)
    for node in loaded.layout.sentinels:
        with contextlib.suppress(redis.RedisError):
            sentinel = redis.Redis(host=node.address, port=node.port, password=PASSWORD, socket_timeout=0.5)
            host, port = sentinel.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", name)
            return redis.Redis(host=host.decode(), port=int(port), password=PASSWORD, socket_timeout=1.0,
                               decode_responses=True)
    raise redis.ConnectionError("no sentinel answered")


class Timeline(threading.Thread):
    """Every 5 ms: which server answers ROLE master, and what each sentinel names (MASTERS and GET-MASTER-ADDR)."""

    def __init__(self, loaded: LoadedSpec) -> None:
        super().__init__(daemon=True)
        self.loaded = loaded
        self.events: list[tuple[float, str]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        name = sentinel_master_name(self.loaded.spec)
        clients = {n.name: redis.Redis(host=n.address, port=n.port, password=PASSWORD, socket_timeout=0.5,
                                       decode_responses=True) for n in self.loaded.layout.nodes}
        endpoint = {f"{n.address}:{n.port}": n.name for n in self.loaded.layout.servers}
        last: dict[str, Any] = {}
        while not self.stop.is_set():
            for node in self.loaded.layout.nodes:
                with contextlib.suppress(redis.RedisError):
                    client = clients[node.name]
                    if node.is_sentinel:
                        reply = client.execute_command("SENTINEL", "MASTER", name)
                        pairs = reply if isinstance(reply, dict) else dict(zip(reply[::2], reply[1::2], strict=True))
                        views = {"MASTERS": endpoint.get(f"{pairs['ip']}:{pairs['port']}"),
                                 "GET-MASTER-ADDR": endpoint.get(":".join(
                                     client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", name)))}
                    else:
                        views = {"ROLE": client.execute_command("ROLE")[0]}
                    for what, value in views.items():
                        key = f"{node.name} {what}"
                        if last.get(key) != value:
                            if key in last:
                                self.events.append((time.monotonic(), f"{key} -> {value}"))
                            last[key] = value
            time.sleep(0.005)


def gap_window(writer: Writer) -> tuple[float, float]:
    times = writer.ack_times
    i = max(range(1, len(times)), key=lambda k: times[k] - times[k - 1])
    return times[i - 1], times[i]


def measure(directory: Path, topology: str, flavor: str, timeline: bool) -> list[str]:
    spec = write_spec(directory, make_spec(topology, flavor))
    os.environ[PASSWORD_ENV] = PASSWORD
    opsctl("apply", "-f", str(spec), "--auto-approve")
    try:
        loaded = read_spec(spec)
        makers = {"cluster": lambda: cluster_client(loaded)} if topology == "cluster" else \
            {"redis-py Sentinel": lambda: sentinel_client(loaded), "GET-MASTER-ADDR": lambda: addr_client(loaded)}
        rows = []
        probe = Timeline(loaded) if timeline and topology == "sentinel" else None
        for label, make in makers.items():
            with Writer(make) as idle:
                time.sleep(2.0)
            if probe and not probe.is_alive():
                probe.start()
            with Writer(make) as writer:
                writer.wait_for_writes(200)
                took = opsctl("restart", "-f", str(spec), "--auto-approve")
                writer.wait_for_writes(len(writer.acked) + 200)
            lost = len(writer.verify(make()))
            rows.append(f"{topology:<9} {flavor:<7} {label:<18} {took:>9.2f} {writer.max_gap_ms:>11.0f} "
                        f"{idle.max_gap_ms:>12.0f} {lost:>5}")
            if probe:
                rows += _timeline(probe, writer)
        if probe:
            probe.stop.set()
        return rows
    finally:
        opsctl("destroy", "-f", str(spec), "--auto-approve", "--purge")


def _timeline(probe: Timeline, writer: Writer) -> list[str]:
    start, end = gap_window(writer)
    events = [(t, e) for t, e in probe.events if start - 0.05 <= t <= end + 0.05]
    probe.events.clear()
    lines = [f"    largest gap {1000 * (end - start):.0f} ms; what became visible meanwhile (ms after its start):"]
    lines += [f"    {1000 * (t - start):>7.0f}  {e}" for t, e in events]
    promoted = [t for t, e in events if e.endswith("ROLE -> master")]
    named = [t for t, e in events if " MASTERS -> " in e or " GET-MASTER-ADDR -> " in e]
    if promoted and named:
        lines.append(f"    floor: the replica answered ROLE master at {1000 * (promoted[0] - start):.0f} ms (Sentinel's"
                     f" own failover steps); the last sentinel view switched at {1000 * (max(named) - start):.0f} ms")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--flavor", nargs="+", default=["valkey", "redis"])
    parser.add_argument("--topology", nargs="+", default=["cluster", "sentinel"])
    parser.add_argument("--timeline", action="store_true", help="sentinel: print what each node showed when")
    args = parser.parse_args()
    print(f"{'topology':<9} {'flavor':<7} {'writer':<18} {'restart s':>9} {'max gap ms':>11} {'idle gap ms':>12} "
          f"{'lost':>5}")
    for topology in args.topology:
        for flavor in args.flavor:
            with server_tmpdir(prefix="bench-rolling-") as tmp:
                for row in measure(Path(tmp), topology, flavor, args.timeline):
                    print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
