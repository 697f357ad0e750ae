"""bench/backup: `opsctl backup` against `redis-cli --cluster backup` on the same 3-master cluster with one replica
per master, in one run: seconds, and how many times each tool made a master fork (INFO stats total_forks).

    .venv/bin/python bench/backup.py [valkey|redis] [--keys 500000]

Goal: opsctl no slower, and no master forked (the replicas save). redis-cli fetches each master's RDB over the
replication protocol, which forks every master. opsctl's time includes what redis-cli does not do: loading
every file into a scratch server to count its keys for the manifest (reported separately as `verify`).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
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


def run(flavor: str, keys: int) -> None:
    server_binary(flavor)
    os.environ.setdefault(PASSWORD_ENV, PASSWORD)
    # As installed: with bytecode (PYTHONDONTWRITEBYTECODE would make every opsctl run compile its modules).
    compileall.compile_dir(str(Path(__file__).resolve().parent.parent / "opsctl"), quiet=1)
    env = {**os.environ, "REDISCLI_AUTH": PASSWORD}
    print(f"load before: {load()}")
    with server_tmpdir("opsctl-bench-") as root:
        spec = Path(root) / "topology.yaml"
        spec.write_text(yaml.safe_dump(make_spec("cluster", flavor, memory={"maxmemory": "1gb",
                                                                           "policy": "noeviction"}),
                                       sort_keys=False))
        if opsctl_main(["apply", "-f", str(spec), "--auto-approve"]) != 0:
            raise RuntimeError("apply failed")
        try:
            fill(spec, keys)
            settle(spec)
            before = forks(spec, "master")
            seconds, out = timed([*OPSCTL, "backup", "-f", str(spec), "--to", f"{root}/opsctl", "--output",
                                  "json"], env)
            events = [json.loads(line) for line in out.splitlines()]
            master_forks = forks(spec, "master") - before
            roles = [e["role"] for e in events if e["event"] == "shard-saved"]
            print(f"opsctl backup: {keys} keys in {seconds:.1f}s, saved by {roles}, masters forked "
                  f"{master_forks} times ({events[-1]['bytes']} bytes)")
            settle(spec)
            os.makedirs(f"{root}/redis-cli")
            before = forks(spec, "master")
            first = read_spec(spec).layout.servers[0].endpoint
            peer, _ = timed([redis_cli(), "--cluster", "backup", first, f"{root}/redis-cli"], env)
            peer_forks = forks(spec, "master") - before
            print(f"redis-cli --cluster backup: {peer:.1f}s, masters forked {peer_forks} times")
            print(f"ratio: opsctl takes {seconds / peer:.2f}x redis-cli's time (goal <= 1), "
                  f"master forks {master_forks} vs {peer_forks} (goal 0)")
        finally:
            opsctl_main(["destroy", "-f", str(spec), "--auto-approve", "--purge"])
    print(f"load after: {load()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("flavor", nargs="?", choices=("valkey", "redis"), default="valkey")
    parser.add_argument("--keys", type=int, default=500_000)
    args = parser.parse_args()
    run(args.flavor, args.keys)
