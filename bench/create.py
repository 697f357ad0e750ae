"""bench/create: a cluster from nothing, opsctl vs `redis-cli --cluster create` vs the floor, same run.

floor: one bare server of the same rendered config started (Popen) and polled every 5 ms, given every slot at
once, until it reports cluster_state:ok. A master reports ok no sooner than ~2 s after its start (the server's
writable delay), so no tool that starts the processes can be faster.
all: every server of the spec launched at once, each master given every slot alone as soon as it answers, until
every master is ok: the writable delay counted from the last master's start while all N servers start on this
machine's cores. No tool that starts the servers can have every master ok sooner (the mesh's handshakes and the
replicas' syncs are left out: a floor, not a way to form a cluster).
opsctl: `opsctl apply` wall time (it returns once every node takes writes and all agree; `--cluster check` is
then asserted, not timed) and its CPU time. Then, for every run, where the time went: before the first step
(Python start, imports, facts, plan), each kind of step by role (write-config(master), start(master), the
replicas' that run beside the masters' start-up and form-cluster, form-cluster) from its first start to its last
end as apply's JSON events arrive (they overlap), after the last step (apply's status, exit), and from the first
launch to the last step's end (launch->converged, to compare with the floor); beside it, `opsctl plan` of the
same spec timed alone (process start, imports, facts, plan: most of "before steps"). bench/create_timeline.py
shows the same node by node from the servers' own logs.
redis-cli: the same servers started by opsctl's provider, `--cluster create`, timed until `--cluster check`
passes and until every node reports cluster_state:ok.
Goals: 15 nodes within 0.5 s of the floor, 60 nodes <= 3 s.

    .venv/bin/python bench/create.py [--nodes 15 60] [--flavor valkey redis]
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from opsctl.base.poll import Pending, wait_for  # noqa: E402
from opsctl.providers.binaries import find_server  # noqa: E402
from opsctl.providers.local import LocalProvider, start_command  # noqa: E402
from opsctl.providers.proc import read_proc, working_below  # noqa: E402
from opsctl.render import render_node  # noqa: E402
from opsctl.server.versions import parse_version  # noqa: E402
from opsctl.state.specfile import read_spec  # noqa: E402
from tests.support import PASSWORD, PASSWORD_ENV, make_spec, server_tmpdir, write_spec  # noqa: E402

OPSCTL = [sys.executable, "-m", "opsctl.cli.main"]


def env() -> dict[str, str]:
    return {**os.environ, PASSWORD_ENV: PASSWORD, "REDISCLI_AUTH": PASSWORD}


def check(endpoint: str) -> bool:
    out = subprocess.run(["redis-cli", "--cluster", "check", endpoint], capture_output=True, text=True,
                         env=env(), check=False)
    return out.returncode == 0 and "All 16384 slots covered" in out.stdout


def all_ok(endpoints: list[str]) -> bool:
    """Every node reports cluster_state:ok, i.e. the cluster accepts writes."""
    for endpoint in endpoints:
        host, port = endpoint.rsplit(":", 1)
        out = subprocess.run(["redis-cli", "-h", host, "-p", port, "cluster", "info"], capture_output=True,
                             text=True, env=env(), check=False).stdout
        if "cluster_state:ok" not in out:
            return False
    return True


def servers_below(folder: Path) -> list[int]:
    """The pids of the servers (valkey-server, redis-server) whose working directory lies below folder."""
    pids = [pid for found in working_below(str(folder)).values() for pid in found]
    return [pid for pid in pids if (facts := read_proc(pid)) is not None
            and os.path.basename(facts.exe).startswith(("valkey-server", "redis-server"))]


def sweep(folder: Path) -> int:
    """Kill every server still running below folder (a bench's own tmp folder: nothing else runs there) and wait
    until they are gone; how many there were. What a failed run, a failed destroy or an interrupt left: a bench
    must never leave servers loading the shared machine."""
    left = servers_below(folder)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    def gone() -> bool | Pending:
        alive = servers_below(folder)
        return True if not alive else Pending(f"pids {alive} still running after SIGKILL", len(alive))

    if left:
        wait_for(gone, 30.0, f"the servers below {folder} to exit", interval=0.05)
    return len(left)


@contextlib.contextmanager
def swept(prefix: str) -> Iterator[Path]:
    """A bench's tmp folder, whose servers are killed when the bench leaves it by any way (SIGTERM too: it
    raises SystemExit here, so a `timeout` around the bench still cleans up), saying how many were left."""
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        with server_tmpdir(prefix=prefix) as tmp:
            try:
                yield Path(tmp)
            finally:
                if left := sweep(Path(tmp)):
                    print(f"cleanup: killed {left} server(s) the run left below {tmp}", file=sys.stderr)
    finally:
        signal.signal(signal.SIGTERM, previous)


# Redis's default node timeout, as production runs: the tests' 2 s (tests/support.make_spec) is shorter than the time
# a node takes to answer its peers' pings when 240 of them gossip on 2 cores, and then they flag each other failing.
NODE_TIMEOUT_MS = 15000


def spec_file(directory: Path, nodes: int, flavor: str) -> Path:
    spec = make_spec("cluster", flavor, cluster={"masters": nodes // 2, "replicas_per_master": 1,
                                                 "node_timeout_ms": NODE_TIMEOUT_MS})
    return write_spec(directory, spec)


def time_floor(directory: Path, flavor: str) -> tuple[float, float]:
    """(seconds until the bare server accepts connections, seconds until it reports cluster_state:ok)."""
    (directory / "floor").mkdir()
    loaded = read_spec(spec_file(directory / "floor", 6, flavor), env())
    spec = loaded.spec
    binary = find_server(spec.server.flavor, parse_version(spec.server.version), None)
    provider = LocalProvider(loaded, directory / "floor" / "state", binary)
    node = loaded.layout.servers[0]
    paths = provider.paths(node)
    provider.write_files(node, render_node(loaded, node, paths, reveal=True).files)
    client = redis.Redis(node.address, node.port, password=PASSWORD, socket_timeout=1, socket_connect_timeout=1,
                         decode_responses=True)
    started = time.monotonic()
    subprocess.run(start_command(binary.path, node, paths.conf), cwd=paths.dir, check=True,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.005)
        answering = time.monotonic() - started
        client.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        while "cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):
            time.sleep(0.005)
        return answering, time.monotonic() - started
    finally:
        client.close()
        provider.stop(node)


def time_floor_cluster(directory: Path, nodes: int, flavor: str) -> float:
    """Seconds from launching every server of the spec at once (masters first; the configs opsctl renders,
    written beforehand) until every master reports cluster_state:ok, each master given every slot, alone, as
    soon as it answers (polled every 5 ms). A master is ok no sooner than 2 s after its own start, and all N
    servers share this machine's cores while they start, so no tool that starts them can have every master ok
    sooner; the mesh's handshakes and the replicas' syncs (which a real creation also needs) are left out, so
    this is a floor, not a way to form a cluster."""
    (directory / "floor-all").mkdir()
    loaded = read_spec(spec_file(directory / "floor-all", nodes, flavor), env())
    binary = find_server(loaded.spec.server.flavor, parse_version(loaded.spec.server.version), None)
    provider = LocalProvider(loaded, directory / "floor-all" / "state", binary)
    servers = sorted(loaded.layout.servers, key=lambda n: n.role != "master")
    for node in servers:
        provider.write_files(node, render_node(loaded, node, provider.paths(node), reveal=True).files)
    masters = {n.name: redis.Redis(n.address, n.port, password=PASSWORD, socket_timeout=2, socket_connect_timeout=1,
                                   decode_responses=True) for n in servers if n.role == "master"}
    started = time.monotonic()
    procs = [subprocess.Popen(start_command(binary.path, n, provider.paths(n).conf), cwd=provider.paths(n).dir,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for n in servers]
    try:
        unanswered, not_ok = set(masters), set(masters)
        while not_ok:
            if time.monotonic() - started > 60:
                raise SystemExit(f"floor: {', '.join(sorted(not_ok))} not ok 60 s after launch")
            for name in list(unanswered):
                with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
                    try:
                        masters[name].execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
                    except redis.ResponseError as exc:  # a slow first try was applied after all
                        if "busy" not in str(exc):
                            raise
                    unanswered.discard(name)
            for name in not_ok - unanswered:
                with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
                    if "cluster_state:ok" in masters[name].execute_command("CLUSTER", "INFO"):
                        not_ok.discard(name)
            time.sleep(0.005)
        return time.monotonic() - started
    finally:  # the servers daemonize: the launched processes are gone, their servers are stopped by pidfile
        for client in masters.values():
            client.close()
        for proc in procs:
            proc.wait()
        with ThreadPoolExecutor(max_workers=16) as pool:
            list(pool.map(provider.stop, servers))


@dataclass
class Run:
    """One `opsctl apply`: wall and CPU seconds, and when (seconds from launch) each step started and ended."""

    wall: float
    cpu: float
    steps: list[tuple[str, float, float]]  # (kind, start, end), in the order the steps started; a node's kind
    # names its role, e.g. "start(master)": a new cluster's replicas are written and started beside the masters'
    # start-up and form-cluster
    plan_alone: float  # `opsctl plan` of the same spec, process start to exit: the floor of "before steps"

    def phases(self) -> list[tuple[str, float]]:
        """Where the time went: before the first step (Python start, imports, facts, plan), each kind of step from
        its first start to its last end, and after the last step (the status that apply prints, exit)."""
        if not self.steps:
            return [("no steps", self.wall)]
        kinds: dict[str, tuple[float, float]] = {}
        for kind, start, end in self.steps:
            first, last = kinds.get(kind, (start, end))
            kinds[kind] = (min(first, start), max(last, end))
        first_start = min(start for _, start, _ in self.steps)
        last_end = max(end for _, _, end in self.steps)
        launched = min((s for k, (s, _) in kinds.items() if k.startswith("start")), default=first_start)
        return [("before steps", first_start), *((k, e - s) for k, (s, e) in kinds.items()),
                ("after steps", self.wall - last_end), ("launch->converged", last_end - launched)]


def time_opsctl(directory: Path, nodes: int, flavor: str) -> Run:
    (directory / "opsctl").mkdir()
    path = spec_file(directory / "opsctl", nodes, flavor)
    roles = {n.name: n.role for n in read_spec(path, env()).layout.servers}
    began = time.monotonic()  # what "before steps" holds besides starting apply's own modules: plan of the same spec
    subprocess.run([*OPSCTL, "plan", "-f", str(path)], env=env(), check=False, capture_output=True)
    plan_alone = time.monotonic() - began
    proc: subprocess.Popen[str] | None = None
    try:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        proc = subprocess.Popen([*OPSCTL, "apply", "-f", str(path), "--auto-approve", "--output", "json"], env=env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        opened: dict[int, tuple[str, float]] = {}
        steps: list[tuple[str, float, float]] = []
        said: list[str] = []  # what is not a step event: shown when apply fails
        for line in proc.stderr:  # events, one JSON object a line, timed as they arrive
            now = time.monotonic() - started
            event = json.loads(line) if line.startswith("{") else {}
            if event.get("event") not in ("step-start", "step-done"):
                said.append(line.rstrip())
            if event.get("event") == "step-start":
                kind, *words = event["step"].split()
                role = roles.get(words[0], "") if words else ""
                opened[event["index"]] = (f"{kind}({role})" if role else kind, now)
            elif event.get("event") == "step-done" and event["index"] in opened:
                kind, start = opened.pop(event["index"])
                steps.append((kind, start, now))
        if proc.wait() != 0:
            raise SystemExit("opsctl apply failed:\n" + "\n".join(said[-40:]))
        elapsed = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        loaded = read_spec(path, env())
        if not (check(loaded.layout.servers[0].endpoint) and all_ok([n.endpoint for n in loaded.layout.servers])):
            raise SystemExit("opsctl apply returned before the cluster was complete")
    finally:  # a failed apply's servers too: left running they would load every later run (and whatever
        # destroy leaves, swept() kills); an apply still running (the bench interrupted) is stopped first
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        gone = subprocess.run([*OPSCTL, "destroy", "-f", str(path), "--auto-approve", "--purge"], env=env(),
                              check=False, capture_output=True, text=True)
        if gone.returncode != 0:
            print(f"opsctl destroy failed (exit {gone.returncode}): {gone.stderr.strip()[-400:]}", file=sys.stderr)
    return Run(elapsed, cpu, sorted(steps, key=lambda s: s[1]), plan_alone)


def time_redis_cli(directory: Path, nodes: int, flavor: str, limit: float | None = None) -> tuple[float, float]:
    """Seconds until `redis-cli --cluster check` passes and until every node is ok; (inf, inf) when redis-cli is
    not done within limit seconds (at 240 nodes on 2 cores it may wait for the join for many minutes)."""
    (directory / "rcli").mkdir()
    loaded = read_spec(spec_file(directory / "rcli", nodes, flavor), env())
    spec = loaded.spec
    binary = find_server(spec.server.flavor, parse_version(spec.server.version), None)
    provider = LocalProvider(loaded, directory / "rcli" / "state", binary)
    servers = loaded.layout.servers
    for node in servers:
        provider.write_files(node, render_node(loaded, node, provider.paths(node), reveal=True).files)
    started = time.monotonic()
    try:
        for node in servers:
            provider.start(node)
        endpoints = [n.endpoint for n in servers]
        try:
            subprocess.run(["redis-cli", "--cluster", "create", *endpoints, "--cluster-replicas", "1",
                            "--cluster-yes"], env=env(), check=True, capture_output=True, timeout=limit)
        except subprocess.TimeoutExpired:
            return float("inf"), float("inf")
        while not check(servers[0].endpoint):
            time.sleep(0.01)
        checked = time.monotonic() - started
        while not all_ok(endpoints):
            time.sleep(0.01)
        return checked, time.monotonic() - started
    finally:
        for node in servers:
            provider.stop(node)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[15, 60])
    parser.add_argument("--flavor", nargs="+", default=["valkey", "redis"])
    args = parser.parse_args()
    # As installed: with bytecode. PYTHONDONTWRITEBYTECODE (set on some machines) would otherwise make every
    # opsctl run compile its modules again (~0.2 s of CPU), which no installed copy does.
    compileall.compile_dir(str(ROOT / "opsctl"), quiet=1)
    if not shutil.which("redis-cli"):
        print("redis-cli is needed (apt-get install redis-tools)", file=sys.stderr)
        return 1
    print(f"load {os.getloadavg()[0]:.2f} (1 min). Seconds from launch; floor = one bare server until it "
          "reports ok (up = until it answers); all = every server of the spec started at once, each master "
          "given every slot alone, until every master is ok; opsctl cpu = its user+system seconds.")
    print(f"{'flavor':<8} {'nodes':>5} {'floor':>6} {'(up)':>6} {'all':>6} {'opsctl':>7} {'(cpu)':>6} "
          f"{'rcli check':>10} {'rcli ok':>8} {'opsctl-floor':>12} {'opsctl-all':>10} {'opsctl/rcli ok':>14}  goal")
    runs: list[tuple[str, Run]] = []
    for flavor in args.flavor:
        for nodes in args.nodes:
            with swept("bench-create-") as tmp:
                up, floor = time_floor(tmp, flavor)
                whole = time_floor_cluster(tmp, nodes, flavor)
                ours = time_opsctl(tmp, nodes, flavor)
                checked, usable = time_redis_cli(tmp, nodes, flavor)
            limit = floor + 0.5 if nodes <= 15 else 3.0
            goal = f"<= {limit:.2f} (floor + 0.5)" if nodes <= 15 else "<= 3.00"
            met = ours.wall <= limit
            print(f"{flavor:<8} {nodes:>5} {floor:>6.2f} {up:>6.2f} {whole:>6.2f} {ours.wall:>7.2f} {ours.cpu:>6.2f} "
                  f"{checked:>10.2f} {usable:>8.2f} {ours.wall - floor:>+12.2f} {ours.wall - whole:>+10.2f} "
                  f"{ours.wall / usable:>14.2f}  "
                  f"{goal} {'met' if met else 'NOT met'}", flush=True)
            runs.append((f"{flavor} {nodes}", ours))
    for label, run in runs:  # where the time went, from apply's own step events (they overlap)
        print(f"{label}: " + ", ".join(f"{name} {seconds:.2f}" for name, seconds in run.phases())
              + f" (`opsctl plan` alone: {run.plan_alone:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
