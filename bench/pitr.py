"""bench/pitr: the RPO of `opsctl backup --continuous`: for every acknowledged write, the time from its
acknowledgement until the segment holding it is durable in the store, at a given write rate.

    .venv/bin/python bench/pitr.py [--rate 10000] [--seconds 20] [--segment-seconds 1] [--store s3|folder]

A 3-master Valkey 9.1 cluster (one replica each); writer threads send pipelines of SETs paced to --rate and record
each write's acknowledgement time; the archiver runs as its own process (as under systemd) into a local moto S3
server (--store s3) or a folder (fsynced). Goal (issue 27): the worst lag at 10k writes/s within 1 s.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml
from redis.cluster import ClusterNode, RedisCluster

from opsctl.cli.main import main as opsctl_main
from opsctl.state.specfile import read_spec
from tests.s3server import moto_server
from tests.support import PASSWORD, PASSWORD_ENV, make_spec, server_tmpdir
from tests.test_archive_live import Archiver, rpo

BATCH = 20


def writer(spec: Path, rate: float, seconds: float, threads: int) -> dict[str, float]:
    """Every acknowledged key with its acknowledgement time (time.time()), written by `threads` threads."""
    loaded = read_spec(spec)
    acked: dict[str, float] = {}
    lock = threading.Lock()
    end = time.time() + seconds

    def one(t: int) -> None:
        client = RedisCluster(startup_nodes=[ClusterNode(n.address, n.port) for n in loaded.layout.servers],
                              password=PASSWORD)
        per_batch = BATCH * threads / rate
        n, next_at = 0, time.monotonic()
        while time.time() < end:
            keys = [f"r:{t}:{n + i}" for i in range(BATCH)]
            pipe = client.pipeline()
            for key in keys:
                pipe.set(key, "v")
            pipe.execute()
            now = time.time()
            with lock:
                acked.update(dict.fromkeys(keys, now))
            n += BATCH
            next_at += per_batch
            time.sleep(max(0.0, next_at - time.monotonic()))

    workers = [threading.Thread(target=one, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return acked


def run(rate: float, seconds: float, segment_seconds: float, store: str, threads: int) -> None:
    os.environ.setdefault(PASSWORD_ENV, PASSWORD)
    with ExitStack() as stack:
        root = Path(stack.enter_context(server_tmpdir("opsctl-bench-")))
        url = (stack.enter_context(moto_server()).url("bench") if store == "s3" else str(root / "archive"))
        spec = root / "topology.yaml"
        spec.write_text(yaml.safe_dump(make_spec("cluster", "valkey"), sort_keys=False))
        if opsctl_main(["apply", "-f", str(spec), "--auto-approve"]) != 0:
            raise RuntimeError("apply failed")
        stack.callback(opsctl_main, ["destroy", "-f", str(spec), "--auto-approve", "--purge"])
        archiver = Archiver(spec, url, root / "archive.jsonl", ["--segment-seconds", str(segment_seconds)])
        archiver.wait_segments(3)
        started = time.time()
        acked = writer(spec, rate, seconds, threads)
        archiver.wait_segments(3, after=time.time() + segment_seconds + 0.5)
        archiver.kill(signal.SIGTERM)
        lags = rpo(acked, archiver.events(), url, started + 1, started + seconds - 1)
        achieved = len(acked) / seconds
        print(f"store {store}, segments every {segment_seconds}s, {achieved:.0f} acknowledged writes/s "
              f"({len(lags)} measured): RPO median {lags[len(lags) // 2]:.3f}s, p99 {lags[int(len(lags) * .99)]:.3f}s, "
              f"max {lags[-1]:.3f}s (goal <= 1 s); load {Path('/proc/loadavg').read_text().split()[:3]}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=10_000)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--segment-seconds", type=float, default=1.0)
    parser.add_argument("--store", choices=("s3", "folder"), default="s3")
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()
    run(args.rate, args.seconds, args.segment_seconds, args.store, args.threads)
