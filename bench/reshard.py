"""bench/reshard: the same keys moved between the same two masters by opsctl and by `redis-cli --cluster reshard`
(default pipeline and --cluster-pipeline 1000), in one run, as keys/s and ratios.

    .venv/bin/python bench/reshard.py [valkey|redis] [--keys 500000]

All of master A's slots (5462) move A -> B, then back B -> A, alternating tools, so every tool moves the same
keys between the same nodes. Goals: Redis 7.0 opsctl >= 2x redis-cli pipeline 1000; Valkey 9.1 >= 10x.

Last, the ceiling of any key-by-key mover on this pair: MIGRATE alone. The keys are listed and sized and the
slots opened beforehand (untimed); only opsctl's MIGRATE batches are timed, the client doing nothing else.
On Redis, twice, each after one more opsctl run (the best of each counts: the load moves during a run).
On Valkey also the ceiling of the atomic path: CLUSTER MIGRATESLOTS started bare and polled every ms, each
moving back what an opsctl run just before moved, twice (the best of each side counts). Goals (issue 15): opsctl
>= 0.8x its ceiling. Then where the time goes, per opsctl run: its own move against the rest (process start,
lock, setup), its CPU, and the source's time per command (INFO commandstats) and in no command.
The load average is printed before and after: compare runs only on a similar machine state.

    .venv/bin/python bench/reshard.py --tls [--keys 200000]

--tls: opsctl's key-by-key reshard on a plaintext and a TLS Redis 7.0 cluster (generated certificates; MIGRATE
between the servers then runs over TLS too, tls-cluster yes), the same keys moved A -> B -> A on each,
interleaved, in one run. Goal: TLS within 25% of plaintext.
"""

from __future__ import annotations

import argparse
import compileall
import os
import re
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml
from redis.crc import key_slot

from opsctl.cli.main import main as opsctl_main
from opsctl.net.connector import Connector
from opsctl.net.observer import wait_cluster_converged
from opsctl.observe.replies import parse_info
from opsctl.slots.atomic import job_id, job_state, parse_migrations, start_commands, status_command
from opsctl.slots.journal import Journal
from opsctl.slots.keys import KeyMover, Options
from opsctl.slots.progress import Progress
from opsctl.slots.session import checked, open_session
from opsctl.spec.load import LoadedSpec
from opsctl.state.specfile import read_spec
from tests.support import (
    PASSWORD,
    PASSWORD_ENV,
    NodeClient,
    admin_for,
    make_spec,
    redis_cli,
    server_binary,
    server_tmpdir,
)

OPSCTL = [sys.executable, "-m", "opsctl.cli.main"]
NESTED = ("memory|usage", "cluster|getkeysinslot")  # what the survey script calls


def load(admin: NodeClient, keys: int, slots: range) -> int:
    """Write `keys` 100-byte strings whose slots fall in `slots`, straight to the owning master."""
    written, i = 0, 0
    pipe = admin.client.pipeline(transaction=False)
    while written < keys:
        key = f"bench:{i}"
        i += 1
        if key_slot(key.encode()) in slots:
            pipe.set(key, "x" * 100)
            written += 1
            if written % 10000 == 0:
                pipe.execute()
    pipe.execute()
    return written


def timed(argv: list[str], env: dict[str, str]) -> float:
    return timed_run(argv, env).seconds


@dataclass
class Timed:
    seconds: float
    cpu: float  # the child's user + system CPU seconds
    stdout: str

    def moved_in(self) -> float | None:
        """opsctl's own time for the move ("moved ... in 3.21s"), from its result line."""
        found = re.search(r"keys in ([0-9.]+)s", self.stdout)
        return float(found.group(1)) if found else None


def timed_run(argv: list[str], env: dict[str, str]) -> Timed:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800, check=False)
    elapsed = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[:5]} failed ({done.returncode}): {done.stderr[-800:]}{done.stdout[-400:]}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return Timed(elapsed, cpu, done.stdout)


def server_time(admin: NodeClient) -> dict[str, float]:
    """Seconds the server spent per command (INFO commandstats usec) and on its main thread's CPU; with the
    server on this machine, also its main thread's time on a CPU and waiting for one (/proc schedstat, in ns:
    what the scheduler saw, whatever the load)."""
    stats = {key.removeprefix("cmdstat_"): float(dict(p.split("=", 1) for p in value.split(","))["usec"]) / 1e6
             for key, value in parse_info(str(admin.raw("INFO", "commandstats"))).items()}
    cpu = parse_info(str(admin.raw("INFO", "cpu")))
    bus = dict(line.split(":", 1) for line in str(admin.raw("CLUSTER", "INFO")).split() if ":" in line)
    stats[BUS] = float(bus.get("cluster_stats_messages_received", 0))
    stats["main thread CPU"] = sum(float(cpu.get(f"used_cpu_{k}_main_thread", 0)) for k in ("user", "sys"))
    pid = parse_info(str(admin.raw("INFO", "server"))).get("process_id")
    try:
        on_cpu, waiting, _ = Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()
    except (OSError, ValueError):
        return stats
    stats[ON_CPU], stats[RUNNABLE] = int(on_cpu) / 1e9, int(waiting) / 1e9
    return stats


ON_CPU, RUNNABLE, BUS = "on a CPU", "waiting for a CPU", "cluster bus messages received"


def where_time_goes(label: str, seconds: float, keys: int, source: tuple[dict[str, float], dict[str, float]],
                    run: Timed | None = None) -> str:
    """One run's wall time split: opsctl's own move and the rest (process start, lock, setup, the looks before
    and after); the source's busy time per command (a single-threaded source: whatever it spends outside MIGRATE
    is what key by key adds) and the time it spent in no command (waiting for the client). From the scheduler,
    the source's main thread on a CPU, waiting for one, and asleep: idle, or blocked in MIGRATE until the target
    answers (MIGRATE alone shows how much of that the move itself needs). Also the cluster bus messages the
    source received: on Redis 7.0 every SETSLOT NODE that closes a slot on its target broadcasts a PONG, and the
    source spends main-thread time on each (it runs no command meanwhile)."""
    before, after = source
    busy = {k: after[k] - before.get(k, 0.0) for k in after if after[k] - before.get(k, 0.0) >= 0.005}
    cpu = busy.pop("main thread CPU", 0.0)
    bus = after.get(BUS, 0.0) - before.get(BUS, 0.0)
    busy.pop(BUS, None)
    on_cpu, runnable = busy.pop(ON_CPU, None), busy.pop(RUNNABLE, 0.0)
    # a script's own calls count in commandstats too: the survey script's GETKEYSINSLOT and MEMORY USAGE
    nested = set(NESTED) if "eval" in busy else set()
    commands = ", ".join(f"{k} {v:.2f}s" + (" (most within eval)" if k in nested else "")
                         for k, v in sorted(busy.items(), key=lambda kv: -kv[1]))
    inside = sum(v for k, v in busy.items() if k not in nested)
    lines = [f"  {label}: {seconds:.2f}s wall ({keys / seconds:.0f} keys/s)"
             + (f", opsctl CPU {run.cpu:.2f}s" if run else "")]
    moved = run.moved_in() if run else None
    if moved is not None:
        lines.append(f"    the move itself {moved:.2f}s; process start, lock, setup and the looks before/after "
                     f"{seconds - moved:.2f}s")
    lines.append(f"    source: in commands {inside:.2f}s ({commands}); main thread CPU {cpu:.2f}s; in no command "
                 f"{max(0.0, seconds - inside):.2f}s; {bus:.0f} {BUS}")
    if on_cpu is not None:
        lines.append(f"    source main thread (scheduler): on a CPU {on_cpu:.2f}s, waiting for a CPU {runnable:.2f}s, "
                     f"asleep {max(0.0, seconds - on_cpu - runnable):.2f}s (idle, or in MIGRATE until the target "
                     "answers)")
    return "\n".join(lines)


def migrate_alone(loaded: LoadedSpec, names: tuple[str, str], slots: int, state_dir: Path,
                  admins: dict[str, NodeClient]) -> tuple[int, float, str]:
    """Move the bench slots from whichever of the two masters holds them to the other, timing only MIGRATE.
    Also where the source's time went while timed."""
    with open_session(Connector(loaded)) as session:
        owned = session.owned()
        source, target = names if 0 in owned[names[0]] else names[::-1]
        moving = list(range(0, slots))
        mover = KeyMover(session, session.peer(source), session.peer(target), Journal(state_dir),
                         Progress(lambda _: None, slots), lambda _: None, Options())
        plan = mover.prepare(moving)
        mover.journal.opened(source, mover.source.id, target, mover.target.id, moving)
        mover.open(moving)
        before = server_time(admins[source])
        started = time.monotonic()
        mover.send(plan)
        seconds = time.monotonic() - started
        moved = sum(len(b.keys) for _, b in plan)
        busy = where_time_goes(f"MIGRATE alone {source} -> {target}", seconds, moved,
                               (before, server_time(admins[source])))
        mover.drain(moving)
        mover.close(moving)
        mover.journal.closed(moving)
        return moved, seconds, busy


def migrateslots_alone(loaded: LoadedSpec, names: tuple[str, str], slots: int) -> float:
    """Valkey: the server-side migration alone, started bare (CLUSTER MIGRATESLOTS on the source) and polled
    every millisecond until done; nothing else timed. The ceiling of the atomic path on this pair."""
    with open_session(Connector(loaded)) as session:
        owned = session.owned()
        source, target = names if 0 in owned[names[0]] else names[::-1]
        runner, dest = session.peer(source), session.peer(target)
        status = status_command("valkey")
        known = {job_id(j) for j in parse_migrations(checked(runner, [status], "status")[0])}
        command, _ = start_commands("valkey", dest.id, ((0, slots - 1),))
        started = time.monotonic()
        checked(runner, [command], "CLUSTER MIGRATESLOTS")
        while (state := job_state(parse_migrations(checked(runner, [status], "status")[0]), known)) is None:
            time.sleep(0.001)
        seconds = time.monotonic() - started
        if state != "done":
            raise RuntimeError(f"bare CLUSTER MIGRATESLOTS: {state}")
        return seconds


def settled(loaded: LoadedSpec) -> None:
    """Untimed, before each timed run: every node agrees on the slot map (the bare job is done when the source
    says so, the others may learn it a moment later; opsctl waits for that itself, its next run must not)."""
    wait_cluster_converged(Connector(loaded), loaded.layout.servers)


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("flavor", nargs="?", default="valkey", choices=("valkey", "redis"))
    parser.add_argument("--keys", type=int, default=500_000)
    parser.add_argument("--tls", action="store_true", help="plaintext against TLS on Redis 7.0")
    args = parser.parse_args()
    os.environ.setdefault(PASSWORD_ENV, PASSWORD)
    # As installed: with bytecode. PYTHONDONTWRITEBYTECODE (set on some machines) would otherwise make every
    # opsctl run compile its modules again (~0.3 s of CPU before it moves a key), which no installed copy does.
    compileall.compile_dir(str(Path(__file__).resolve().parent.parent / "opsctl"), quiet=1)
    if args.tls:
        return tls_compare(args.keys)
    server_binary(args.flavor)
    with server_tmpdir() as tmp:
        spec = make_spec("cluster", args.flavor, cluster={"replicas_per_master": 0},  # redis-cli needs MIGRATE
                         hardening={"rename_takeover_commands": False},
                         memory={"maxmemory": "2gb", "policy": "noeviction"})
        path = Path(tmp) / "topology.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        if opsctl_main(["apply", "-f", str(path), "--auto-approve"]) != 0:
            return 1
        try:
            return run(path, args.flavor, args.keys)
        finally:
            opsctl_main(["destroy", "-f", str(path), "--auto-approve", "--purge"])


def run(path: Path, flavor: str, keys: int) -> int:
    loaded = read_spec(path)
    a, b = (loaded.layout.node(s.master) for s in loaded.layout.shards[:2])
    with admin_for(loaded, a) as admin_a, admin_for(loaded, b) as admin_b:
        ids = {a.name: admin_a.call("CLUSTER", "MYID"), b.name: admin_b.call("CLUSTER", "MYID")}
        slots = 5462
        written = load(admin_a, keys, range(0, slots))
        return measure(loaded, path, flavor, written, slots, ids, {a.name: admin_a, b.name: admin_b})


def measure(loaded: LoadedSpec, path: Path, flavor: str, written: int, slots: int, ids: dict[str, str],
            admins: dict[str, NodeClient]) -> int:
    a, b = admins
    env = {**os.environ, "REDISCLI_AUTH": PASSWORD}
    cli = [redis_cli(), "--cluster", "reshard", admins[a].endpoint, "--cluster-slots", str(slots), "--cluster-yes"]
    opsctl = [*OPSCTL, "cluster", "reshard", "--auto-approve", "-f", str(path), "--slots", str(slots)]
    runs: list[tuple[str, str, list[str]]] = [  # label, source, argv
        ("opsctl", a, [*opsctl, "--from", a, "--to", b]),
        ("redis-cli (default pipeline 10)", b, [*cli, "--cluster-from", ids[b], "--cluster-to", ids[a]]),
        ("opsctl", a, [*opsctl, "--from", a, "--to", b]),
        ("redis-cli --cluster-pipeline 1000", b, [*cli, "--cluster-from", ids[b], "--cluster-to", ids[a],
                                                  "--cluster-pipeline", "1000"]),
    ]
    if flavor == "valkey":
        runs.append(("opsctl --key-by-key", a, [*opsctl, "--from", a, "--to", b, "--key-by-key"]))
    rates: dict[str, list[float]] = {}
    notes: list[str] = []
    print(f"load average before: {load_average()}", flush=True)
    for label, source, argv in runs:
        settled(loaded)
        before = server_time(admins[source])
        done = timed_run(argv, env)
        rates.setdefault(label, []).append(written / done.seconds)
        print(f"{label:<36} {written} keys in {done.seconds:7.2f}s  {written / done.seconds:>10.0f} keys/s", flush=True)
        if label.startswith("opsctl"):
            notes.append(where_time_goes(f"{label} {source} -> {a if source == b else b}", done.seconds, written,
                                         (before, server_time(admins[source])), done))
    alone = "MIGRATE alone (ceiling of key-by-key)"
    for turn in range(1 if flavor == "valkey" else 2):  # Redis: interleaved with opsctl, the best of each counts
        if turn or flavor == "redis":
            settled(loaded)
            before = server_time(admins[a])
            done = timed_run([*opsctl, "--from", a, "--to", b], env)
            rates["opsctl"].append(written / done.seconds)
            print(f"{'opsctl':<36} {written} keys in {done.seconds:7.2f}s  {written / done.seconds:>10.0f} keys/s",
                  flush=True)
            notes.append(where_time_goes(f"opsctl {a} -> {b}", done.seconds, written, (before, server_time(admins[a])),
                                         done))
        settled(loaded)
        moved, seconds, busy = migrate_alone(loaded, (a, b), slots, path.parent / "state", admins)
        rates.setdefault(alone, []).append(moved / seconds)
        print(f"{alone:<36} {moved} keys in {seconds:7.2f}s  {moved / seconds:>10.0f} keys/s", flush=True)
        notes.append(busy)
    bare = "CLUSTER MIGRATESLOTS alone (ceiling)"
    atomic = "opsctl (atomic, before each bare run)"
    # interleaved, as many of each; the best of each counts. opsctl moves A's slots A -> B (`--slots N` takes
    # the source's highest N: only A's own range is the bench's), the bare migration moves them back.
    for _ in range(2 if flavor == "valkey" else 0):
        settled(loaded)
        done = timed_run([*opsctl, "--from", a, "--to", b], env)
        rates.setdefault(atomic, []).append(written / done.seconds)
        print(f"{atomic:<36} {written} keys in {done.seconds:7.2f}s  {written / done.seconds:>10.0f} keys/s",
              flush=True)
        settled(loaded)
        seconds = migrateslots_alone(loaded, (a, b), slots)
        rates.setdefault(bare, []).append(written / seconds)
        print(f"{bare:<36} {written} keys in {seconds:7.2f}s  {written / seconds:>10.0f} keys/s", flush=True)
        notes.append(f"  {atomic} {a} -> {b}: {done.seconds:.2f}s wall, opsctl CPU {done.cpu:.2f}s; the server's "
                     f"job as opsctl saw it {done.moved_in() or 0:.2f}s (bare just after: {seconds:.2f}s); process "
                     f"start, lock, setup and the looks before/after {done.seconds - (done.moved_in() or 0):.2f}s")
    print(f"load average after: {load_average()}")
    best = {label: max(r) for label, r in rates.items()}
    print(f"\n{flavor} {loaded.spec.server.version}, {written} keys of 100 bytes, {slots} slots, A <-> B")
    for label in best:
        if label.startswith("redis-cli"):
            for mover in ("opsctl", "opsctl --key-by-key", alone):
                if mover in best:
                    print(f"  {mover} / {label}: {best[mover] / best[label]:.1f}x")
    if flavor == "valkey":
        print(f"  {atomic} / {bare}: {best[atomic] / best[bare]:.2f} (goal >= 0.8; best of 2 interleaved each)")
        print(f"  opsctl --key-by-key / {alone}: {best['opsctl --key-by-key'] / best[alone]:.2f}")
    else:
        print(f"  opsctl / {alone}: {best['opsctl'] / best[alone]:.2f} (goal >= 0.8)")
    print("\nwhere the time goes:\n" + "\n".join(notes))
    return 0


def tls_compare(keys: int, rounds: int = 2) -> int:
    from opsctl.runtime.opening import make_connector

    server_binary("redis")
    with server_tmpdir() as tmp:
        specs: dict[str, Path] = {}
        try:
            for label, tls in (("plaintext", None), ("tls", {"enabled": True, "generate": True})):
                folder = Path(tmp) / label
                folder.mkdir()
                spec = make_spec("cluster", "redis", cluster={"replicas_per_master": 0},
                                 memory={"maxmemory": "2gb", "policy": "noeviction"}, **({"tls": tls} if tls else {}))
                specs[label] = folder / "topology.yaml"
                specs[label].write_text(yaml.safe_dump(spec, sort_keys=False))
                if opsctl_main(["apply", "-f", str(specs[label]), "--auto-approve"]) != 0:
                    return 1
                loaded = read_spec(specs[label])
                connector = make_connector(loaded, folder / ".opsctl" / loaded.spec.name)
                with admin_for(connector, loaded.layout.node(loaded.layout.shards[0].master)) as admin:
                    written = load(admin, keys, range(0, 5462))
            rates: dict[str, list[float]] = {label: [] for label in specs}
            print(f"{written} keys of 100 bytes, 5462 slots A <-> B; load average before: {load_average()}", flush=True)
            for turn in range(rounds * 2):
                for label, path in specs.items():
                    a, b = (s.master for s in read_spec(path).layout.shards[:2])
                    source, target = (a, b) if turn % 2 == 0 else (b, a)
                    seconds = timed([*OPSCTL, "cluster", "reshard", "-f", str(path), "--slots", "5462", "--from",
                                     source, "--to", target, "--auto-approve"], dict(os.environ))
                    rates[label].append(written / seconds)
                    print(f"{label:>9} {source} -> {target}: {seconds:6.2f}s {written / seconds:>9.0f} keys/s",
                          flush=True)
            best = {label: max(values) for label, values in rates.items()}
            print(f"load average after: {load_average()}")
            print(f"tls / plaintext reshard keys/s (best of {rounds * 2}): {best['tls'] / best['plaintext']:.2f} "
                  f"(goal >= 0.75: {'met' if best['tls'] >= 0.75 * best['plaintext'] else 'NOT met'})")
        finally:
            for path in specs.values():
                opsctl_main(["destroy", "-f", str(path), "--auto-approve", "--purge"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
