"""bench/restore: keys from a standalone into a 3-master cluster, by `opsctl restore --from-live` and by
`redis-cli --cluster import --cluster-copy`, in one run, as keys/s and their ratio; then opsctl restore from a
backup directory of the same keys.

    .venv/bin/python bench/restore.py [valkey|redis] [--keys 1000000] [--peer-keys 200000]

redis-cli moves about 13k keys/s (one MIGRATE per key), so it copies a subset of --peer-keys keys (its own
standalone source holding only those): the comparison is by rate, stated as such. Goal: opsctl >= 10x.
Each tool writes into its own empty 3-master cluster. The load average is printed before and after: compare
runs only on a similar machine state.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis
import yaml

from opsctl.cli.main import main as opsctl_main
from opsctl.state.specfile import read_spec
from tests.support import PASSWORD, PASSWORD_ENV, make_spec, redis_cli, server_binary, server_tmpdir

OPSCTL = [sys.executable, "-m", "opsctl.cli.main"]
MEMORY = {"maxmemory": "1gb", "policy": "noeviction"}


@contextmanager
def topology(root: str, name: str, flavor: str, topology_kind: str, **extra: object) -> Iterator[Path]:
    folder = Path(root) / name
    folder.mkdir()
    sections: dict[str, object] = {"memory": MEMORY, **extra}
    if topology_kind == "cluster":
        sections["cluster"] = {"masters": 3, "replicas_per_master": 0}
    spec = folder / "topology.yaml"
    spec.write_text(yaml.safe_dump(make_spec(topology_kind, flavor, **sections), sort_keys=False))
    if opsctl_main(["apply", "-f", str(spec), "--auto-approve"]) != 0:
        raise RuntimeError(f"apply {name} failed")
    try:
        yield spec
    finally:
        opsctl_main(["destroy", "-f", str(spec), "--auto-approve", "--purge"])


def master(spec: Path) -> redis.Redis:
    node = read_spec(spec).layout.servers[0]
    return redis.Redis(host=node.address, port=node.port, password=PASSWORD)


def fill(spec: Path, keys: int) -> None:
    client = master(spec)
    for at in range(0, keys, 20_000):
        pipe = client.pipeline(transaction=False)
        for i in range(at, min(keys, at + 20_000)):
            pipe.set(f"bench:{i}", "x" * 100)
        pipe.execute()


def cluster_keys(spec: Path) -> int:
    total = 0
    for node in read_spec(spec).layout.servers:
        total += redis.Redis(host=node.address, port=node.port, password=PASSWORD).dbsize()
    return total


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=3600, check=False)
    elapsed = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"{argv[:6]} failed ({done.returncode}): {done.stderr[-800:]}{done.stdout[-400:]}")
    return elapsed, done.stdout


def load() -> str:
    return open("/proc/loadavg").read().split(" ", 3)[:3].__str__()


def run(flavor: str, keys: int, peer_keys: int) -> None:
    server_binary(flavor)
    os.environ.setdefault(PASSWORD_ENV, PASSWORD)
    # As installed: with bytecode (PYTHONDONTWRITEBYTECODE would make every opsctl run compile its modules).
    compileall.compile_dir(str(Path(__file__).resolve().parent.parent / "opsctl"), quiet=1)
    env = {**os.environ, "REDISCLI_AUTH": PASSWORD}
    print(f"load before: {load()}")
    with server_tmpdir("opsctl-bench-") as root, ExitStack() as stack:
        source = stack.enter_context(topology(root, "source", flavor, "standalone"))
        peer_source = stack.enter_context(topology(root, "peer-source", flavor, "standalone",  # MIGRATE by name
                                                   hardening={"rename_takeover_commands": False}))
        live_target = stack.enter_context(topology(root, "live", flavor, "cluster"))
        peer_target = stack.enter_context(topology(root, "peer", flavor, "cluster"))
        dir_target = stack.enter_context(topology(root, "from-dir", flavor, "cluster"))
        fill(source, keys)
        fill(peer_source, peer_keys)

        seconds, _ = timed([*OPSCTL, "restore", "-f", str(live_target), "--from-live", str(source)], env)
        assert cluster_keys(live_target) == keys
        ours = keys / seconds
        print(f"opsctl restore --from-live: {keys} keys in {seconds:.1f}s = {ours:.0f} keys/s")

        src = read_spec(peer_source).layout.servers[0]
        dst = read_spec(peer_target).layout.servers[0]
        seconds, _ = timed([redis_cli(), "--cluster", "import", dst.endpoint, "--cluster-from", src.endpoint,
                            "--cluster-from-pass", PASSWORD, "--cluster-copy"], env)
        assert cluster_keys(peer_target) == peer_keys, cluster_keys(peer_target)
        peer = peer_keys / seconds
        print(f"redis-cli --cluster import --cluster-copy: {peer_keys} keys in {seconds:.1f}s = {peer:.0f} keys/s")
        print(f"ratio (rates): opsctl {ours / peer:.1f}x redis-cli (goal >= 10x)")

        seconds, out = timed([*OPSCTL, "backup", "-f", str(source), "--to", str(Path(root) / "backups"),
                              "--output", "json"], env)
        folder = json.loads(out.splitlines()[-1])["dir"]
        print(f"opsctl backup of {keys} keys: {seconds:.1f}s")
        seconds, _ = timed([*OPSCTL, "restore", "-f", str(dir_target), "--from", folder], env)
        assert cluster_keys(dir_target) == keys
        print(f"opsctl restore --from DIR: {keys} keys in {seconds:.1f}s = {keys / seconds:.0f} keys/s")
    print(f"load after: {load()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("flavor", nargs="?", choices=("valkey", "redis"), default="valkey")
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--peer-keys", type=int, default=200_000)
    args = parser.parse_args()
    run(args.flavor, args.keys, args.peer_keys)
