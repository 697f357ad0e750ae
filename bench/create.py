"""bench/create: a cluster from nothing, opsctl vs `redis-cli --cluster create`, same binaries, same run.

Both sides start the same number of server processes from the same rendered configs and stop the clock
when `redis-cli --cluster check` passes. Prints both times and the ratio (goal: opsctl <= 0.25x redis-cli).

    .venv/bin/python bench/create.py [--nodes 6 30] [--flavor valkey redis]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opsctl.binaries import find_server  # noqa: E402
from opsctl.providers.local import LocalProvider  # noqa: E402
from opsctl.render import render_node  # noqa: E402
from opsctl.specfile import read_spec  # noqa: E402
from opsctl.versions import parse_version  # noqa: E402
from tests.support import PASSWORD, PASSWORD_ENV, make_spec, write_spec  # noqa: E402

OPSCTL = [sys.executable, "-m", "opsctl.cli"]


def env() -> dict[str, str]:
    return {**os.environ, PASSWORD_ENV: PASSWORD, "REDISCLI_AUTH": PASSWORD}


def check(endpoint: str) -> bool:
    out = subprocess.run(["redis-cli", "--cluster", "check", endpoint], capture_output=True, text=True,
                         env=env(), check=False)
    return out.returncode == 0 and "All 16384 slots covered" in out.stdout


def all_ok(endpoints: list[str]) -> bool:
    """Every node reports cluster_state:ok, i.e. the cluster accepts writes."""
    for endpoint in endpoints:
        host, port = endpoint.rsplit(":", 1)
        out = subprocess.run(["redis-cli", "-h", host, "-p", port, "cluster", "info"], capture_output=True,
                             text=True, env=env(), check=False).stdout
        if "cluster_state:ok" not in out:
            return False
    return True


def spec_file(directory: Path, nodes: int, flavor: str) -> Path:
    spec = make_spec("cluster", flavor, cluster={"masters": nodes // 2, "replicas_per_master": 1})
    return write_spec(directory, spec)


def time_opsctl(directory: Path, nodes: int, flavor: str) -> float:
    path = spec_file(directory / "opsctl", nodes, flavor) if (directory / "opsctl").mkdir() is None else None
    assert path
    started = time.monotonic()
    subprocess.run([*OPSCTL, "apply", "-f", str(path), "--auto-approve"], env=env(), check=True,
                   capture_output=True)
    loaded = read_spec(path, env())
    while not check(loaded.layout.servers[0].endpoint):
        time.sleep(0.01)
    elapsed = time.monotonic() - started
    subprocess.run([*OPSCTL, "destroy", "-f", str(path), "--auto-approve", "--purge"], env=env(), check=True,
                   capture_output=True)
    return elapsed


def time_redis_cli(directory: Path, nodes: int, flavor: str) -> tuple[float, float]:
    (directory / "rcli").mkdir()
    loaded = read_spec(spec_file(directory / "rcli", nodes, flavor), env())
    spec = loaded.spec
    binary = find_server(spec.server.flavor, parse_version(spec.server.version), None)
    provider = LocalProvider(loaded, directory / "rcli" / "state", binary)
    servers = loaded.layout.servers
    for node in servers:
        provider.write_files(node, render_node(loaded, node, provider.paths(node), reveal=True).files)
    started = time.monotonic()
    try:
        for node in servers:
            provider.start(node)
        endpoints = [n.endpoint for n in servers]
        subprocess.run(["redis-cli", "--cluster", "create", *endpoints, "--cluster-replicas", "1",
                        "--cluster-yes"], env=env(), check=True, capture_output=True)
        while not check(servers[0].endpoint):
            time.sleep(0.01)
        checked = time.monotonic() - started
        while not all_ok(endpoints):
            time.sleep(0.01)
        return checked, time.monotonic() - started
    finally:
        for node in servers:
            provider.stop(node)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[6, 30])
    parser.add_argument("--flavor", nargs="+", default=["valkey", "redis"])
    args = parser.parse_args()
    if not shutil.which("redis-cli"):
        print("redis-cli is needed (apt-get install redis-tools)", file=sys.stderr)
        return 1
    print("opsctl apply returns once every node says cluster_state:ok; redis-cli is timed twice: until")
    print("`--cluster check` passes, and until every node says cluster_state:ok (the cluster takes writes).")
    print(f"{'flavor':<8} {'nodes':>5} {'opsctl s':>9} {'rcli check s':>13} {'rcli ok s':>10} "
          f"{'ratio/check':>12} {'ratio/ok':>9}  goal <= 0.25")
    for flavor in args.flavor:
        for nodes in args.nodes:
            with tempfile.TemporaryDirectory(prefix="bench-create-") as tmp:
                ours = time_opsctl(Path(tmp), nodes, flavor)
                checked, usable = time_redis_cli(Path(tmp), nodes, flavor)
            print(f"{flavor:<8} {nodes:>5} {ours:>9.2f} {checked:>13.2f} {usable:>10.2f} "
                  f"{ours / checked:>12.2f} {ours / usable:>9.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
