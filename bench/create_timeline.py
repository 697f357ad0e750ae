"""bench/create_timeline: where a cluster's creation spends its time, node by node, from the servers' own logs.

One `opsctl apply` of a new cluster; apply's step events are timed as they arrive, and each server's log (ms
timestamps, read after apply returned, so nothing polls the servers meanwhile) gives per node: process start,
listening, cluster_state ok, and for a replica its sync (connecting, full sync started, finished, AOF rewrite
after the load). Times are seconds from apply's launch. Prints percentiles per event and the last node for each,
then the CPU seconds of opsctl and of all servers together (from /proc, before the servers are stopped).

    .venv/bin/python bench/create_timeline.py [--nodes 60] [--flavor valkey] [--keep]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opsctl.render import default_paths  # noqa: E402
from opsctl.spec.load import LoadedSpec  # noqa: E402
from opsctl.state.specfile import read_spec  # noqa: E402
from tests.support import PASSWORD, PASSWORD_ENV, make_spec, server_tmpdir, write_spec  # noqa: E402

OPSCTL = [sys.executable, "-m", "opsctl.cli.main"]
LINE = re.compile(r"^(\d+):(\w) (\d+ \w+ \d+ [\d:.]+) [-.*#] (.*)$")
EVENTS = (  # (name, pattern of a log message): the first line matching it marks the event
    ("process", r"oO0OoO0OoO0Oo"),
    ("listening", r"Ready to accept connections"),
    ("epoch", r"configEpoch set to"),
    ("meet", r"Cluster meet |Successfully completed handshake"),
    ("replicate", r"Connecting to (MASTER|PRIMARY)"),
    ("asks-sync", r"asks for synchronization"),
    ("psync", r"Partial resynchronization not possible"),
    ("full-sync", r"Full resync from (master|primary)"),
    ("loaded", r"REPLICA sync: Finished with success"),
    ("aof-rewrite", r"Background append only file rewriting started"),
    ("aof-done", r"Background AOF rewrite (finished|terminated) with success|Reused RDB file"),
    ("repl-done", r"Synchronization with replica .* succeeded"),
    ("ok", r"Cluster state changed: ok"),
)


def env() -> dict[str, str]:
    return {**os.environ, PASSWORD_ENV: PASSWORD, "REDISCLI_AUTH": PASSWORD}


def log_events(path: Path, origin: float) -> dict[str, float]:
    """First time (s after origin, a wall-clock epoch) of each EVENTS message in one server log."""
    found: dict[str, float] = {}
    for line in path.read_text(errors="replace").splitlines():
        match = LINE.match(line)
        if not match:
            continue
        stamp = datetime.datetime.strptime(match.group(3), "%d %b %Y %H:%M:%S.%f")
        at = stamp.replace(tzinfo=datetime.timezone.utc).timestamp() - origin
        for name, needle in EVENTS:
            if name not in found and re.search(needle, match.group(4)):
                found[name] = at
    return found


def loaded_paths(loaded: LoadedSpec, state: Path, name: str) -> str:
    return default_paths(str(state), loaded.layout.node(name)).log


def server_cpu(state: Path) -> float:
    """User+system seconds of every live process working under the state dir."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    below = str(state.resolve()) + os.sep
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if not os.readlink(f"/proc/{entry.name}/cwd").startswith(below):
                continue
            fields = Path(f"/proc/{entry.name}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def run(directory: Path, nodes: int, flavor: str, keep: bool) -> None:
    spec = make_spec("cluster", flavor, cluster={"masters": nodes // 2, "replicas_per_master": 1})
    path = write_spec(directory, spec)
    state = directory / ".opsctl" / spec["name"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    origin, started = time.time(), time.monotonic()
    proc = subprocess.Popen([*OPSCTL, "apply", "-f", str(path), "--auto-approve", "--output", "json"], env=env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    steps: dict[str, list[float]] = {}
    for line in proc.stderr:
        now = time.monotonic() - started
        event = json.loads(line) if line.startswith("{") else {}
        if event.get("event") in ("step-start", "step-done"):
            kind = event["step"].split()[0]
            span = steps.setdefault(kind, [now, now])
            span[0], span[1] = min(span[0], now), max(span[1], now)
        elif line.strip() and not line.startswith("{"):
            print("apply:", line.rstrip())
    code = proc.wait()
    wall = time.monotonic() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = usage.ru_utime - before.ru_utime + usage.ru_stime - before.ru_stime
    servers_cpu = server_cpu(state)
    loaded = read_spec(path, env())
    roles = {n.name: n.role for n in loaded.layout.servers}
    timeline = {name: log_events(Path(loaded_paths(loaded, state, name)), origin) for name in roles}
    print(f"{flavor} {nodes} nodes, load {os.getloadavg()[0]:.2f}: apply exit {code}, wall {wall:.2f} s, "
          f"opsctl cpu {cpu:.2f} s, servers' cpu {servers_cpu:.2f} s (all {len(roles)} together, until apply returned"
          " + reading)")
    print("steps (first start .. last end): " + ", ".join(f"{k} {a:.2f}..{b:.2f}" for k, (a, b) in steps.items()))
    print(f"{'event':<13} {'role':<8} {'n':>3} {'first':>6} {'median':>6} {'last':>6}  last node")
    for event, _ in EVENTS:
        for role in ("master", "replica"):
            times = sorted((t[event], n) for n, t in timeline.items() if event in t and roles[n] == role)
            if times:
                print(f"{event:<13} {role:<8} {len(times):>3} {times[0][0]:>6.2f} {times[len(times) // 2][0]:>6.2f} "
                      f"{times[-1][0]:>6.2f}  {times[-1][1]}")
    if not keep:
        subprocess.run([*OPSCTL, "destroy", "-f", str(path), "--auto-approve", "--purge"], env=env(), check=True,
                       capture_output=True)
    else:
        print(f"kept: {path} (opsctl destroy -f {path} --auto-approve --purge)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=60)
    parser.add_argument("--flavor", default="valkey")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running (destroy it yourself)")
    args = parser.parse_args()
    if args.keep:
        kept = Path(tempfile.mkdtemp(prefix="bench-timeline-"))
        kept.chmod(0o711)
        run(kept, args.nodes, args.flavor, True)
        return 0
    with server_tmpdir(prefix="bench-timeline-") as tmp:
        run(Path(tmp), args.nodes, args.flavor, False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
