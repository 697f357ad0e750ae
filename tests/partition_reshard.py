"""A reshard under a split (issue 23, class 2), run inside a fresh network namespace like tests/partition.py:

    python -m tests.partition_reshard --flavor redis --seed 1    # key by key (Redis 7.0)
    python -m tests.partition_reshard --flavor valkey --seed 1   # atomic (Valkey 9.1 CLUSTER MIGRATESLOTS)

The source master's host is cut off from the other hosts while the reshard moves slots and a cluster client writes
(from an address outside every host: it reaches all nodes, as opsctl does), long enough for the source's replica to
be promoted; then healed. Then what an operator runs: `cluster fix`, then `apply` until the plan is empty. Prints
one JSON line (RESULT + ReshardRun) and stops every server it started.
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
from tests.support import CONDITION_BOUND

NODE_TIMEOUT_MS = 2000
CUT = 6.0  # three node timeouts: the source's replica is promoted while the source is cut off


@dataclass(frozen=True)
class ReshardRun:
    """reshard_rc, reshard_out: the reshard under the cut; fix_rc: `cluster fix` after the heal; applies: `apply`
    runs until the plan was empty (None: it never was); served: slots redis-cli's check saw covered; check_ok: it
    passed; lost: acknowledged writes missing; acked: acknowledged writes; preload_equal: the preloaded keys'
    count and checksum unchanged; cut_at: seconds into the move."""

    flavor: str
    seed: int
    reshard_rc: int
    reshard_out: str
    fix_rc: int
    fix_out: str
    applies: int | None
    check_ok: bool
    check_out: str
    lost: int
    acked: int
    first_lost: float
    last_lost: float
    preload_equal: bool
    preload: str
    cut_at: float
    cut: float = CUT
    reshard_ended: float | None = None  # seconds after the cut; None: it ran past the heal

    @property
    def loss_bound(self) -> float:
        """A master cut off takes writes until it sees itself cut: the node timeout, 1.5 x with scheduling (its
        replica's promotion), plus the slack of a loaded machine (docs/runbooks/partitions.md)."""
        return 1.5 * NODE_TIMEOUT_MS / 1000 + ACK_BOUND_SLACK


def run_in_namespace(flavor: str, seed: int, opsctl_cut: float = 0.0) -> dict[str, Any]:
    """opsctl_cut > 0: opsctl and the clients are on the majority's side, cut off from the source that long."""
    return run_module_in_namespace("tests.partition_reshard",
                                   ["--flavor", flavor, "--seed", str(seed), "--opsctl-cut", str(opsctl_cut)])


# --- inside the namespace ---

def opsctl(*argv: str, timeout: float = 120) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "opsctl.cli.main", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, check=False)
    return done.returncode, "\n".join((done.stdout + done.stderr).splitlines()[-15:])


def preload(loaded: Any, count: int) -> None:
    from tests.writer import cluster_client

    client = cluster_client(loaded)
    for start in range(0, count, 5000):
        pipe = client.pipeline()
        for i in range(start, min(count, start + 5000)):
            pipe.set(f"pre:{i}", f"v{i}")
        pipe.execute()
    client.close()


def split_reshard(tmp: Path, flavor: str, seed: int, opsctl_cut: float = 0.0) -> ReshardRun:
    import redis

    from opsctl.base.errors import ConvergenceError
    from opsctl.base.poll import wait_for
    from opsctl.cli.main import main
    from opsctl.state.specfile import read_spec
    from tests.support import cluster_check, make_spec, write_spec
    from tests.writer import Writer, cluster_client, dataset_checksum

    spec = make_spec("cluster", flavor, cluster={"node_timeout_ms": NODE_TIMEOUT_MS},
                     memory={"maxmemory": "512mb", "policy": "noeviction"})
    spec["hosts"] = [{**h, "source_address": h["address"]} for h in spec["hosts"]]
    path = write_spec(tmp, spec)
    if main(["apply", "-f", str(path), "--auto-approve"]) != 0:
        raise RuntimeError("apply failed")
    try:
        loaded = read_spec(path)
        first = loaded.layout.servers[0].endpoint
        wait_for(lambda: cluster_check(first).returncode == 0 or None, CONDITION_BOUND, "the new cluster to settle")
        preload(loaded, 20_000 if flavor == "redis" else 400_000)
        client = cluster_client(loaded)
        before = dataset_checksum(client, "pre:*")
        source, target = (loaded.layout.node(s.master) for s in loaded.layout.shards[:2])
        others = sorted({n.address for n in loaded.layout.servers} - {source.address})
        cut = opsctl_cut or CUT
        if opsctl_cut:  # opsctl and the writer connect from 127.0.0.1 (the loopback route's source address)
            others.append("127.0.0.1")
        extra = ["--max-keys-per-sec", "2000"] if flavor == "redis" else []
        partition = Partition()
        try:
            with Writer(lambda: cluster_client(loaded)) as writer:
                writer.wait_for_writes(100)
                proc = subprocess.Popen([sys.executable, "-m", "opsctl.cli.main", "cluster", "reshard", "-f",
                                         str(path), "--auto-approve", "--from", source.name, "--to", target.name,
                                         "--slots", "4000", *extra], stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, cwd=ROOT)
                assert proc.stdout is not None
                while "moving" not in proc.stdout.readline() and proc.poll() is None:
                    pass
                started = time.monotonic()
                time.sleep(random.Random(seed).uniform(0.3, 1.0) if flavor == "redis" else 0.05)
                cut_wall = time.monotonic()
                cut_at = cut_wall - started
                partition.cut([source.address], others)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(cut)
                reshard_ended = None if proc.returncode is None else round(time.monotonic() - cut_wall, 3)
                time.sleep(max(0.0, cut - (time.monotonic() - cut_wall)))
                partition.heal()
                out, _ = proc.communicate(timeout=600)
                fix_rc, fix_out = opsctl("cluster", "fix", "-f", str(path))
                applies = converge(path)
                writer.wait_for_writes(len(writer.acked) + 100, timeout=60)
        finally:
            partition.close()
        with contextlib.suppress(ConvergenceError):  # a node an apply restarted: the cluster is down a moment
            wait_for(lambda: cluster_check(target.endpoint).returncode == 0 or None, CONDITION_BOUND,
                     "the cluster to be ok")
        check = cluster_check(target.endpoint)
        try:
            lost = writer.lost(cluster_client(loaded))  # a fresh client: the old source is a replica now
        except redis.RedisError as exc:  # said in the result, with the checker's view
            return ReshardRun(flavor, seed, proc.returncode, "\n".join(out.splitlines()[-12:]), fix_rc, fix_out,
                              applies, False, f"{exc}\n{check.stdout[-3000:]}", -1, len(writer.acked), 0, 0, False,
                              str(_checksum(loaded)), round(cut_at, 3), cut, reshard_ended)
        when = dict(zip(writer.acked, writer.ack_times, strict=True))
        lost_at = sorted(when[key] - cut_wall for key, _ in lost) or [0.0]
        after = _checksum(loaded)
        return ReshardRun(flavor, seed, proc.returncode, "\n".join(out.splitlines()[-12:]), fix_rc, fix_out,
                          applies, check.returncode == 0 and "[ERR]" not in check.stdout,
                          "\n".join(check.stdout.splitlines()[-8:]), len(lost), len(writer.acked),
                          round(lost_at[0], 3), round(lost_at[-1], 3), after == before, str(after),
                          round(cut_at, 3), cut, reshard_ended)
    finally:
        main(["destroy", "-f", str(path), "--auto-approve", "--purge"])


def _checksum(loaded: Any) -> tuple[int, str] | str:
    """The preloaded keys' count and checksum on a fresh client, or why they cannot be read (a master holding keys
    of a slot it does not serve answers MOVED)."""
    import redis

    from tests.writer import cluster_client, dataset_checksum

    try:
        return dataset_checksum(cluster_client(loaded), "pre:*")
    except redis.RedisError as exc:
        return f"{type(exc).__name__}: {exc}"


def converge(path: Path) -> int | None:
    """`apply` until `plan` is empty: how many applies it took (None: still changes after three)."""
    for applies in range(4):
        rc, _ = opsctl("plan", "-f", str(path))
        if rc == 0:
            return applies
        if applies < 3:
            opsctl("apply", "-f", str(path), "--auto-approve", timeout=600)
    return None


def main(argv: list[str]) -> int:
    from tests.support import PASSWORD, PASSWORD_ENV, server_tmpdir

    parser = argparse.ArgumentParser(prog="python -m tests.partition_reshard")
    parser.add_argument("--flavor", default="redis", choices=["valkey", "redis"])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--opsctl-cut", type=float, default=0.0)
    args = parser.parse_args(argv)
    os.environ.setdefault(PASSWORD_ENV, PASSWORD)
    with server_tmpdir("opsctl-partition-") as tmp:
        run = split_reshard(Path(tmp), args.flavor, args.seed, args.opsctl_cut)
    print(RESULT + json.dumps(asdict(run)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
