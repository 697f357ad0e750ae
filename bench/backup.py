"""bench/backup: `opsctl backup` against `redis-cli --cluster backup` on the same 3-master cluster with one replica
per master, in one run: seconds, and how many times each tool made a master fork (INFO stats total_forks).

    .venv/bin/python bench/backup.py [valkey|redis] [--keys 500000] [--rounds N] [--baseline DIR]

Goal: opsctl no slower, and no master forked (the replicas save). redis-cli fetches each master's RDB over the
replication protocol, which forks every master. opsctl's time includes what redis-cli does not do: starting a
Python process, the topology lock, the slot check, each replica's catch-up and the key counts for the manifest.

--rounds N times each tool N times, in turns, and prints the min and the median (on a shared machine one run says
little). --baseline DIR also times the opsctl package in DIR (a checkout of an earlier commit, e.g.
`git archive <commit> opsctl | tar -x -C DIR`) in the same turns: before and after on the same cluster and load.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis
import yaml
from redis.cluster import ClusterNode, RedisCluster

from opsctl.cli.main import main as opsctl_main
from opsctl.state.specfile import read_spec
from tests.support import PASSWORD, PASSWORD_ENV, make_spec, redis_cli, server_binary, server_tmpdir

OPSCTL = [sys.executable, "-m", "opsctl.cli.main"]


def forks(spec: Path, role: str) -> int:
    total = 0
    for node in read_spec(spec).layout.servers:
        if node.role == role:
            info = redis.Redis(host=node.address, port=node.port, password=PASSWORD).info("stats")
            total += int(info["total_forks"])
    return total


def settle(spec: Path) -> None:
    """Until no node forks for its own reasons (an AOF rewrite the fill triggered, a replica's full sync)."""
    nodes = read_spec(spec).layout.servers
    while True:
        busy = []
        for node in nodes:
            info = redis.Redis(host=node.address, port=node.port, password=PASSWORD).info("persistence")
            if info["aof_rewrite_in_progress"] or info["rdb_bgsave_in_progress"] or info["aof_rewrite_scheduled"]:
                busy.append(node.name)
        if not busy:
            return
        time.sleep(0.2)


def fill(spec: Path, keys: int) -> None:
    loaded = read_spec(spec)
    client = RedisCluster(startup_nodes=[ClusterNode(n.address, n.port) for n in loaded.layout.servers],
                          password=PASSWORD)
    for at in range(0, keys, 20_000):
        pipe = client.pipeline()
        for i in range(at, min(keys, at + 20_000)):
            pipe.set(f"bench:{i}", "x" * 100)
        pipe.execute()


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=3600, check=False)
    elapsed = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"{argv[:6]} failed ({done.returncode}): {done.stderr[-800:]}{done.stdout[-400:]}")
    return elapsed, done.stdout


def load() -> list[str]:
    return open("/proc/loadavg").read().split(" ", 3)[:3]


def opsctl_backup(spec: Path, to: Path, env: dict[str, str], package: Path) -> tuple[float, int, list[str]]:
    """(seconds, master forks, roles of the savers) of one `opsctl backup`, run from package's folder."""
    before = forks(spec, "master")
    argv = [*OPSCTL, "backup", "-f", str(spec), "--to", str(to), "--output", "json"]
    started = time.monotonic()
    done = subprocess.run(argv, env=env, cwd=package, capture_output=True, text=True, timeout=3600, check=False)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"opsctl backup from {package} failed ({done.returncode}): {done.stderr[-800:]}")
    events = [json.loads(line) for line in done.stdout.splitlines()]
    return seconds, forks(spec, "master") - before, [e["role"] for e in events if e["event"] == "shard-saved"]


def peer_backup(spec: Path, to: Path, env: dict[str, str]) -> tuple[float, int]:
    before = forks(spec, "master")
    to.mkdir(parents=True)
    first = read_spec(spec).layout.servers[0].endpoint
    seconds, _ = timed([redis_cli(), "--cluster", "backup", first, str(to)], env)
    return seconds, forks(spec, "master") - before


def summary(name: str, times: list[float]) -> str:
    return f"{name}: min {min(times):.2f}s, median {statistics.median(times):.2f}s over {len(times)}"


def run(flavor: str, keys: int, rounds: int, baseline: Path | None) -> None:
    server_binary(flavor)
    os.environ.setdefault(PASSWORD_ENV, PASSWORD)
    here = Path(__file__).resolve().parent.parent
    # As installed: with bytecode (PYTHONDONTWRITEBYTECODE would make every opsctl run compile its modules).
    for package in [here, *([baseline] if baseline else [])]:
        compileall.compile_dir(str(package / "opsctl"), quiet=1)
    env = {**os.environ, "REDISCLI_AUTH": PASSWORD}
    print(f"load before: {load()}")
    with server_tmpdir("opsctl-bench-") as root:
        spec = Path(root) / "topology.yaml"
        spec.write_text(yaml.safe_dump(make_spec("cluster", flavor, memory={"maxmemory": "1gb",
                                                                           "policy": "noeviction"}),
                                       sort_keys=False))
        # The baseline reads a copy of the spec: its own spec-cache entry (each tree's entry is keyed by its sources).
        other = spec.with_name("baseline.yaml")
        shutil.copyfile(spec, other)
        if opsctl_main(["apply", "-f", str(spec), "--auto-approve"]) != 0:
            raise RuntimeError("apply failed")
        try:
            fill(spec, keys)
            times: dict[str, list[float]] = {"opsctl": [], "baseline": [], "redis-cli": []}
            for turn in range(rounds):
                settle(spec)
                seconds, master_forks, roles = opsctl_backup(spec, Path(root) / f"opsctl-{turn}", env, here)
                times["opsctl"].append(seconds)
                print(f"opsctl backup: {keys} keys in {seconds:.2f}s, saved by {roles}, masters forked "
                      f"{master_forks} times (load {load()[0]})")
                if baseline:
                    settle(spec)
                    seconds, base_forks, _ = opsctl_backup(other, Path(root) / f"base-{turn}", env, baseline)
                    times["baseline"].append(seconds)
                    print(f"baseline opsctl ({baseline}): {seconds:.2f}s, masters forked {base_forks} times")
                settle(spec)
                peer, peer_forks = peer_backup(spec, Path(root) / f"redis-cli-{turn}", env)
                times["redis-cli"].append(peer)
                print(f"redis-cli --cluster backup: {peer:.2f}s, masters forked {peer_forks} times")
            for name, values in times.items():
                if values:
                    print(summary(name, values))
            ours, theirs = statistics.median(times["opsctl"]), statistics.median(times["redis-cli"])
            print(f"ratio: opsctl takes {ours / theirs:.2f}x redis-cli's time by median, "
                  f"{min(times['opsctl']) / min(times['redis-cli']):.2f}x by min (goal <= 1), "
                  f"master forks {master_forks} vs {peer_forks} (goal 0)")
            if baseline:
                print(f"ratio: the baseline takes {statistics.median(times['baseline']) / theirs:.2f}x redis-cli's "
                      f"time by median, {min(times['baseline']) / min(times['redis-cli']):.2f}x by min")
        finally:
            opsctl_main(["destroy", "-f", str(spec), "--auto-approve", "--purge"])
    print(f"load after: {load()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("flavor", nargs="?", choices=("valkey", "redis"), default="valkey")
    parser.add_argument("--keys", type=int, default=500_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--baseline", type=Path, help="a folder holding another opsctl package to time as well")
    args = parser.parse_args()
    run(args.flavor, args.keys, args.rounds, args.baseline.resolve() if args.baseline else None)
