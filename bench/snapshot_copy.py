"""bench/snapshot_copy: one source shard's snapshot copied into a 3-master cluster by migrate's snapshot phase
(a scratch server loaded with the RDB, then the restore engine), against the physical reference of the same run:
a bare replica's full sync of the same data (REPLICAOF on an empty server, until master_link_status:up).

    .venv/bin/python bench/snapshot_copy.py [valkey|redis] [--keys 1000000] [--profile FILE]

Prints keys/s of both, their ratio (goal, issue 26: >= 0.5) and opsctl's own CPU seconds during the copy (the
rest of the wall time it waits for the servers), with the load average before and after: compare runs only on a
similar machine state. To compare with an older engine, run this file from an export of that commit
(`git archive COMMIT | tar -x -C DIR`) right before or after.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import sys
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.restore import fill, load, topology
from opsctl.backup.manifest import rdb_header
from opsctl.backup.scratch import scratch_binaries, scratch_server
from opsctl.net.connection import Connection
from opsctl.restore.engine import Side, Source, copy_snapshot_file, copy_source
from opsctl.restore.target import inspect_target
from opsctl.runtime.opening import open_connector
from opsctl.state.localdirs import state_dir_for
from opsctl.state.specfile import read_spec
from tests.support import PASSWORD, PASSWORD_ENV, bare_server, server_binary, server_tmpdir


def bare_sync(address: str, port: int, flavor: str, keys: int) -> float:
    """Seconds for an empty server to become the source's replica with every key."""
    with server_tmpdir("opsctl-bench-replica-") as folder, bare_server(flavor, Path(folder)) as client:
        client.config_set("masterauth", PASSWORD)
        started = time.monotonic()
        client.execute_command("REPLICAOF", address, port)
        while client.info("replication").get("master_link_status") != "up" or client.dbsize() < keys:
            time.sleep(0.002)
        seconds = time.monotonic() - started
        client.execute_command("REPLICAOF", "NO", "ONE")
    return seconds


def copy_split(rdb: Path, target_spec: Path, profile: str | None) -> tuple[int, float]:
    """The same copy with each key's payload cut from the file (opsctl.backup.rdb): no scratch server."""
    loaded = read_spec(target_spec)
    with open_connector(loaded, state_dir_for(loaded, None)) as connector, open(rdb, "rb") as handle:
        targets = inspect_target(connector).targets()
        header = rdb_header(handle.read(9))
        assert header is not None
        source = Source("shard-1", "snapshot", None, [], 1 << 62)
        side = Side(source.open, targets.open)
        profiler = cProfile.Profile() if profile else None
        started, cpu = time.monotonic(), time.process_time()
        if profiler:
            profiler.enable()
        counts = copy_snapshot_file(rdb, header[1], 0.0, source, targets, "replace", lambda _: None, side)
        if profiler:
            profiler.disable()
            profiler.dump_stats(profile)
        seconds = time.monotonic() - started
        print(f"opsctl's own CPU during the copy (cut from the file): {time.process_time() - cpu:.2f}s of "
              f"{seconds:.2f}s")
        side.close()
    return counts.restored, seconds


def copy(rdb: Path, target_spec: Path, flavor: str, profile: str | None) -> tuple[int, float]:
    loaded = read_spec(target_spec)
    with open_connector(loaded, state_dir_for(loaded, None)) as connector:
        targets = inspect_target(connector).targets()
        binaries = scratch_binaries()
        binary = next(b for (f, _), b in binaries.items() if f == flavor)
        with scratch_server(binary, rdb, "the bench snapshot") as scratch:
            snapshot = Connection.on_unix(scratch.socket, "snapshot", 120.0)
            unexpiring = frozenset(db for db, (_, expires) in scratch.keyspace().items() if not expires)
            source = Source("shard-1", "snapshot", snapshot, [0], 1 << 62, unexpiring=unexpiring)
            side = Side(source.open, targets.open)
            profiler = cProfile.Profile() if profile else None
            started, cpu = time.monotonic(), time.process_time()
            if profiler:
                profiler.enable()
            counts = copy_source(source, targets, "replace", lambda _: None, side)
            if profiler:
                profiler.disable()
                profiler.dump_stats(profile)
            seconds = time.monotonic() - started
            print(f"opsctl's own CPU during the copy: {time.process_time() - cpu:.2f}s of {seconds:.2f}s")
            side.close()
    return counts.restored, seconds


def run(flavor: str, keys: int, profile: str | None, split: bool) -> None:
    server_binary(flavor)
    os.environ.setdefault(PASSWORD_ENV, PASSWORD)
    print(f"load before: {load()}")
    with ExitStack() as stack:
        root = stack.enter_context(server_tmpdir("opsctl-bench-"))
        source = stack.enter_context(topology(root, "source", flavor, "standalone"))
        target = stack.enter_context(topology(root, "target", flavor, "cluster"))
        fill(source, keys)
        node = read_spec(source).layout.servers[0]
        bare = bare_sync(node.address, node.port, flavor, keys)
        print(f"bare replica full sync: {keys} keys in {bare:.2f}s = {keys / bare:.0f} keys/s")
        import redis

        client = redis.Redis(host=node.address, port=node.port, password=PASSWORD)
        client.save()
        loaded = read_spec(source)
        rdb = next(p for p in state_dir_for(loaded, None).rglob("*.rdb") if p.stat().st_size > keys)
        restored, seconds = copy_split(rdb, target, profile) if split else copy(rdb, target, flavor, profile)
        ours = restored / seconds
        print(f"snapshot copy : {restored} keys in {seconds:.2f}s = {ours:.0f} keys/s")
        print(f"ratio: {ours / (keys / bare):.2f}x the bare full sync (goal >= 0.5)")
    print(f"load after: {load()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("flavor", nargs="?", choices=("valkey", "redis"), default="valkey")
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--profile", default=None)
    parser.add_argument("--split", action="store_true", help="cut the payloads from the file, no scratch server")
    args = parser.parse_args()
    run(args.flavor, args.keys, args.profile, args.split)
