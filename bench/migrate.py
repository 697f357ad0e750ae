"""bench/migrate: a standalone under a steady write load moved into a 3-master cluster by `opsctl migrate` and
`opsctl migrate cutover`, against `redis-cli --cluster import --cluster-copy` (no live phase) and against the
physical reference of the same run: a bare replica's full sync of the same data (REPLICAOF on an empty server,
until master_link_status:up), as keys/s and ratios; then opsctl's stream lag, watched for --watch seconds of streaming
under the load, and the write pause of the cutover asked for after it.

    .venv/bin/python bench/migrate.py [valkey|redis] [--keys 1000000] [--peer-keys 200000] [--rate 10000]
        [--watch 5]

Goals (issue 26): initial copy >= 0.5x the bare full sync's keys/s; lag under 1 s and a cutover pause <= 1 s at
10k writes/s. The sides of any key-by-key copier are measured in the same run, with no Python in the timed path:
the read side, `redis-cli --pipe` of a DUMP per key into the source; the write side, the same keys' DUMP payloads
replayed as RESTOREs by `redis-cli --pipe` into a fresh cluster of the target's shape, one pipe per master at once.
Two ceilings are printed from them, for a copier that costs nothing: this design's (opsctl's pre-copy: attach and
the RDB's transfer; then the servers' work: the write side, which keeps both cores busy, or both sides' CPU over the
cores), and the scratch-server design's, which issue 36 judges the copy against (the same, plus this run's scratch
load of the same snapshot, timed on its own).

redis-cli moves one key per MIGRATE, so it copies --peer-keys keys from its own source: compared by
rate. The load average is printed before and after: compare runs only on a similar machine state.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis
from redis.crc import key_slot

from bench.restore import OPSCTL, cluster_keys, fill, load, master, timed, topology
from opsctl.backup.scratch import scratch_binaries, scratch_server
from opsctl.net.resp import encode
from opsctl.state.localdirs import state_dir_for
from opsctl.state.specfile import read_spec
from tests.support import PASSWORD, PASSWORD_ENV, bare_server, redis_cli, server_binary, server_tmpdir

CORES = os.cpu_count() or 1


class Load:
    """SETs of `load:<n>` at about rate per second, in pipelines of 10, until stopped; errors (the fence) counted."""

    def __init__(self, client: redis.Redis, rate: int) -> None:
        self.client, self.rate = client, rate
        self.written = self.errors = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.began = self.ended = 0.0

    def _run(self) -> None:
        started, n = time.monotonic(), 0
        while not self.stop.is_set():
            pipe = self.client.pipeline(transaction=False)
            for _ in range(10):
                pipe.set(f"load:{n}", n)
                n += 1
            try:
                pipe.execute()
                self.written += 10
            except redis.RedisError:
                self.errors += 1
                time.sleep(0.01)
            ahead = n / self.rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)

    def __enter__(self) -> Load:
        self.began = time.monotonic()
        self.thread.start()
        return self

    @property
    def achieved(self) -> float:
        """Writes per second while it ran."""
        return self.written / max(self.ended - self.began, 1e-6)

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)
        self.ended = time.monotonic()


def opsctl_migrate(source: Path, target: Path, env: dict[str, str], watch_s: float) \
        -> tuple[float, float, float, dict[str, object]]:
    """(seconds until every shard streams, seconds until the first key was copied, the worst lag seen while
    streaming for watch_s seconds, the cutover report); the cutover is asked for (`migrate cutover`) after
    watching: the lag is the steady state's under the load, not one sample at the copy's end. Prints when the
    first key was copied (before it: start, attach, the RDB's transfer, the scratch server's load)."""
    argv = [*OPSCTL, "migrate", "-f", str(target), "--from", str(source), "--auto-approve", "--output", "json"]
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    copied_at, worst, report, first, asked = 0.0, 0.0, {}, 0.0, False
    assert proc.stdout is not None
    for line in proc.stdout:
        event = json.loads(line)
        if event.get("event") == "migrate-lag":
            shards = event["shards"].values()
            if not first and any(int(s["copied"]) for s in shards):
                first = time.monotonic() - started
                print(f"opsctl migrate: first keys copied {first:.2f}s after the start (attach, RDB transfer, "
                      "scratch load, within the 0.5 s progress interval)")
            if all(s["phase"] == "stream" for s in shards):
                copied_at = copied_at or time.monotonic() - started
                worst = max([worst, *(float(s["lag_seconds"]) for s in shards)])
                if not asked and time.monotonic() - started > copied_at + watch_s:
                    timed([*OPSCTL, "migrate", "cutover", "-f", str(target)], env)
                    asked = True
        elif event.get("event") == "cutover-done":
            report = event
    if proc.wait() != 0:
        raise RuntimeError(f"opsctl migrate failed: {proc.stderr.read()[-800:] if proc.stderr else ''}")
    return copied_at, first, worst, report


def bare_full_sync(source: Path, keys: int) -> float:
    """Seconds for an empty server to become the source's replica with every key."""
    node = read_spec(source).layout.servers[0]
    with server_tmpdir("opsctl-bench-replica-") as folder, bare_server(read_spec(source).spec.server.flavor,
                                                                       Path(folder)) as client:
        client.config_set("masterauth", PASSWORD)
        started = time.monotonic()
        client.execute_command("REPLICAOF", node.address, node.port)
        while client.info("replication").get("master_link_status") != "up" or client.dbsize() < keys:
            time.sleep(0.005)
        seconds = time.monotonic() - started
        client.execute_command("REPLICAOF", "NO", "ONE")
    return seconds


def scratch_load(source: Path, keys: int, flavor: str) -> float:
    """Seconds for opsctl's scratch server to load the source's snapshot: the step of the scratch-server design that
    cutting payloads from the file removed, timed in this run so the issue's ceiling (that design's) is printed from
    this run's own figures."""
    node = read_spec(source).layout.servers[0]
    redis.Redis(host=node.address, port=node.port, password=PASSWORD).save()
    rdb = next(p for p in state_dir_for(read_spec(source), None).rglob("*.rdb") if p.stat().st_size > keys)
    binary = next(b for (f, _), b in scratch_binaries().items() if f == flavor)
    started = time.monotonic()
    with scratch_server(binary, rdb, "the bench snapshot"):
        return time.monotonic() - started


def server_cpu(spec: Path) -> float:
    """CPU seconds (user + system) the topology's servers have used, from INFO cpu."""
    total = 0.0
    for node in read_spec(spec).layout.servers:
        cpu = redis.Redis(host=node.address, port=node.port, password=PASSWORD).info("cpu")
        total += float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])
    return total


def dump_side(source: Path, folder: Path, env: dict[str, str]) -> tuple[float, float]:
    """(seconds, server CPU seconds) for the source to answer a DUMP of each of its keys, sent by
    `redis-cli --pipe`."""
    client, keys = master(source), folder / "dump.resp"
    with keys.open("wb") as file:
        for key in client.scan_iter(count=10_000):
            file.write(encode((b"DUMP", key if isinstance(key, bytes) else key.encode())))
    node = read_spec(source).layout.servers[0]
    cpu, started = server_cpu(source), time.monotonic()
    with keys.open("rb") as commands:
        subprocess.run([redis_cli(), "-h", node.address, "-p", str(node.port), "--pipe"], stdin=commands, env=env,
                       stdout=subprocess.DEVNULL, check=True)
    return time.monotonic() - started, server_cpu(source) - cpu


def restore_bound(source: Path, target: Path, folder: Path, env: dict[str, str]) -> tuple[float, float]:
    """(seconds, server CPU seconds) for the target's masters to absorb every source key as a RESTORE from
    precomputed payloads: what the target's write path allows a copier that writes key by key (the bare full sync
    loads an RDB instead)."""
    client, owners = master(source), _slot_owners(target)
    files = {endpoint: (folder / f"restore-{endpoint.replace(':', '-')}.resp").open("wb")
             for endpoint in owners.values()}
    cursor = 0
    while True:
        cursor, keys = client.scan(cursor, count=10_000)
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.dump(key)
        for name, payload in zip(keys, pipe.execute(), strict=True):
            key = name if isinstance(name, bytes) else name.encode()
            files[owners[key_slot(key)]].write(encode((b"RESTORE", key, b"0", payload)))
        if cursor == 0:
            break
    for file in files.values():
        file.close()
    cpu, started = server_cpu(target), time.monotonic()
    pipes = [subprocess.Popen([redis_cli(), "-h", endpoint.rsplit(":", 1)[0], "-p", endpoint.rsplit(":", 1)[1],
                               "--pipe"], stdin=file.open("rb"), env=env, stdout=subprocess.DEVNULL)
             for endpoint, file in ((e, Path(f.name)) for e, f in files.items())]
    if any(p.wait() != 0 for p in pipes):
        raise RuntimeError("redis-cli --pipe of the RESTOREs failed")
    return time.monotonic() - started, server_cpu(target) - cpu


def _slot_owners(spec: Path) -> dict[int, str]:
    """slot -> the endpoint of the master that owns it."""
    node = read_spec(spec).layout.servers[0]
    owners: dict[int, str] = {}
    for first, last, owner, *_ in redis.Redis(host=node.address, port=node.port, password=PASSWORD).execute_command(
            "CLUSTER", "SLOTS"):
        owners |= dict.fromkeys(range(first, last + 1), f"{owner[0].decode()}:{owner[1]}")
    return owners


def run(flavor: str, keys: int, peer_keys: int, rate: int, watch: float) -> None:
    server_binary(flavor)
    os.environ.setdefault(PASSWORD_ENV, PASSWORD)
    compileall.compile_dir(str(Path(__file__).resolve().parent.parent / "opsctl"), quiet=1)
    env = {**os.environ, "REDISCLI_AUTH": PASSWORD}
    print(f"load before: {load()}")
    with ExitStack() as stack:
        root = stack.enter_context(server_tmpdir("opsctl-bench-"))
        source = stack.enter_context(topology(root, "source", flavor, "standalone"))
        peer_source = stack.enter_context(topology(root, "peer-source", flavor, "standalone",
                                                   hardening={"rename_takeover_commands": False}))
        target = stack.enter_context(topology(root, "target", flavor, "cluster"))
        bound_target = stack.enter_context(topology(root, "bound", flavor, "cluster"))
        peer_target = stack.enter_context(topology(root, "peer", flavor, "cluster"))
        fill(source, keys)
        fill(peer_source, peer_keys)
        bare = bare_full_sync(source, keys)
        print(f"bare replica full sync: {keys} keys in {bare:.2f}s = {keys / bare:.0f} keys/s")
        dumps, dump_cpu = dump_side(source, Path(root), env)
        print(f"read side: {keys} DUMPs answered by the source in {dumps:.2f}s = {keys / dumps:.0f} keys/s "
              f"({dump_cpu:.2f} CPU-s in the server)")
        scratch = scratch_load(source, keys, flavor)
        print(f"scratch load (the scratch design's step after the transfer): {keys} keys in {scratch:.2f}s")
        bound, restore_cpu = restore_bound(source, bound_target, Path(root), env)
        print(f"write side (key-by-key bound): {keys} precomputed RESTOREs absorbed by the target's masters in "
              f"{bound:.2f}s = {keys / bound:.0f} keys/s = {bare / bound:.2f}x the bare full sync "
              f"({restore_cpu:.2f} CPU-s in the servers)")

        with Load(master(source), rate) as writes:
            copied, first, lag, report = opsctl_migrate(source, target, env, watch)
        ours = keys / copied
        # the servers' own work of both sides on this machine's cores, or the write side's time if longer;
        # any copier's own CPU and the write load come on top
        servers = max(bound, (dump_cpu + restore_cpu) / CORES)
        ceiling = keys / (first + servers)
        print(f"ceiling of this design (payloads cut from the file): pre-copy {first:.2f}s + the servers' DUMP and "
              f"RESTORE work {servers:.2f}s (max of the write side's time and ({dump_cpu:.2f} + {restore_cpu:.2f}) "
              f"CPU-s / {CORES} cores) = {keys / ceiling:.2f}s = {ceiling:.0f} keys/s = "
              f"{ceiling / (keys / bare):.2f}x the bare full sync, with a copier that costs nothing")
        # the ceiling: the scratch design's pre-copy (this run's transfer, then its scratch load) + the same
        # servers' work; opsctl's copy is judged against it (issue 36: 0.8 of it)
        scratch_ceiling = keys / (first + scratch + servers)
        print(f"ceiling of the scratch design (issue 36's): pre-copy {first:.2f}s + scratch load {scratch:.2f}s + "
              f"the servers' work {servers:.2f}s = {keys / scratch_ceiling:.2f}s = {scratch_ceiling:.0f} keys/s; "
              f"opsctl's copy at {ours / scratch_ceiling:.2f} of it (goal >= 0.8)")
        print(f"opsctl migrate: initial copy {keys} keys in {copied:.2f}s = {ours:.0f} keys/s; from the first key "
              f"copied {keys / max(copied - first, 1e-6):.0f} keys/s = {bound / max(copied - first, 1e-6):.2f}x the "
              f"write side's time; {writes.achieved:.0f} writes/s under the load")
        print(f"opsctl migrate: worst lag while streaming {watch:g}s under the load {lag:.3f}s; "
              f"cutover write pause {report['pause_s']}s "
              f"(caught up after {report['caught_up_s']}s), {report['target_keys']} keys, "
              f"{writes.errors} write batches refused by the fence")
        assert report["ok"] and cluster_keys(target) == report["target_keys"]

        src = read_spec(peer_source).layout.servers[0]
        dst = read_spec(peer_target).layout.servers[0]
        seconds, _ = timed([redis_cli(), "--cluster", "import", dst.endpoint, "--cluster-from", src.endpoint,
                            "--cluster-from-pass", PASSWORD, "--cluster-copy"], env)
        peer = peer_keys / seconds
        print(f"redis-cli --cluster import --cluster-copy: {peer_keys} keys in {seconds:.1f}s = {peer:.0f} "
              "keys/s (no live phase)")
        print(f"ratios: opsctl copy {ours / (keys / bare):.2f}x the bare full sync (goal >= 0.5; the design's "
              f"ceiling here {ceiling / (keys / bare):.2f}x; opsctl at {ours / ceiling:.2f} of it), "
              f"{ours / peer:.1f}x redis-cli")
    print(f"load after: {load()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("flavor", nargs="?", choices=("valkey", "redis"), default="valkey")
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--peer-keys", type=int, default=200_000)
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--watch", type=float, default=5.0, help="seconds of streaming watched before the cutover")
    args = parser.parse_args()
    run(args.flavor, args.keys, args.peer_keys, args.rate, args.watch)
