"""bench/balance: `cluster rebalance --by cpu` under a skewed load, in one run (issue 37's goals).

    .venv/bin/python bench/balance.py [--keys 20000] [--window 5] [--clients 4]

A Valkey 9.1 cluster of three masters (no replicas), cluster.slot_stats on, `--keys` keys spread over every slot.
Clients (threads, one RedisCluster connection each) GET/SET in a loop: 85% of the operations on keys in 60 slots
of the first master, the rest on keys spread over all slots. Phases, the load running throughout:

1. no measurement: cluster-slot-stats-enabled off (CONFIG SET), the clients' latencies for --window seconds;
2. measured: the counters on, `cluster rebalance --by cpu --dry-run --window W` (the spread now, by the plan);
3. the rebalance itself, `--by cpu --window W --auto-approve` (keys moved, time taken);
4. after: a dry run measures the spread again under the same load.

Prints the busiest master's cpu over the mean before and after (goal: within 1.2x after), the keys and slots
moved, the time, the clients' p99 latency during phase 2's window against phase 1 (goal: within 1.2x), and the
machine's load average before and after. The spread is opsctl's own measurement (CLUSTER SLOT-STATS cpu-usec
deltas summed per master). Short by default: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml
from redis.cluster import ClusterNode, RedisCluster

from opsctl.cli.main import main as opsctl_main
from opsctl.spec.load import LoadedSpec
from opsctl.state.specfile import read_spec
from tests.support import PASSWORD, PASSWORD_ENV, admin_for, make_spec, server_binary, server_tmpdir

OPSCTL = [sys.executable, "-m", "opsctl.cli.main"]
HOT_SLOTS = 60
HOT_SHARE = 0.85


class Load:
    """Client threads; each operation's latency lands in the current phase's list."""

    def __init__(self, loaded: LoadedSpec, hot: list[str], cold: list[str], clients: int) -> None:
        self.loaded, self.hot, self.cold = loaded, hot, cold
        self.phase = "warmup"
        self.latency: dict[str, list[float]] = {}
        self.errors = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)]

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)

    def _run(self, seed: int) -> None:
        client = client_for(self.loaded)
        rng = random.Random(seed)
        while not self._stop.is_set():
            key = rng.choice(self.hot if rng.random() < HOT_SHARE else self.cold)
            started = time.perf_counter()
            try:
                client.set(key, "v" * 100) if rng.random() < 0.5 else client.get(key)
            except Exception:  # a slot moving: counted, the load goes on
                self.errors += 1
                continue
            self.latency.setdefault(self.phase, []).append(time.perf_counter() - started)


def client_for(loaded: LoadedSpec) -> RedisCluster:
    nodes = [ClusterNode(n.address, n.port) for n in loaded.layout.servers]
    return RedisCluster(startup_nodes=nodes, password=PASSWORD, decode_responses=True, socket_timeout=5.0)


def p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[int(len(ordered) * 0.99)] * 1000 if ordered else float("nan")


def rebalance(path: Path, *extra: str) -> tuple[dict[str, Any], float]:
    env = {**os.environ, PASSWORD_ENV: PASSWORD}
    started = time.monotonic()
    done = subprocess.run([*OPSCTL, "cluster", "rebalance", "-f", str(path), "--by", "cpu", "--output", "json",
                           *extra], env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"rebalance failed: {done.stderr}")
    return json.loads(done.stdout), time.monotonic() - started


def set_stats(loaded: LoadedSpec, on: bool) -> None:
    for node in loaded.layout.servers:
        with admin_for(loaded, node) as admin:
            admin.config_set("cluster-slot-stats-enabled", "yes" if on else "no")


def keys_for(client: RedisCluster, master_endpoint: str, keys: int) -> tuple[list[str], list[str]]:
    """Hot keys (in HOT_SLOTS slots of the master at master_endpoint) and cold keys (spread over all slots)."""
    client.nodes_manager.initialize()
    by_slot: dict[int, list[str]] = {}
    for i in range(keys):
        by_slot.setdefault(client.keyslot(f"k:{i}"), []).append(f"k:{i}")
    mine = [s for s in sorted(by_slot) if (n := client.nodes_manager.get_node_from_slot(s)) is not None
            and f"{n.host}:{n.port}" == master_endpoint]
    hot_slots = mine[::max(1, len(mine) // HOT_SLOTS)][:HOT_SLOTS]
    return [k for s in hot_slots for k in by_slot[s]], [f"k:{i}" for i in range(keys)]


def run(path: Path, keys: int, window: float, clients: int) -> int:
    loaded = read_spec(path)
    client = client_for(loaded)
    for start in range(0, keys, 1000):
        pipe = client.pipeline()
        for i in range(start, min(keys, start + 1000)):
            pipe.set(f"k:{i}", "v" * 100)
        pipe.execute()
    hot, cold = keys_for(client, loaded.layout.node(loaded.layout.shards[0].master).endpoint, keys)
    print(f"load average before: {load_average()}; {keys} keys, {len(hot)} hot keys in {HOT_SLOTS} slots, "
          f"{clients} clients, window {window:g}s")
    with Load(loaded, hot, cold, clients) as load:
        set_stats(loaded, False)
        load.phase = "no measurement"
        time.sleep(window)  # the baseline phase: the clients' latencies with no counters and no measurement
        set_stats(loaded, True)
        load.phase = "measured"
        before, _ = rebalance(path, "--window", str(window), "--dry-run")
        load.phase = "moves"
        moved, seconds = rebalance(path, "--window", str(window), "--auto-approve")
        load.phase = "after"
        after, _ = rebalance(path, "--window", str(window), "--dry-run")
    plan = moved["plan"]
    print(f"spread (busiest master's cpu / mean): before {before['plan']['spread_now']:.2f}x, "
          f"planned after {plan['spread_after']:.2f}x, measured after {after['plan']['spread_now']:.2f}x "
          f"(goal <= 1.2x)")
    print(f"moved {len(plan['slot_moves'])} slots, {plan['keys_moved']} keys (measured), "
          f"{moved['summary'].get('keys', 0)} keys (the engine's count: an estimate on the atomic path) "
          f"in {seconds:.1f}s (measurement window included)")
    base, measured = p99(load.latency.get("no measurement", [])), p99(load.latency.get("measured", []))
    print(f"clients' p99: no measurement {base:.2f} ms, measuring {measured:.2f} ms ({measured / base:.2f}x, "
          f"goal <= 1.2x); during the moves {p99(load.latency.get('moves', [])):.2f} ms; "
          f"{load.errors} client errors")
    print(f"load average after: {load_average()}")
    return 0


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--window", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args()
    os.environ.setdefault(PASSWORD_ENV, PASSWORD)
    server_binary("valkey")
    with server_tmpdir() as tmp:
        spec = make_spec("cluster", "valkey", cluster={"replicas_per_master": 0, "slot_stats": True},
                         memory={"maxmemory": "256mb", "policy": "noeviction"})
        path = Path(tmp) / "topology.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        if opsctl_main(["apply", "-f", str(path), "--auto-approve"]) != 0:
            return 1
        try:
            return run(path, args.keys, args.window, args.clients)
        finally:
            opsctl_main(["destroy", "-f", str(path), "--auto-approve", "--purge"])


if __name__ == "__main__":
    sys.exit(main())
