"""bench/audit: keys scanned per second by `opsctl audit bigkeys` vs `redis-cli --bigkeys` and `--memkeys`
on the same 1M-key node in the same run, with the p99 latency of a concurrent client during each.

    .venv/bin/python bench/audit.py [valkey|redis] [--keys N] [--on replica|master]

--on replica (the default): a master with one replica, deployed by `opsctl apply`; every tool scans the replica,
as `opsctl audit` does in any topology with replicas, and the concurrent client reads from that replica.
--on master: a standalone node, the audit run with --allow-masters (a topology without replicas).
    .venv/bin/python bench/audit.py --tls [--keys N]

--tls: `opsctl audit bigkeys` on a plaintext and a TLS Redis 7.0 node holding the same keys, interleaved rounds
in one run (goal: TLS within 25% of plaintext).

Goal: opsctl >= 5x --memkeys, wall clock per process (interpreter start and discovery included), with the
concurrent client's p99 on the scanned node printed beside each tool, and each tool's CPU and the scanned server's
CPU per 1M keys (user + sys; the work itself, which the machine's load does not change much).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opsctl.observe.replies import parse_info
from opsctl.state.specfile import read_spec
from tests.support import PASSWORD, PASSWORD_ENV, admin_for, make_spec, redis_cli, server_tmpdir, write_spec
from tests.test_audit_fixtures import (
    Fleet,
    LatencyProbe,
    fill_strings,
    planted_commands,
    run_commands,
    standalone,
    wait_for,
)

OPSCTL = str(Path(sys.executable).parent / "opsctl")


@dataclass
class Run:
    """One tool's run: wall clock, its own CPU (user + sys), the scanned server's CPU, the client's latency."""

    wall: float
    cpu: float
    server_cpu: float
    latency: dict[str, float]


def server_cpu(fleet: Fleet, index: int) -> float:
    """The server's used_cpu_user + used_cpu_sys (INFO cpu), seconds: its share of the work, whatever the load."""
    with fleet.admin(index) as admin:
        info = parse_info(admin.info("cpu"))
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(argv: list[str], env: dict[str, str], probe_at: tuple[str, int], work: Path, fleet: Fleet,
          index: int) -> Run:
    probe = LatencyProbe(probe_at[0], probe_at[1], work)
    cpu, served, started = children_cpu(), server_cpu(fleet, index), time.monotonic()
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, check=False)
    finally:
        elapsed = time.monotonic() - started
        cpu, served = children_cpu() - cpu, server_cpu(fleet, index) - served
        latency = probe.stop()
    if done.returncode not in (0, 4):
        raise RuntimeError(f"{argv[0]} failed ({done.returncode}): {done.stderr[-500:]}")
    return Run(elapsed, cpu, served, latency)


def idle_latency(address: str, port: int, work: Path, seconds: float = 3.0) -> dict[str, float]:
    probe = LatencyProbe(address, port, work)
    time.sleep(seconds)  # measuring an idle period, not synchronising
    return probe.stop()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("flavor", nargs="?", default="valkey", choices=("valkey", "redis"))
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--opsctl-args", default="", help="extra audit options, e.g. '--batch 100 --window 1'")
    parser.add_argument("--tls", action="store_true", help="plaintext against TLS on Redis 7.0")
    parser.add_argument("--on", choices=("replica", "master"), default="replica",
                        help="scan a replica (master + 1 replica) or a standalone master")
    args = parser.parse_args()
    os.environ.setdefault(PASSWORD_ENV, PASSWORD)
    if args.tls:
        return tls_compare(args.keys, args.rounds)
    with server_tmpdir() as tmp:
        work = Path(tmp)
        if args.on == "replica":
            with replicated(work, args.flavor) as fleet:
                return run(fleet, args.keys, work, args.rounds, args.opsctl_args.split(), scanned_index=1)
        with standalone(work, args.flavor, memory=MEMORY) as fleet:
            return run(fleet, args.keys, work, args.rounds, ["--allow-masters", *args.opsctl_args.split()])


MEMORY = {"maxmemory": "2gb", "policy": "allkeys-lru"}


@contextlib.contextmanager
def replicated(work: Path, flavor: str) -> Iterator[Fleet]:
    """A master (servers[0]) and its replica (servers[1]) on two loopback hosts, deployed by opsctl itself."""
    spec_file = write_spec(work, make_spec("replication", flavor, hosts=2, memory=MEMORY))
    try:
        applied = subprocess.run([OPSCTL, "apply", "-f", str(spec_file), "--auto-approve"], capture_output=True,
                                 text=True, timeout=120, check=False)
        if applied.returncode != 0:
            raise RuntimeError(f"opsctl apply of the master + replica failed: {applied.stderr[-500:]}")
        loaded = read_spec(spec_file)
        roles = []
        for node in loaded.layout.servers:
            with admin_for(loaded, node) as admin:
                roles.append(admin.call("ROLE")[0])
        if roles[:2] != ["master", "slave"]:
            raise RuntimeError(f"expected servers[0] master and servers[1] replica, found {roles}")
        yield Fleet(spec_file, loaded, [])
    finally:
        subprocess.run([OPSCTL, "destroy", "-f", str(spec_file), "--auto-approve", "--purge"], capture_output=True,
                       timeout=120, check=False)


def wait_replica_holds(fleet: Fleet, keys: int) -> None:
    with fleet.admin(1) as replica:
        wait_for(lambda: int(replica.client.dbsize()) >= keys, 300, f"the replica to hold {keys} keys")


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def run(fleet: Fleet, keys: int, work: Path, rounds: int, extra: list[str], scanned_index: int = 0) -> int:
    admin = fleet.admin()
    node = fleet.loaded.layout.servers[scanned_index]
    t = time.monotonic()
    fill_strings(admin, keys - 15_000)
    run_commands(admin.client.pipeline(transaction=False), planted_commands(int(time.time())))
    dbsize = admin.client.dbsize()
    if scanned_index:
        wait_replica_holds(fleet, dbsize)
    flavor = fleet.loaded.spec.server.flavor
    scanned = "the replica" if scanned_index else "the master (standalone, --allow-masters)"
    print(f"{flavor}: {dbsize} keys loaded in {time.monotonic() - t:.1f} s; every tool and the client on {scanned}"
          f" {node.endpoint}; {rounds} interleaved rounds, medians")
    env = {**os.environ, "REDISCLI_AUTH": PASSWORD}
    at = (node.address, node.port)
    load_before = os.getloadavg()[0]
    cli = [redis_cli(), "-h", node.address, "-p", str(node.port)]
    tools = {"redis-cli --bigkeys": [*cli, "--bigkeys"], "redis-cli --memkeys": [*cli, "--memkeys"],
             "opsctl audit bigkeys": [OPSCTL, "audit", "-f", str(fleet.spec_file), "bigkeys",
                                      "--output", "json", *extra]}
    runs: dict[str, list[Run]] = {name: [] for name in tools}
    idle_p99s: list[float] = []
    for _ in range(rounds):
        idle_p99s.append(idle_latency(node.address, node.port, work)["p99_ms"])
        for name, argv in tools.items():
            runs[name].append(timed(argv, env, at, work, fleet, scanned_index))
    rates = {name: [dbsize / r.wall for r in done] for name, done in runs.items()}
    idle = _median(idle_p99s)
    print(f"idle client p99 {idle:.3f} ms (per round: {', '.join(f'{v:.3f}' for v in idle_p99s)})")
    for name, done in runs.items():
        p99 = _median([r.latency["p99_ms"] for r in done])
        print(f"{name:22} {_median(rates[name]):9.0f} keys/s; client p99 {p99:.3f} ms ({p99 / idle:.2f}x idle); "
              f"CPU per 1M keys: tool {_median([r.cpu for r in done]) * 1e6 / dbsize:.2f} s, server "
              f"{_median([r.server_cpu for r in done]) * 1e6 / dbsize:.2f} s (the client's GETs included)"
              f"  [rounds: {', '.join(f'{r:.0f}' for r in rates[name])} keys/s]")
    ours = _median(rates["opsctl audit bigkeys"])
    print(f"ratio opsctl/--memkeys {ours / _median(rates['redis-cli --memkeys']):.2f}x, "
          f"opsctl/--bigkeys {ours / _median(rates['redis-cli --bigkeys']):.2f}x "
          f"(wall clock per process, opsctl's interpreter start and node discovery included; goal >= 5x: "
          f"{'met' if ours >= 5 * _median(rates['redis-cli --memkeys']) else 'NOT met'}); "
          f"load {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
    return 0


def tls_compare(keys: int, rounds: int) -> int:
    from opsctl.cli.main import main as opsctl
    from opsctl.runtime.opening import make_connector
    from opsctl.state.specfile import read_spec
    from tests.support import make_spec, write_spec

    with server_tmpdir() as tmp:
        specs: dict[str, Path] = {}
        try:
            for label, tls in (("plaintext", None), ("tls", {"enabled": True, "generate": True})):
                folder = Path(tmp) / label
                folder.mkdir()
                extra = {"tls": tls} if tls else {}
                specs[label] = write_spec(folder, make_spec("standalone", "redis", hosts=1, memory={
                    "maxmemory": "2gb", "policy": "allkeys-lru"}, **extra))
                if opsctl(["apply", "-f", str(specs[label]), "--auto-approve"]) != 0:
                    return 1
                loaded = read_spec(specs[label])
                connector = make_connector(loaded, folder / ".opsctl" / loaded.spec.name)
                with admin_for(connector, loaded.layout.servers[0]) as admin:
                    fill_strings(admin, keys, connector=connector)
            rates: dict[str, list[float]] = {label: [] for label in specs}
            print(f"{keys} keys on each node; load average before: {os.getloadavg()[0]:.1f}", flush=True)
            for _ in range(rounds):
                for label, spec in specs.items():
                    started = time.monotonic()
                    done = subprocess.run([OPSCTL, "audit", "-f", str(spec), "bigkeys", "--allow-masters",
                                           "--output", "json"], capture_output=True, text=True, timeout=900,
                                          check=False)
                    if done.returncode not in (0, 4):
                        raise RuntimeError(f"opsctl audit failed: {done.stderr[-500:]}")
                    rates[label].append(keys / (time.monotonic() - started))
            for label, values in rates.items():
                print(f"{label:>9}: opsctl audit bigkeys {_median(values):9.0f} keys/s "
                      f"[rounds: {', '.join(f'{r:.0f}' for r in values)}]")
            ratio = _median(rates["tls"]) / _median(rates["plaintext"])
            print(f"tls / plaintext scan rate: {ratio:.2f} (goal >= 0.75: {'met' if ratio >= 0.75 else 'NOT met'}); "
                  f"load {os.getloadavg()[0]:.1f}")
        finally:
            for spec in specs.values():
                opsctl(["destroy", "-f", str(spec), "--auto-approve", "--purge"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
