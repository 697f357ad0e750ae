"""bench/failover: client-observed write gap and total time of `opsctl failover` against a bare
`CLUSTER FAILOVER` sent by hand and polled (ROLE every 2 ms), same cluster, same cluster-aware writer.

    .venv/bin/python bench/failover.py [valkey|redis] [--trials N]
    .venv/bin/python bench/failover.py --tls [--trials N]

--tls: opsctl's failover write gap on a plaintext and a TLS Redis 7.0 cluster (generated certificates, the writer
speaks TLS too), side by side in one run.

Trials alternate opsctl / bare and rotate over the 3 shards; between trials the bench waits (polling) out the
servers' cool-downs for both methods alike. Goal: opsctl adds <= 50 ms to the write gap and finishes, checks
included, within 2 s.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opsctl.cli.main import main as opsctl
from opsctl.net.connector import Connector
from opsctl.runtime.opening import make_connector
from opsctl.spec.load import LoadedSpec
from opsctl.state.specfile import read_spec
from tests.support import PASSWORD, PASSWORD_ENV, admin_for, make_spec, server_tmpdir, tls_client_options, write_spec
from tests.writer import Writer, cluster_client

NODE_TIMEOUT_MS = 500
RETRY_S = 2 * max(2.0, 2 * NODE_TIMEOUT_MS / 1000) + 0.2  # the candidate's election cool-down, with margin


@dataclass
class Results:
    gaps: dict[str, list[float]] = field(default_factory=lambda: {"opsctl": [], "bare": []})
    totals: dict[str, list[float]] = field(default_factory=lambda: {"opsctl": [], "bare": []})
    runbook_ms: list[float] = field(default_factory=list)
    lost: int = 0


def _connector(loaded: LoadedSpec) -> Connector:
    return make_connector(loaded, Path(loaded.file).parent / ".opsctl" / loaded.spec.name)


def roles(loaded: LoadedSpec, shard: int) -> tuple[str, str]:
    """(master, replica) of the shard now (through the spec's TLS when it has some)."""
    members = loaded.layout.shards[shard - 1].members
    kinds = {}
    connector = _connector(loaded)
    for name in members:
        with admin_for(connector, loaded.layout.node(name), timeout=2.0) as admin:
            kinds[name] = admin.client.execute_command("ROLE")[0]
    master = next(n for n, k in kinds.items() if k == "master")
    return master, next(n for n in members if n != master)


def bare(loaded: LoadedSpec, replica: str) -> None:
    """What an engineer does by hand: CLUSTER FAILOVER on the replica, then poll ROLE until it is master."""
    with admin_for(_connector(loaded), loaded.layout.node(replica)) as admin:
        admin.call("CLUSTER", "FAILOVER")
        while admin.client.execute_command("ROLE")[0] != "master":
            time.sleep(0.002)


def with_opsctl(spec: Path, shard: int, report: Path) -> float:
    code = opsctl(["failover", "-f", str(spec), "--shard", str(shard), "--yes", "--report", str(report)])
    if code != 0:
        raise SystemExit(f"opsctl failover failed with exit code {code}")
    return float(json.loads(report.read_text())["phases_ms"]["total"])


def converged(spec: Path) -> None:
    deadline = time.monotonic() + 30
    while opsctl(["cluster", "check", "-f", str(spec)]) != 0:
        if time.monotonic() > deadline:
            raise SystemExit("the cluster did not converge")
        time.sleep(0.05)


def trial(loaded: LoadedSpec, spec: Path, method: str, shard: int, work: Path, results: Results,
          client: Callable[[], Any]) -> str:
    _, replica = roles(loaded, shard)
    with Writer(client) as writer:
        writer.wait_for_writes(300)
        started = time.monotonic()
        if method == "bare":
            bare(loaded, replica)
        else:
            results.runbook_ms.append(with_opsctl(spec, shard, work / f"r{len(results.runbook_ms)}.json"))
        results.totals[method].append((time.monotonic() - started) * 1000)
        writer.wait_for_writes(len(writer.acked) + 300)
    results.gaps[method].append(writer.max_gap_ms)
    results.lost += len(writer.verify(client()))
    return replica


def run(loaded: LoadedSpec, spec: Path, trials: int, work: Path, methods: tuple[str, ...] = ("opsctl", "bare"),
        client: Callable[[], Any] | None = None) -> Results:
    results = Results()
    promoted_at: dict[str, float] = {}
    for i in range(trials * len(methods)):
        method, shard = methods[i % len(methods)], i // len(methods) % 3 + 1
        _, replica = roles(loaded, shard)
        while time.monotonic() - promoted_at.get(replica, 0.0) < RETRY_S:
            time.sleep(0.05)  # waiting out the servers' cool-down, polled
        converged(spec)
        promoted = trial(loaded, spec, method, shard, work, results, client or (lambda: cluster_client(loaded)))
        promoted_at[promoted] = time.monotonic()
    converged(spec)
    return results


def summary(results: Results) -> None:
    gap = {m: statistics.median(v) for m, v in results.gaps.items()}
    worst = {m: max(v) for m, v in results.gaps.items()}
    for m in ("bare", "opsctl"):
        print(f"{m:>7}: write gap median {gap[m]:.0f} ms (max {worst[m]:.0f} ms), "
              f"time median {statistics.median(results.totals[m]):.0f} ms (max {max(results.totals[m]):.0f} ms)")
    print(f"opsctl runbook (pre-checks, failover, post-checks, report): median "
          f"{statistics.median(results.runbook_ms):.0f} ms, max {max(results.runbook_ms):.0f} ms (goal <= 2000 ms)")
    print(f"write gap: opsctl - bare = {gap['opsctl'] - gap['bare']:+.0f} ms (goal <= +50 ms), "
          f"ratio {gap['opsctl'] / gap['bare']:.2f}x; acknowledged writes lost: {results.lost}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("flavor", nargs="?", default="valkey", choices=("valkey", "redis"))
    parser.add_argument("--trials", type=int, default=6, help="failovers per method")
    parser.add_argument("--tls", action="store_true", help="opsctl on a plaintext and a TLS Redis 7.0 cluster")
    args = parser.parse_args()
    os.environ.setdefault(PASSWORD_ENV, PASSWORD)
    if args.tls:
        return tls_compare(args.trials)
    with server_tmpdir() as tmp:
        work = Path(tmp)
        spec = write_spec(work, make_spec("cluster", args.flavor, cluster={"node_timeout_ms": NODE_TIMEOUT_MS}))
        if opsctl(["apply", "-f", str(spec), "--auto-approve"]) != 0:
            return 1
        try:
            summary(run(read_spec(spec), spec, args.trials, work))
        finally:
            opsctl(["destroy", "-f", str(spec), "--auto-approve", "--purge"])
    return 0


def tls_compare(trials: int) -> int:
    gaps: dict[str, dict[str, list[float]]] = {}
    lost = 0
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    for label, tls in (("plaintext", None), ("tls", {"enabled": True, "generate": True})):
        with server_tmpdir() as tmp:
            work = Path(tmp)
            extra = {"tls": tls} if tls else {}
            spec = write_spec(work, make_spec("cluster", "redis", cluster={"node_timeout_ms": NODE_TIMEOUT_MS},
                                              **extra))
            if opsctl(["apply", "-f", str(spec), "--auto-approve"]) != 0:
                return 1
            try:
                loaded = read_spec(spec)
                options = tls_client_options(work / ".opsctl" / loaded.spec.name) if tls else {}
                client = functools.partial(cluster_client, loaded, **options)
                results = run(loaded, spec, trials, work, ("opsctl", "bare"), client)
                gaps[label], lost = results.gaps, lost + results.lost
            finally:
                opsctl(["destroy", "-f", str(spec), "--auto-approve", "--purge"])
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    median = {label: {m: statistics.median(v) for m, v in by.items()} for label, by in gaps.items()}
    for label, by in gaps.items():
        for method, values in by.items():
            print(f"{label:>9}: {method:>6} failover write gap median {median[label][method]:.0f} ms "
                  f"(max {max(values):.0f} ms, {len(values)} failovers)")
    for method in ("opsctl", "bare"):
        print(f"{method}: tls / plaintext write gap {median['tls'][method] / median['plaintext'][method]:.2f}x")
    print(f"with TLS, opsctl - bare = {median['tls']['opsctl'] - median['tls']['bare']:+.0f} ms "
          f"(what opsctl adds over a bare CLUSTER FAILOVER; the rest is the TLS client reconnecting); "
          f"acknowledged writes lost: {lost}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
