"""Restores under a split (issue 23, classes 3 and 4), run inside a fresh network namespace like tests/partition.py:

    python -m tests.partition_restore stale-replica   # the source's replica cut off while its master takes writes
    python -m tests.partition_restore target-cut      # a target master cut off 1 s into `restore --from DIR`

Each prints one JSON line (RESULT + RestoreRun) and stops every server it started.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tests.partition import RESULT, ROOT, Partition, run_module_in_namespace
from tests.support import CONDITION_BOUND

LATE = 1000
TARGET_KEYS = 150_000


@dataclass(frozen=True)
class RestoreRun:
    """rc, out: the restore under the cut (its last output lines); expected: keys it must have copied; after_cut:
    of those, on the target after the heal; rerun_rc, after_rerun: the same command run again after the heal."""

    scenario: str
    rc: int
    out: str
    expected: int
    after_cut: int
    rerun_rc: int | None = None
    after_rerun: int | None = None


def run_in_namespace(scenario: str) -> dict[str, Any]:
    return run_module_in_namespace("tests.partition_restore", [scenario])


# --- inside the namespace ---

@contextmanager
def topology(tmp: Path, name: str, topology_: str, **sections: Any) -> Iterator[tuple[Path, Any]]:
    from tests.support import make_spec

    with applied(tmp, name, make_spec(topology_, "valkey", **sections)) as made:
        yield made


@contextmanager
def applied(tmp: Path, name: str, spec: dict[str, Any]) -> Iterator[tuple[Path, Any]]:
    """spec applied in tmp/name, each host's connections leaving from its own address (on its side of any cut);
    destroyed after."""
    from opsctl.cli.main import main
    from opsctl.state.specfile import read_spec
    from tests.support import write_spec

    spec["hosts"] = [{**h, "source_address": h["address"]} for h in spec["hosts"]]
    (tmp / name).mkdir()
    path = write_spec(tmp / name, spec)
    if main(["apply", "-f", str(path), "--auto-approve"]) != 0:
        raise RuntimeError(f"apply of {name} failed")
    try:
        yield path, read_spec(path)
    finally:
        main(["destroy", "-f", str(path), "--auto-approve", "--purge"])


def client(node: Any) -> Any:
    import redis

    from tests.support import PASSWORD
    return redis.Redis(host=node.address, port=node.port, password=PASSWORD, socket_timeout=5)


def masters_keys(loaded: Any, prefix: str) -> int:
    """Keys named prefix* on the nodes that are masters now (ROLE), db 0."""
    total = 0
    for node in loaded.layout.servers:
        c = client(node)
        if c.execute_command("ROLE")[0] in (b"master", "master"):
            total += sum(1 for _ in c.scan_iter(match=f"{prefix}*", count=5000))
    return total


def opsctl(*argv: str) -> int:
    return subprocess.run([sys.executable, "-m", "opsctl.cli.main", *argv], capture_output=True, timeout=600,
                          cwd=ROOT, check=False).returncode


def restore(spec: Path, *args: str) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "opsctl.cli.main", "restore", "-f", str(spec), *args],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, check=False)
    return done.returncode, "\n".join((done.stdout + done.stderr).splitlines()[-12:])


def stale_replica(tmp: Path) -> RestoreRun:
    """Class 3: the source's replica is cut off from its master (its link says connected until repl-timeout);
    the master acknowledges LATE writes; then `restore --from-live` runs with the cut still in place."""
    with ExitStack() as stack:
        source, s_loaded = stack.enter_context(topology(tmp, "source", "replication", hosts=2,
                                                        persistence={"min_replicas_to_write": 0}))
        target, t_loaded = stack.enter_context(topology(tmp, "target", "standalone", hosts=1))
        master, replica = (s_loaded.layout.node(n) for n in s_loaded.layout.shards[0].members)
        pipe = client(master).pipeline(transaction=False)
        for i in range(2000):
            pipe.set(f"early:{i}", i)
        pipe.execute()
        client(master).execute_command("WAIT", 1, 5000)
        partition = Partition()
        try:
            partition.cut([master.address], [replica.address])
            pipe = client(master).pipeline(transaction=False)
            for i in range(LATE):
                pipe.set(f"late:{i}", i)
            assert all(pipe.execute())
            rc, out = restore(target, "--from-live", str(source), "--verify", "full")
        finally:
            partition.close()
        return RestoreRun("stale-replica", rc, out, LATE, masters_keys(t_loaded, "late:"))


def target_cut(tmp: Path) -> RestoreRun:
    """Class 4: a target cluster master's host is cut off from the other hosts 1 s into `restore --from DIR`, long
    enough for its replica to be promoted; healed; the keys left are counted; the same command runs again."""
    from opsctl.base.poll import wait_for
    from tests.support import cluster_check

    with ExitStack() as stack:
        source, s_loaded = stack.enter_context(topology(tmp, "source", "standalone", hosts=1))
        target, t_loaded = stack.enter_context(topology(
            tmp, "target", "cluster", cluster={"masters": 3, "replicas_per_master": 1, "node_timeout_ms": 8000}))
        pipe = client(s_loaded.layout.servers[0]).pipeline(transaction=False)
        for i in range(TARGET_KEYS):
            pipe.set(f"k:{i}", i)
            if i % 10_000 == 0:
                pipe.execute()
        pipe.execute()
        from opsctl.cli.main import main
        if main(["backup", "-f", str(source), "--to", str(tmp / "backups")]) != 0:
            raise RuntimeError("backup failed")
        folder = next((tmp / "backups").iterdir())
        shard = t_loaded.layout.shards[0]
        cut_master = t_loaded.layout.node(shard.master)
        others = sorted({n.address for n in t_loaded.layout.servers} - {cut_master.address})
        partition = Partition()
        try:
            proc = subprocess.Popen([sys.executable, "-m", "opsctl.cli.main", "restore", "-f", str(target),
                                     "--from", str(folder)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, cwd=ROOT)
            wait_for(lambda: client(cut_master).dbsize() > 1000 or proc.poll() is not None or None, CONDITION_BOUND,
                     "first keys")
            partition.cut([cut_master.address], others)
            out, _ = proc.communicate(timeout=600)
            promoted = [t_loaded.layout.node(n) for n in shard.replicas]
            wait_for(lambda: any(client(n).execute_command("ROLE")[0] in (b"master", "master") for n in promoted)
                     or None, CONDITION_BOUND, "a replica of the cut master to be promoted")
        finally:
            partition.close()
        wait_for(lambda: client(cut_master).execute_command("ROLE")[0] in (b"slave", "slave") or None, CONDITION_BOUND,
                 "the old master to rejoin as a replica")
        wait_for(lambda: cluster_check(f"{cut_master.address}:{cut_master.port}").returncode == 0 or None,
                 CONDITION_BOUND, "cluster check")
        wait_for(lambda: opsctl("cluster", "check", "-f", str(target)) == 0 or None, CONDITION_BOUND,
                 "opsctl cluster check")
        after_cut = masters_keys(t_loaded, "k:")
        rerun_rc, rerun_out = restore(target, "--from", str(folder))
        kept = [line for line in out.splitlines() if "differs" not in line][-12:]
        tail = "\n".join(kept) + "\n--- re-run:\n" + rerun_out
        return RestoreRun("target-cut", proc.returncode, tail, TARGET_KEYS, after_cut, rerun_rc,
                          masters_keys(t_loaded, "k:"))


def main(argv: list[str]) -> int:
    from tests.support import PASSWORD, PASSWORD_ENV, server_tmpdir

    parser = argparse.ArgumentParser(prog="python -m tests.partition_restore")
    parser.add_argument("scenario", choices=["stale-replica", "target-cut"])
    args = parser.parse_args(argv)
    os.environ.setdefault(PASSWORD_ENV, PASSWORD)
    with server_tmpdir("opsctl-partition-") as tmp:
        run = (stale_replica if args.scenario == "stale-replica" else target_cut)(Path(tmp))
    print(RESULT + json.dumps(asdict(run)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
