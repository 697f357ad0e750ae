"""bench/scale: opsctl at size: one big cluster, a fleet of topologies, the pure planner on 1000 nodes.

cluster (per --nodes, default 60 120): in one run, on the same machine,
  floor   every server of the spec launched at once, each master given every slot alone, until every master is
          ok (bench/create.py's "all": no tool that starts the servers has every master ok sooner);
  rcli    the same servers started by opsctl's provider, `redis-cli --cluster create`, until every node is ok;
  opsctl  `opsctl apply` (create, wall), then `opsctl plan` (must be empty), `opsctl status` (must be healthy)
          and `opsctl destroy --purge`, each a process timed from start to exit.
  Goals: create of 240 within 1.5x the floor; destroy no slower than create.
fleet (--fleet 20 topologies of --fleet-nodes 10, cluster): created at once through the library (fan_out), then
  plan and status of all of them: 20 single `opsctl plan -f SPEC` (status) processes against one process that
  does all 20 through the library (opsctl.apply.plan / opsctl.status.status) one after another and in a fan_out
  (what a fleet command does), and `opsctl plan -f DIR` when the CLI takes a folder (said when it does not).
  Goal: the fleet's plan <= 0.3x the 20 single plans.
planner (--sim-nodes 1000): no server; the facts of a healthy cluster of that many nodes built as
  tests/test_planner.py builds them, each CLUSTER NODES view read back through the observer's parser (as a real
  look makes them), then make_plan of the healthy cluster (nothing to do) and of a fresh one (create), the slot
  arithmetic (slot_plan) and the status judgement (health_line). Goal: plan < 2 s.
Every part prints the machine's load beside its numbers; every server a part starts is killed when it ends, however
it ends (bench/create.py swept()).

    .venv/bin/python bench/scale.py [--nodes 60 120] [--parts cluster fleet planner] [--fleet 20]
"""

from __future__ import annotations

import argparse
import compileall
import gc
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from create import NODE_TIMEOUT_MS, swept, time_floor_cluster, time_redis_cli  # noqa: E402

from opsctl.apply import ApplyOptions, apply  # noqa: E402
from opsctl.destroy import DestroyOptions, destroy  # noqa: E402
from opsctl.net.fanout import fan_out  # noqa: E402
from opsctl.runtime.opening import RuntimeOptions, open_runtime  # noqa: E402
from opsctl.state.specfile import read_spec  # noqa: E402
from tests.support import PASSWORD, PASSWORD_ENV, make_spec, write_spec  # noqa: E402

OPSCTL = [sys.executable, "-m", "opsctl.cli.main"]

# One process, every spec through the library: sys.argv = [-, plan|status, loop|fan, SPEC...]
FLEET_LIBRARY = """
import sys
from opsctl.apply import plan
from opsctl.net.fanout import fan_out
from opsctl.runtime.opening import open_runtime
from opsctl.state.specfile import read_spec
from opsctl.status import status

op, how, paths = sys.argv[1], sys.argv[2], sys.argv[3:]

def one(path):
    with open_runtime(read_spec(path)) as rt:
        return not plan(rt).changes if op == "plan" else status(rt).healthy

results = fan_out(one, paths) if how == "fan" else [one(p) for p in paths]
assert all(results), [p for p, ok in zip(paths, results) if not ok]
"""


def env() -> dict[str, str]:
    return {**os.environ, PASSWORD_ENV: PASSWORD, "REDISCLI_AUTH": PASSWORD, "PYTHONPATH": str(ROOT)}


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f}/{five:.2f} (1/5 min) on {os.cpu_count()} cores"


def timed(argv: Sequence[str], ok: Callable[[subprocess.CompletedProcess[str]], bool] = lambda d: True) -> float:
    """Wall seconds of one process; SystemExit with its output when it fails or ok() says no."""
    started = time.monotonic()
    done = subprocess.run(argv, env=env(), capture_output=True, text=True, check=False)
    elapsed = time.monotonic() - started
    if done.returncode != 0 or not ok(done):
        raise SystemExit(f"{' '.join(argv[2:5])}... exited {done.returncode}:\n{done.stdout[-1500:]}"
                         f"\n{done.stderr[-1500:]}")
    return elapsed


def no_changes(done: subprocess.CompletedProcess[str]) -> bool:
    return not json.loads(done.stdout).get("steps")


def cluster_spec(directory: Path, nodes: int) -> Path:
    directory.mkdir()
    shape = {"masters": nodes // 2, "replicas_per_master": 1, "node_timeout_ms": NODE_TIMEOUT_MS}
    return write_spec(directory, make_spec("cluster", "valkey", cluster=shape))


def bench_cluster(nodes: int, peer_limit: float) -> None:
    with swept("bench-scale-") as tmp:
        floor = time_floor_cluster(tmp, nodes, "valkey")
        _, rcli = time_redis_cli(tmp, nodes, "valkey", peer_limit)
        path = cluster_spec(tmp / "opsctl", nodes)
        spec = ["-f", str(path)]
        created = timed([*OPSCTL, "apply", *spec, "--auto-approve"])
        planned = timed([*OPSCTL, "plan", *spec, "--output", "json"], no_changes)
        looked = timed([*OPSCTL, "status", *spec])
        destroyed = timed([*OPSCTL, "destroy", *spec, "--auto-approve", "--purge"])
    goal = created <= 1.5 * floor if nodes >= 240 else None
    peer = f"{rcli:>6.2f}" if rcli != float("inf") else f">{peer_limit:>5.0f}"  # redis-cli not done within the limit
    print(f"{nodes:>5} {floor:>6.2f} {peer} {created:>7.2f} {created / floor:>8.2f}x {created / rcli:>7.2f}x "
          f"{planned:>6.2f} {looked:>7.2f} {destroyed:>8.2f} {destroyed / created:>8.2f}x  "
          f"create<=1.5x floor: {'-' if goal is None else 'met' if goal else 'NOT met'}; "
          f"destroy<=create: {'met' if destroyed <= created else 'NOT met'}; {load()}", flush=True)


def bench_fleet(count: int, nodes: int) -> None:
    with swept("bench-fleet-") as tmp:
        folder = tmp / "fleet"
        folder.mkdir()
        paths = []
        for i in range(count):
            spec = make_spec("cluster", "valkey", cluster={"masters": nodes // 2, "replicas_per_master": 1})
            spec["name"] = f"f{i:02d}-{spec['name']}"
            # one host name is one machine across a fleet: each topology names its own (tests/test_fleet_live.py)
            spec["hosts"] = [{**host, "name": f"{spec['name']}-{host['name']}"} for host in spec["hosts"]]
            (folder / f"{spec['name']}.yaml").write_text(json.dumps(spec))  # JSON is YAML; a flat folder of specs
            paths.append(folder / f"{spec['name']}.yaml")
        os.environ[PASSWORD_ENV] = PASSWORD
        specs = [read_spec(p) for p in paths]

        def create(loaded: object) -> bool:
            with open_runtime(loaded, RuntimeOptions(locked=True)) as rt:  # type: ignore[arg-type]
                return apply(rt, ApplyOptions(), lambda _: None).healthy

        started = time.monotonic()
        try:
            if not all(fan_out(create, specs)):
                raise SystemExit("fleet: a topology was not healthy after apply")
            made = time.monotonic() - started
            print(f"fleet: {count} clusters of {nodes} nodes created through the library (fan_out) in {made:.1f} s; "
                  f"{load()}", flush=True)
            singles = {op: sum(timed([*OPSCTL, op, "-f", str(p), *(["--output", "json"] if op == "plan" else [])],
                                     no_changes if op == "plan" else lambda d: True) for p in paths)
                       for op in ("plan", "status")}
            library = {(op, how): timed([sys.executable, "-c", FLEET_LIBRARY, op, how, *map(str, paths)])
                       for op in ("plan", "status") for how in ("loop", "fan")}
            probe = subprocess.run([*OPSCTL, "plan", "-f", str(folder)], env=env(), capture_output=True, text=True,
                                   check=False)
            takes_dir = probe.returncode == 0
            cli_dir = {op: timed([*OPSCTL, op, "-f", str(folder)]) for op in ("plan", "status")} if takes_dir else {}
            print(f"{'op':<7} {'20 single':>10} {'lib loop':>9} {'ratio':>6} {'lib fan':>8} {'ratio':>6} "
                  f"{'-f DIR':>7} {'ratio':>6}  goal")
            for op in ("plan", "status"):
                single, loop, fan = singles[op], library[(op, "loop")], library[(op, "fan")]
                best = cli_dir.get(op, fan)
                dir_cell = (f"{cli_dir[op]:>7.2f} {cli_dir[op] / single:>6.2f}" if op in cli_dir
                            else f"{'n/a':>7} {'':>6}")
                goal = f"<= 0.3x: {'met' if best <= 0.3 * single else 'NOT met'}" if op == "plan" else ""
                print(f"{op:<7} {single:>10.2f} {loop:>9.2f} {loop / single:>6.2f} {fan:>8.2f} {fan / single:>6.2f} "
                      f"{dir_cell}  {goal}", flush=True)
            if not takes_dir:
                print("  (`opsctl plan -f DIR` not on this tree yet: the fleet is timed through the library, one "
                      f"process; the CLI said: {probe.stderr.strip().splitlines()[-1][:120] if probe.stderr else ''})")
            print(f"  {load()}")
        finally:
            def gone(loaded: object) -> None:
                with open_runtime(loaded) as rt:  # type: ignore[arg-type]
                    destroy(rt, DestroyOptions(purge=True))
            fan_out(gone, specs)


def as_observed(facts: dict[str, Any]) -> dict[str, Any]:
    """facts with each node's CLUSTER NODES view read back through the observer's parser, as a real look makes
    them: a line every view shows alike is one object (opsctl.observe.replies.parse_cluster_nodes), which the
    planner's n² questions lean on (lines_where); test_planner builds a fresh object per view and line."""
    from dataclasses import replace

    from opsctl.observe.replies import parse_cluster_nodes

    def text(line: Any) -> str:
        slots = " ".join(f"{a}-{b}" if a != b else str(a) for a, b in line.slots)
        return (f"{line.id} {line.address}:{line.port}@{line.bus_port} {','.join(sorted(line.flags))} "
                f"{line.master_id or '-'} 0 0 {line.config_epoch} {line.link_state} {slots}").rstrip()

    return {name: replace(f, cluster_nodes=tuple(parse_cluster_nodes("\n".join(map(text, f.cluster_nodes)))))
            for name, f in facts.items()}


def bench_planner(nodes: int) -> None:
    from dataclasses import replace

    sys.path.insert(0, str(ROOT / "tests"))
    from test_planner import desired, formed_cluster, fresh_facts, loaded_spec

    from opsctl.plan.health import health_line
    from opsctl.plan.planner import make_plan
    from opsctl.slots.slotplan import slot_plan

    loaded = loaded_spec("cluster", cluster={"masters": nodes // 2, "replicas_per_master": 1,
                                              "base_port": 20000, "node_timeout_ms": 2000})
    started = time.perf_counter()
    want = desired(loaded)
    facts = as_observed(formed_cluster(loaded))
    built = time.perf_counter() - started

    def best(fn: Callable[[], object], runs: int = 3) -> tuple[float, float]:
        """The best of runs: (wall, CPU) seconds (on a loaded machine the wall time is mostly waiting for a core)."""
        times = []
        for _ in range(runs):
            gc.collect()  # the builder's million discarded objects are not the planner's to collect
            began, cpu = time.perf_counter(), time.process_time()
            fn()
            times.append((time.perf_counter() - began, time.process_time() - cpu))
        return min(times)

    assert make_plan(loaded, want, facts, "d").empty
    assert health_line(loaded, facts)[0]
    unsettled = dict(facts)
    name = loaded.layout.shards[-1].master
    unsettled[name] = replace(facts[name], info={"cluster_state": "fail"})
    fresh = fresh_facts(loaded)
    rows = [("make_plan, healthy (no-op)", best(lambda: make_plan(loaded, want, facts, "d"))),
            ("make_plan, one node unsettled", best(lambda: make_plan(loaded, want, unsettled, "d"))),
            ("make_plan, fresh (create)", best(lambda: make_plan(loaded, want, fresh, "d"))),
            ("slot arithmetic (slot_plan)", best(lambda: slot_plan(loaded.layout))),
            ("status judgement (health_line)", best(lambda: health_line(loaded, facts)))]
    print(f"planner on recorded facts of a simulated {len(loaded.layout.servers)}-node cluster "
          f"({len(loaded.layout.shards)} masters; facts built in {built:.2f} s; best of 3; {load()}):")
    for label, (seconds, cpu) in rows:
        goal = f"  goal < 2 s: {'met' if seconds < 2 else 'NOT met'}" if label.startswith("make_plan") else ""
        print(f"  {label:<32} {seconds:>7.3f} s (cpu {cpu:.3f} s){goal}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[60, 120])
    parser.add_argument("--parts", nargs="+", choices=["cluster", "fleet", "planner"],
                        default=["cluster", "fleet", "planner"])
    parser.add_argument("--fleet", type=int, default=20)
    parser.add_argument("--fleet-nodes", type=int, default=10)
    parser.add_argument("--sim-nodes", type=int, default=1000)
    parser.add_argument("--peer-limit", type=float, default=300.0,
                        help="seconds redis-cli --cluster create may take before it is stopped (a row then says >N)")
    args = parser.parse_args()
    compileall.compile_dir(str(ROOT / "opsctl"), quiet=1)  # as installed: with bytecode (bench/create.py)
    if "planner" in args.parts:
        bench_planner(args.sim_nodes)
    if "cluster" in args.parts:
        print(f"cluster, seconds ({load()} at the start): floor = every server launched at once until every "
              "master is ok; rcli = redis-cli --cluster create until every node is ok; each opsctl command a "
              "process, start to exit")
        print(f"{'nodes':>5} {'floor':>6} {'rcli':>6} {'create':>7} {'/floor':>9} {'/rcli':>8} {'plan':>6} "
              f"{'status':>7} {'destroy':>8} {'/create':>9}  goals; load")
        for nodes in args.nodes:
            bench_cluster(nodes, args.peer_limit)
    if "fleet" in args.parts:
        bench_fleet(args.fleet, args.fleet_nodes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
