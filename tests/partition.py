"""Network partitions on one machine, without netem: one network namespace per fault run, each host a 127.x.y.z
address on its loopback, iptables DROP rules between groups of addresses to cut and heal.

Servers and sentinels get `bind-source-addr` (hosts[].source_address), so every connection between hosts leaves
from its host's address and a rule on (source, destination) cuts exactly the links between two groups. Rules and
traffic never leave the namespace: the root namespace's tables and interfaces are not touched. DROP (not REJECT)
leaves connections open and silent, as a real split does: nodes notice only through their own timeouts.

The fault run lives inside the namespace as a child process (`ip netns exec NS python -m tests.partition ...`):
opsctl, the servers it starts, the writer and the referee all run there; the child prints its result as one JSON
line. The test process creates the namespace and removes it with everything in it (namespace()), whatever happens.

    python -m tests.partition sentinel-split --flavor valkey --seed 1 --cut 8 [--to-write N] [--lag S]

runs one fault in the current namespace (the caller's job to make that a fresh one: run_in_namespace does).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CHAIN = "OPSCTL_PARTITION"
RESULT = "PARTITION-RESULT "
RUN_TIMEOUT = 900.0  # one fault run, apply to destroy: a bound, not a wait (240 s was short beside two CPU hogs)
CONVERGE_TIMEOUT = 60.0  # after the heal: the old master rejoins as a replica
ACK_BOUND_SLACK = 1.0  # scheduling on a loaded machine, beyond the server's own lag + 2 s


def unavailable() -> str | None:
    """What this machine lacks to run a partition, or None."""
    if os.geteuid() != 0:
        return "root (for ip netns and iptables)"
    for tool in ("ip", "iptables"):
        if not shutil.which(tool):
            return f"{tool} (apt-get install -y {'iproute2' if tool == 'ip' else 'iptables'})"
    return None


# --- the test process's side: a namespace, and the fault run inside it ---

def _run(*argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {result.stderr.strip()}")
    return result


@contextmanager
def namespace() -> Iterator[str]:
    """A fresh network namespace with loopback up; on leaving, every process in it is killed and it is deleted."""
    name = f"opspart{random.randrange(16**6):06x}"
    _run("ip", "netns", "add", name)
    try:
        _run("ip", "-n", name, "link", "set", "lo", "up")
        yield name
    finally:
        _kill_all(name)
        _run("ip", "netns", "del", name, check=False)


def _kill_all(name: str) -> None:
    """Every process left in the namespace (servers a failed run did not stop): TERM, then KILL, bounded."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = _pids(name)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 5
        while pids and time.monotonic() < deadline:
            time.sleep(0.05)
            pids = _pids(name)
        if not pids:
            return


def _pids(name: str) -> list[int]:
    return [int(p) for p in _run("ip", "netns", "pids", name, check=False).stdout.split() if p.isdigit()]


def run_in_namespace(scenario: str, **options: object) -> dict[str, Any]:
    """Run one fault in a fresh namespace; its result (a SplitResult as a dict)."""
    argv = [scenario, *(f"--{k.replace('_', '-')}={v}" for k, v in options.items() if v is not None)]
    return run_module_in_namespace("tests.partition", argv)


def run_module_in_namespace(module: str, argv: list[str]) -> dict[str, Any]:
    """Run `python -m module argv` in a fresh namespace; the JSON of its last RESULT line. Raises with the child's
    output when it gives none."""
    with namespace() as name:
        child = subprocess.run(["ip", "netns", "exec", name, sys.executable, "-m", module, *argv],
                               capture_output=True, text=True, timeout=RUN_TIMEOUT, cwd=ROOT, check=False)
    lines = [line for line in child.stdout.splitlines() if line.startswith(RESULT)]
    if child.returncode != 0 or not lines:
        raise RuntimeError(f"{module} {argv} failed (rc {child.returncode}):\n{child.stdout[-3000:]}\n"
                           f"{child.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1][len(RESULT):])
    return result


# --- inside the namespace: rules, a schedule, a run ---

class Partition:
    """DROP rules between groups of addresses in this namespace's OUTPUT chain (loopback traffic passes it once)."""

    def __init__(self) -> None:
        _run("iptables", "-N", CHAIN)
        _run("iptables", "-I", "OUTPUT", "-j", CHAIN)

    def cut(self, *groups: Sequence[str]) -> None:
        """No packet between two different groups, either way; traffic inside a group and to others flows."""
        for i, group in enumerate(groups):
            for other in groups[i + 1:]:
                for a in group:
                    for b in other:
                        _run("iptables", "-A", CHAIN, "-s", a, "-d", b, "-j", "DROP")
                        _run("iptables", "-A", CHAIN, "-s", b, "-d", a, "-j", "DROP")

    def heal(self) -> None:
        _run("iptables", "-F", CHAIN)

    def close(self) -> None:
        self.heal()
        _run("iptables", "-D", "OUTPUT", "-j", CHAIN, check=False)
        _run("iptables", "-X", CHAIN, check=False)


@dataclass(frozen=True)
class Fault:
    """When the cut lands (seconds after the writer's first acknowledgements) and how long it lasts."""

    start: float
    duration: float


def schedule(seed: int, cut: float) -> Fault:
    """A seeded fault: the cut lands 0.5-1.5 s into the writes and lasts cut seconds."""
    return Fault(round(random.Random(seed).uniform(0.5, 1.5), 3), cut)


@dataclass(frozen=True)
class SplitResult:
    """One Sentinel split: the master's host cut off from the other two hosts while a client beside it writes.
    Times in seconds from the cut. first_lost, loss_window: the first and last lost acknowledged write (before
    0: the asynchronous replication window at the cut); master_stopped: the old master's
    last acknowledgement; promoted: a replica reports ROLE master; two_masters: both took writes."""

    flavor: str
    seed: int
    cut: float
    to_write: str
    lag: str
    acked: int
    lost: int
    first_lost: float
    loss_window: float
    master_stopped: float
    promoted: float | None
    two_masters: float
    rejoined: float
    peer_sources: list[str]
    host_addresses: list[str]

    @property
    def bound(self) -> float:
        """The documented window: min-replicas-max-lag + 2 s (docs/runbooks/partitions.md), plus slack."""
        return float(self.lag) + 2 + ACK_BOUND_SLACK


class RoleWatch:
    """Polls the replicas' ROLE every 50 ms from outside every group: when did one become master?"""

    def __init__(self, ask: Callable[[], bool]) -> None:
        self.ask, self.seen = ask, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + RUN_TIMEOUT
        while not self._stop.is_set() and self.seen is None and time.monotonic() < deadline:
            if self.ask():
                self.seen = time.monotonic()
            time.sleep(0.05)

    def stop(self) -> float | None:
        self._stop.set()
        self._thread.join(5)
        return self.seen


def sentinel_split(flavor: str, seed: int, cut: float, to_write: int | None, lag: int | None) -> SplitResult:
    """Deploy a Sentinel topology (3 sentinels, master + 2 replicas, down-after 2 s) with opsctl, cut the master's
    host off for `cut` seconds while a client on its side writes to it, heal, wait until it rejoins, count."""
    from opsctl.cli.main import main
    from opsctl.state.specfile import read_spec
    from tests.support import PASSWORD, PASSWORD_ENV, make_spec, server_tmpdir, write_spec

    os.environ.setdefault(PASSWORD_ENV, PASSWORD)
    persistence = {k: v for k, v in (("min_replicas_to_write", to_write), ("min_replicas_max_lag", lag))
                   if v is not None}
    spec = make_spec("sentinel", flavor, sentinel={"down_after_ms": 2000, "failover_timeout_ms": 6000},
                     **({"persistence": persistence} if persistence else {}))
    spec["hosts"] = [{**h, "source_address": h["address"]} for h in spec["hosts"]]
    with server_tmpdir("opsctl-partition-") as tmp:
        path = write_spec(Path(tmp), spec)
        if main(["apply", "-f", str(path), "--auto-approve"]) != 0:
            raise RuntimeError("apply failed")
        try:
            return _split(read_spec(path), flavor, seed, schedule(seed, cut))
        finally:
            main(["destroy", "-f", str(path), "--auto-approve", "--purge"])


def _split(loaded: Any, flavor: str, seed: int, fault: Fault) -> SplitResult:
    import redis

    from opsctl.base.poll import wait_for
    from tests.support import PASSWORD, admin_for
    from tests.writer import Writer

    def client(name: str) -> redis.Redis:
        node = loaded.layout.node(name)
        return redis.Redis(host=node.address, port=node.port, password=PASSWORD, socket_timeout=1.0,
                           socket_connect_timeout=0.5, decode_responses=True)

    def role(name: str) -> str | None:
        with contextlib.suppress(redis.RedisError, OSError):
            return str(client(name).execute_command("ROLE")[0])
        return None

    shard = loaded.layout.shards[0]
    old = loaded.layout.node(shard.master)
    others = sorted({loaded.layout.node(n).address for n in shard.replicas} - {old.address})
    settings = admin_for(loaded, old).config_get("min-replicas-*")
    sources = _peer_sources(client(old.name))
    partition = Partition()
    try:
        with Writer(lambda: client(old.name)) as writer:
            writer.wait_for_writes(200)
            time.sleep(fault.start)
            watch = RoleWatch(lambda: any(role(n) == "master" for n in shard.replicas))
            cut_at = time.monotonic()
            partition.cut([old.address], others)
            time.sleep(fault.duration)
            partition.heal()
            wait_for(lambda: role(old.name) == "slave" or None, CONVERGE_TIMEOUT, f"{old.name} to rejoin")
            rejoined = time.monotonic() - cut_at
        promoted = watch.stop()
    finally:
        partition.close()
    new = next(n for n in shard.replicas if role(n) == "master")
    wait_for(lambda: _synced(client(new)) or None, CONVERGE_TIMEOUT, "replicas to catch up")
    when = dict(zip(writer.acked, writer.ack_times, strict=True))
    lost = [key for key, _ in writer.lost(client(new))]
    after = [t - cut_at for t in writer.ack_times if t >= cut_at]
    last_ack = max(after, default=0.0)
    promoted_at = None if promoted is None else promoted - cut_at
    return SplitResult(
        flavor, seed, fault.duration, settings.get("min-replicas-to-write", "?"),
        settings.get("min-replicas-max-lag", "?"), len(when), len(lost),
        round(min((when[k] - cut_at for k in lost), default=0.0), 3),
        round(max((when[k] - cut_at for k in lost), default=0.0), 3), round(last_ack, 3),
        None if promoted_at is None else round(promoted_at, 3),
        round(max(0.0, last_ack - promoted_at) if promoted_at is not None else 0.0, 3), round(rejoined, 3),
        sources, sorted({n.address for n in loaded.layout.nodes}))


def _peer_sources(client: Any) -> list[str]:
    """Source addresses of the replicas' and sentinels' connections to this master (bind-source-addr at work)."""
    peers = [c for c in client.client_list()
             if "S" in c.get("flags", "") or str(c.get("name", "")).startswith("sentinel-")]
    return sorted({c["addr"].rsplit(":", 1)[0] for c in peers})


def _synced(client: Any) -> bool:
    """Every replica of this master is online at its offset."""
    info = client.info("replication")
    offset = info.get("master_repl_offset")
    replicas = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
    return bool(replicas) and all(r.get("state") == "online" and r.get("offset") == offset for r in replicas)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.partition")
    parser.add_argument("scenario", choices=["sentinel-split"])
    parser.add_argument("--flavor", default="valkey", choices=["valkey", "redis"])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cut", type=float, default=8.0)
    parser.add_argument("--to-write", type=int)
    parser.add_argument("--lag", type=int)
    args = parser.parse_args(argv)
    result = sentinel_split(args.flavor, args.seed, args.cut, args.to_write, args.lag)
    print(RESULT + json.dumps(asdict(result)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
