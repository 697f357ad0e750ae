"""bench/rolling: a rolling restart of a 3-master/3-replica cluster by opsctl under a concurrent writer.

Prints the total time of `opsctl restart` and the client's max write gap (ms between two acknowledged
writes), next to the same writer's largest gap while idle, and checks that no acknowledged write was lost.

    .venv/bin/python bench/rolling.py [--flavor valkey redis] [--topology cluster sentinel]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opsctl.specfile import read_spec  # noqa: E402
from tests.support import PASSWORD, PASSWORD_ENV, make_spec, server_tmpdir, write_spec  # noqa: E402
from tests.test_rolling import sentinel_client  # noqa: E402
from tests.writer import Writer, cluster_client  # noqa: E402

OPSCTL = [sys.executable, "-m", "opsctl.cli"]


def env() -> dict[str, str]:
    return {**os.environ, PASSWORD_ENV: PASSWORD}


def opsctl(*argv: str) -> float:
    started = time.monotonic()
    subprocess.run([*OPSCTL, *argv], env=env(), check=True, capture_output=True)
    return time.monotonic() - started


def measure(directory: Path, topology: str, flavor: str) -> tuple[float, float, float, int]:
    spec = write_spec(directory, make_spec(topology, flavor))
    os.environ[PASSWORD_ENV] = PASSWORD
    opsctl("apply", "-f", str(spec), "--auto-approve")
    try:
        loaded = read_spec(spec)
        client = (lambda: cluster_client(loaded)) if topology == "cluster" else (lambda: sentinel_client(loaded))
        with Writer(client) as idle:
            time.sleep(2.0)
        with Writer(client) as writer:
            writer.wait_for_writes(200)
            took = opsctl("restart", "-f", str(spec), "--auto-approve")
            writer.wait_for_writes(len(writer.acked) + 200)
        lost = len(writer.verify(client()))
        return took, writer.max_gap_ms, idle.max_gap_ms, lost
    finally:
        opsctl("destroy", "-f", str(spec), "--auto-approve", "--purge")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--flavor", nargs="+", default=["valkey", "redis"])
    parser.add_argument("--topology", nargs="+", default=["cluster", "sentinel"])
    args = parser.parse_args()
    print(f"{'topology':<9} {'flavor':<7} {'restart s':>9} {'max gap ms':>11} {'idle gap ms':>12} {'lost':>5}")
    for topology in args.topology:
        for flavor in args.flavor:
            with server_tmpdir(prefix="bench-rolling-") as tmp:
                took, gap, idle, lost = measure(Path(tmp), topology, flavor)
            print(f"{topology:<9} {flavor:<7} {took:>9.2f} {gap:>11.0f} {idle:>12.0f} {lost:>5}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
