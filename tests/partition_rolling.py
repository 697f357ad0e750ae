"""A rolling restart under a split (issue 23, item 7c), run inside a fresh network namespace like tests/partition.py:

    python -m tests.partition_rolling --flavor valkey --seed 1

A 3 x 1 cluster (node timeout 2 s, every host a loopback address with bind-source-addr); a cluster client writes;
`opsctl restart` runs; once its first node restart began, one host (the second shard's master's) is cut off from
the two others for 6 s, then healed. Then what an operator runs: `apply` until the plan is empty. Prints one JSON
line (RESULT + RollingRun) and stops every server it started.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tests.partition import ACK_BOUND_SLACK, RESULT, ROOT, Partition, run_module_in_namespace
from tests.partition_reshard import NODE_TIMEOUT_MS, converge, opsctl
from tests.support import CONDITION_BOUND

CUT = 6.0


@dataclass(frozen=True)
class RollingRun:
    """restart_rc, restart_out: the rolling restart under the cut; again_rc, again_out: the same restart run
    again after the heal; applies: `apply` runs until the plan was empty
    (None: it never was); check_ok: redis-cli's check passed; lost: acknowledged writes missing, the first and
    last of them in seconds after the cut; cut_host: the address cut off; cut_at: seconds into the restart."""

    flavor: str
    seed: int
    restart_rc: int
    restart_out: str
    again_rc: int
    again_out: str
    applies: int | None
    check_ok: bool
    check_out: str
    lost: int
    acked: int
    first_lost: float
    last_lost: float
    cut_host: str
    cut_at: float

    @property
    def loss_bound(self) -> float:
        """A cluster master cut off takes writes until it sees itself cut (docs/runbooks/partitions.md)."""
        return 1.5 * NODE_TIMEOUT_MS / 1000 + ACK_BOUND_SLACK


def run_in_namespace(flavor: str, seed: int) -> dict[str, Any]:
    return run_module_in_namespace("tests.partition_rolling", ["--flavor", flavor, "--seed", str(seed)])


def split_rolling(tmp: Path, flavor: str, seed: int) -> RollingRun:
    from opsctl.base.poll import wait_for
    from opsctl.cli.main import main
    from opsctl.state.specfile import read_spec
    from tests.support import cluster_check, make_spec, write_spec
    from tests.writer import Writer, cluster_client

    spec = make_spec("cluster", flavor, cluster={"node_timeout_ms": NODE_TIMEOUT_MS})
    spec["hosts"] = [{**h, "source_address": h["address"]} for h in spec["hosts"]]
    path = write_spec(tmp, spec)
    if main(["apply", "-f", str(path), "--auto-approve"]) != 0:
        raise RuntimeError("apply failed")
    try:
        loaded = read_spec(path)
        first = loaded.layout.servers[0].endpoint
        wait_for(lambda: cluster_check(first).returncode == 0 or None, CONDITION_BOUND, "the new cluster to settle")
        victim = loaded.layout.node(loaded.layout.shards[1].master).address
        others = sorted({n.address for n in loaded.layout.servers} - {victim})
        partition = Partition()
        try:
            with Writer(lambda: cluster_client(loaded)) as writer:
                writer.wait_for_writes(200)
                proc = subprocess.Popen([sys.executable, "-m", "opsctl.cli.main", "restart", "-f", str(path),
                                         "--auto-approve"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, cwd=ROOT)
                assert proc.stdout is not None
                while "restart " not in proc.stdout.readline() and proc.poll() is None:
                    pass
                started = time.monotonic()
                time.sleep(random.Random(seed).uniform(0.0, 2.0))
                cut_wall = time.monotonic()
                partition.cut([victim], others)
                time.sleep(CUT)
                partition.heal()
                out, _ = proc.communicate(timeout=600)
                again_rc, again_out = opsctl("restart", "-f", str(path), "--auto-approve", timeout=600)
                applies = converge(path)
                writer.wait_for_writes(len(writer.acked) + 100, timeout=60)
        finally:
            partition.close()
        wait_for(lambda: cluster_check(first).returncode == 0 or None, CONDITION_BOUND, "the cluster to be ok")
        check = cluster_check(first)
        lost = writer.lost(cluster_client(loaded))
        when = dict(zip(writer.acked, writer.ack_times, strict=True))
        lost_at = sorted(when[key] - cut_wall for key, _ in lost) or [0.0]
        return RollingRun(flavor, seed, proc.returncode, "\n".join(out.splitlines()[-12:]), again_rc, again_out,
                          applies,
                          check.returncode == 0 and "[ERR]" not in check.stdout,
                          "\n".join(check.stdout.splitlines()[-6:]), len(lost), len(writer.acked),
                          round(lost_at[0], 3), round(lost_at[-1], 3), victim, round(cut_wall - started, 3))
    finally:
        main(["destroy", "-f", str(path), "--auto-approve", "--purge"])


def main(argv: list[str]) -> int:
    from tests.support import PASSWORD, PASSWORD_ENV, server_tmpdir

    parser = argparse.ArgumentParser(prog="python -m tests.partition_rolling")
    parser.add_argument("--flavor", default="valkey", choices=["valkey", "redis"])
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    os.environ.setdefault(PASSWORD_ENV, PASSWORD)
    with server_tmpdir("opsctl-partition-") as tmp:
        run = split_rolling(Path(tmp), args.flavor, args.seed)
    print(RESULT + json.dumps(asdict(run)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
