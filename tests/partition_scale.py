"""A scale-out under a split (issue 23, item 7c), run inside a fresh network namespace like tests/partition.py:

    python -m tests.partition_scale --flavor redis --seed 1

A 3 x 1 cluster (node timeout 2 s, every host a loopback address with bind-source-addr) holding 20,000 keys; a
cluster client writes; the spec goes to 4 masters and `apply` runs; once it moves slots into the new master, the
second shard's master's host is cut off from the two others for 6 s (the new master, a voter once it holds slots,
is on the first host: the other side keeps the majority and fails the cut-off master over), then healed. Then
what an operator runs: the same `apply` again until the plan is empty. Prints one JSON line (RESULT + ScaleRun)
and stops every server.
"""

from __future__ import annotations

import argparse
import contextlib
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
class ScaleRun:
    """restart_rc, restart_out: the scale-out's apply under the cut; again_rc, again_out: the same apply run
    again after the heal, once `status` is healthy (an old master's resync); shares: each master's slot count at
    the end; applies: `apply` runs until the plan was empty (None: it never was); check_ok: redis-cli's check
    passed; lost: acknowledged writes missing, the first and last of them in seconds after the cut; cut_host: the
    address cut off; cut_at: seconds into the move."""

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
    shares: list[int]
    preload_equal: bool
    settled: float  # seconds from the first apply's end until `status` said healthy (at most 60)

    @property
    def loss_bound(self) -> float:
        """A cluster master cut off takes writes until it sees itself cut (docs/runbooks/partitions.md)."""
        return 1.5 * NODE_TIMEOUT_MS / 1000 + ACK_BOUND_SLACK


def run_in_namespace(flavor: str, seed: int) -> dict[str, Any]:
    return run_module_in_namespace("tests.partition_scale", ["--flavor", flavor, "--seed", str(seed)])


def split_scale(tmp: Path, flavor: str, seed: int) -> ScaleRun:
    import yaml

    from opsctl.base.errors import ConvergenceError
    from opsctl.base.poll import wait_for
    from opsctl.cli.main import main
    from opsctl.state.specfile import read_spec
    from tests.partition_reshard import preload
    from tests.support import cluster_check, make_spec, write_spec
    from tests.writer import Writer, cluster_client, dataset_checksum

    spec = make_spec("cluster", flavor, cluster={"node_timeout_ms": NODE_TIMEOUT_MS})
    spec["hosts"] = [{**h, "source_address": h["address"]} for h in spec["hosts"]]
    path = write_spec(tmp, spec)
    if main(["apply", "-f", str(path), "--auto-approve"]) != 0:
        raise RuntimeError("apply failed")
    try:
        loaded = read_spec(path)
        first = loaded.layout.servers[0].endpoint
        wait_for(lambda: cluster_check(first).returncode == 0 or None, CONDITION_BOUND, "the new cluster to settle")
        preload(loaded, 20_000)
        before = dataset_checksum(cluster_client(loaded), "pre:*")
        data = yaml.safe_load(path.read_text())
        path.write_text(yaml.safe_dump({**data, "cluster": {**data["cluster"], "masters": 4}}))
        victim = loaded.layout.node(loaded.layout.shards[1].master).address  # the new master votes on the other side
        others = sorted({n.address for n in loaded.layout.servers} - {victim})
        partition = Partition()
        try:
            with Writer(lambda: cluster_client(loaded)) as writer:
                writer.wait_for_writes(200)
                proc = subprocess.Popen([sys.executable, "-m", "opsctl.cli.main", "apply", "-f", str(path),
                                         "--auto-approve"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, cwd=ROOT)
                assert proc.stdout is not None
                while "moving" not in proc.stdout.readline() and proc.poll() is None:
                    pass
                started = time.monotonic()
                time.sleep(random.Random(seed).uniform(0.0, 2.0))
                cut_wall = time.monotonic()
                partition.cut([victim], others)
                time.sleep(CUT)
                partition.heal()
                out, _ = proc.communicate(timeout=600)
                healed = time.monotonic()
                with contextlib.suppress(ConvergenceError):  # the old master's full resync after the heal
                    wait_for(lambda: opsctl("status", "-f", str(path))[0] == 0 or None, 60, "status ok", 1.0)
                settled = round(time.monotonic() - healed, 3)
                again_rc, again_out = opsctl("apply", "-f", str(path), "--auto-approve", timeout=600)
                applies = converge(path)
                writer.wait_for_writes(len(writer.acked) + 100, timeout=60)
        finally:
            partition.close()
        wait_for(lambda: cluster_check(first).returncode == 0 or None, CONDITION_BOUND, "the cluster to be ok")
        check = cluster_check(first)
        shares = sorted(int(line.split("slots")[0].rsplit("|", 1)[-1].strip() or 0)
                        for line in check.stdout.splitlines() if "slots |" in line)
        lost = writer.lost(cluster_client(loaded))
        when = dict(zip(writer.acked, writer.ack_times, strict=True))
        lost_at = sorted(when[key] - cut_wall for key, _ in lost) or [0.0]
        return ScaleRun(flavor, seed, proc.returncode, "\n".join(out.splitlines()[-12:]), again_rc, again_out,
                          applies,
                          check.returncode == 0 and "[ERR]" not in check.stdout,
                          "\n".join(check.stdout.splitlines()[-6:]), len(lost), len(writer.acked),
                          round(lost_at[0], 3), round(lost_at[-1], 3), victim, round(cut_wall - started, 3), shares,
                          dataset_checksum(cluster_client(loaded), "pre:*") == before, settled)
    finally:
        main(["destroy", "-f", str(path), "--auto-approve", "--purge"])


def main(argv: list[str]) -> int:
    from tests.support import PASSWORD, PASSWORD_ENV, server_tmpdir

    parser = argparse.ArgumentParser(prog="python -m tests.partition_scale")
    parser.add_argument("--flavor", default="redis", choices=["valkey", "redis"])
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    os.environ.setdefault(PASSWORD_ENV, PASSWORD)
    with server_tmpdir("opsctl-partition-") as tmp:
        run = split_scale(Path(tmp), args.flavor, args.seed)
    print(RESULT + json.dumps(asdict(run)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
