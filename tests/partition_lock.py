"""Two opsctl runs on opposite sides of a split (issue 33, item 7), inside a fresh network namespace like
tests/partition.py:

    python -m tests.partition_lock --flavor valkey

A 3 x 1 cluster on three hosts (two servers each) is split: one host (2 of 6 servers) from the two others (4 of
6). Each opsctl run is put on one side by its group id: iptables drops what a process of that group sends to the
other side's servers (`-m owner --gid-owner`), so a run sees only its side's servers, as one on a host there
would. Both runs start at once, each the same `cluster reshard` between two masters of the majority's side, each
from its own state dir (two operators): only the majority's may act; the minority's exits 3 naming how many
servers granted it the lock. After the heal, the minority's run is started again: it proceeds, or reports
cleanly who holds the lock. Then the gap this closes: a run holds the lock of the whole topology when the split
puts it on the minority's side, and a run on the majority's side tries until it takes the lock over (once the
holder's markers there went stale, or vanished: an owner rule does not match the last packets of a connection
its process closed, so those get through): the holder must count its lock lost before that. Prints one JSON line
(RESULT + LockRun) and stops every server it started.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tests.partition import CHAIN, RESULT, ROOT, Partition, run_module_in_namespace
from tests.support import CONDITION_BOUND

NODE_TIMEOUT_MS = 2000
MAJORITY_GID, MINORITY_GID = 47001, 47002  # the groups the two runs run as (uid stays root)
SLOTS = 100
LEASE = "6"  # the holder's and the taker's OPSCTL_LOCK_LEASE: short, so the takeover comes within seconds
HOLD = """
import sys, time
from opsctl.base.errors import OpsctlError
from opsctl.net.connector import Connector
from opsctl.net.topolock import topology_lock
from opsctl.state.specfile import read_spec
try:
    with topology_lock(Connector(read_spec(sys.argv[1]))) as lock:
        print("held", len(lock.held), lock.epoch, flush=True)
        while True:  # what a run does before each change
            lock.check()
            time.sleep(0.02)
except OpsctlError as exc:
    print("lost", time.monotonic(), exc.summary, flush=True)
"""
TAKE = """
import sys, time
from opsctl.base.errors import RefusedError
from opsctl.net.connector import Connector
from opsctl.net.topolock import topology_lock
from opsctl.state.specfile import read_spec
loaded = read_spec(sys.argv[1])
deadline, refused = time.monotonic() + 60, []
while time.monotonic() < deadline:
    try:
        with topology_lock(Connector(loaded)) as lock:
            print("taken", time.monotonic(), len(lock.held), lock.epoch, len(refused), flush=True)
            break
    except RefusedError as exc:
        refused.append(exc.summary)
        time.sleep(0.1)  # a retry, as a run that waits for the lock would
else:
    print("never", refused[-1:], flush=True)
"""


@dataclass(frozen=True)
class LockRun:
    """majority_rc/out, minority_rc/out: the two runs started at once under the split; again_rc/out: the minority's
    run started again after the heal; moved: slots the second master serves more than before (SLOTS per run that
    acted); sides: servers per side."""

    flavor: str
    majority_rc: int
    majority_out: str
    minority_rc: int
    minority_out: str
    minority_seconds: float
    again_rc: int
    again_out: str
    moved: int
    sides: list[list[str]]
    holder: str = ""  # the holder cut off: "held <servers> <epoch>"
    holder_lost: float | None = None  # seconds after the cut it counted its lock lost
    holder_said: str = ""
    taken: float | None = None  # seconds after the cut the majority's run took the lock
    taker: str = ""  # "<servers> <epoch> <refusals before>"


def run_in_namespace(flavor: str) -> dict[str, Any]:
    return run_module_in_namespace("tests.partition_lock", ["--flavor", flavor])


# --- inside the namespace ---

def side_of(gid: int, unreachable: list[str]) -> None:
    """Processes of group gid reach none of the unreachable addresses (rules in the partition's chain: healed
    with it)."""
    for address in unreachable:
        subprocess.run(["iptables", "-A", CHAIN, "-m", "owner", "--gid-owner", str(gid), "-d", address, "-j", "DROP"],
                       check=True, capture_output=True)


def opsctl(gid: int, *argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "opsctl.cli.main", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=ROOT, group=gid, extra_groups=[])


def python(gid: int, script: str, path: Path) -> subprocess.Popen[str]:
    from opsctl.net.quorum import LEASE_ENV

    return subprocess.Popen([sys.executable, "-c", script, str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=ROOT, group=gid, extra_groups=[],
                            env={**os.environ, LEASE_ENV: LEASE})


def holder_cut_off(path: Path, minority: list[str], majority: list[str]) -> dict[str, Any]:
    """The holder (all six servers) is put on the minority's side; a run on the majority's side tries to take the
    lock until it does. Times in seconds after the cut."""
    holder = python(MINORITY_GID, HOLD, path)
    assert holder.stdout is not None
    held = holder.stdout.readline().strip()
    partition = Partition()
    try:
        partition.cut(minority, majority)
        side_of(MAJORITY_GID, minority)
        side_of(MINORITY_GID, majority)
        cut_at = time.monotonic()
        taker = python(MAJORITY_GID, TAKE, path)
        taken, _ = taker.communicate(timeout=300)
        lost, _ = holder.communicate(timeout=300)
    finally:
        partition.close()
        holder.kill()
    # the last line that says so: a note (a takeover from stale markers waits one lease) may come before it
    lost_words = next((line.split(maxsplit=2) for line in reversed(lost.splitlines()) if line.startswith("lost ")), [])
    taken_words = next((line.split() for line in reversed(taken.splitlines()) if line.startswith("taken ")), [])
    return {"holder": held, "holder_said": lost.strip()[-400:],
            "holder_lost": round(float(lost_words[1]) - cut_at, 3) if lost_words[:1] == ["lost"] else None,
            "taken": round(float(taken_words[1]) - cut_at, 3) if taken_words[:1] == ["taken"] else None,
            "taker": " ".join(taken_words[2:]) if taken_words[:1] == ["taken"] else taken.strip()[-400:]}


def tail(out: str) -> str:
    return "\n".join(out.splitlines()[-12:])


def split_runs(tmp: Path, flavor: str) -> LockRun:
    from opsctl.base.poll import wait_for
    from opsctl.cli.main import main
    from opsctl.state.specfile import read_spec
    from tests.support import cluster_check, make_spec, write_spec

    spec = make_spec("cluster", flavor, cluster={"node_timeout_ms": NODE_TIMEOUT_MS})
    spec["hosts"] = [{**h, "source_address": h["address"]} for h in spec["hosts"]]
    path = write_spec(tmp, spec)
    if main(["apply", "-f", str(path), "--auto-approve"]) != 0:  # a first deploy: no lock to ask a majority for
        raise RuntimeError("apply failed")
    try:
        loaded = read_spec(path)
        wait_for(lambda: cluster_check(loaded.layout.servers[0].endpoint).returncode == 0 or None, CONDITION_BOUND,
                 "the new cluster to settle")
        cut_host = loaded.layout.node(loaded.layout.shards[2].master).host
        minority = [n for n in loaded.layout.servers if n.host == cut_host]
        majority = [n for n in loaded.layout.servers if n.host != cut_host]
        masters = [loaded.layout.node(s.master) for s in loaded.layout.shards[:2]]
        assert not {m.name for m in masters} & {n.name for n in minority}, "a moved master on the cut host"
        source, target = masters
        before = _slots(loaded, target)
        reshard = ["cluster", "reshard", "-f", str(path), "--auto-approve", "--from", source.name, "--to",
                   target.name, "--slots", str(SLOTS)]
        partition = Partition()
        try:
            partition.cut(sorted({n.address for n in minority}), sorted({n.address for n in majority}))
            side_of(MAJORITY_GID, sorted({n.address for n in minority}))
            side_of(MINORITY_GID, sorted({n.address for n in majority}))
            started = time.monotonic()
            runs = [opsctl(MAJORITY_GID, *reshard, "--state-dir", str(tmp / "majority")),
                    opsctl(MINORITY_GID, *reshard, "--state-dir", str(tmp / "minority"))]
            minority_out, _ = runs[1].communicate(timeout=400)
            minority_seconds = time.monotonic() - started
            majority_out, _ = runs[0].communicate(timeout=600)
        finally:
            partition.close()
        again = opsctl(MINORITY_GID, *reshard, "--state-dir", str(tmp / "minority"))
        again_out, _ = again.communicate(timeout=600)
        moved = _slots(loaded, target) - before
        cut_off = holder_cut_off(path, sorted({n.address for n in minority}), sorted({n.address for n in majority}))
        return LockRun(flavor, runs[0].returncode, tail(majority_out), runs[1].returncode, tail(minority_out),
                       round(minority_seconds, 3), again.returncode, tail(again_out), moved,
                       [[n.name for n in minority], [n.name for n in majority]], **cut_off)
    finally:
        main(["destroy", "-f", str(path), "--auto-approve", "--purge"])


def _slots(loaded: Any, master: Any) -> int:
    """The slots master says it serves (its own CLUSTER NODES line)."""
    from opsctl.observe.replies import parse_cluster_nodes
    from tests.support import admin_for

    with admin_for(loaded, master) as admin:
        me = next(line for line in parse_cluster_nodes(str(admin.call("CLUSTER", "NODES"))) if line.is_myself)
    return sum(high - low + 1 for low, high in me.slots)


def main(argv: list[str]) -> int:
    from tests.support import PASSWORD, PASSWORD_ENV, server_tmpdir

    parser = argparse.ArgumentParser(prog="python -m tests.partition_lock")
    parser.add_argument("--flavor", default="valkey", choices=["valkey", "redis"])
    args = parser.parse_args(argv)
    os.environ.setdefault(PASSWORD_ENV, PASSWORD)
    with server_tmpdir("opsctl-partition-") as tmp:
        result = split_runs(Path(tmp), args.flavor)
    print(RESULT + json.dumps(asdict(result)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
