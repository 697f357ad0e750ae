"""bench/cli: how long opsctl takes to start and answer, against the interpreter's own start and redis-cli.

Prints the median wall time of several runs of each command, in one run:
  limit   `python -c pass` with the same interpreter and site-packages (no tool can start faster);
  peer    `redis-cli --version` for --version/--help, `redis-cli --cluster check` for plan/status;
  opsctl  `opsctl --version`, `--help`, and `plan`/`status` of a running 6-node cluster.
Goals: --version/--help <= 100 ms; plan/status of 6 nodes <= 400 ms. plan and status read the spec validated by
an earlier run back from the state folder (opsctl.state.speccache); "plan, spec edited" changes the spec
(a comment line) before each run, so every run validates it in full (PyYAML and pydantic, as the first run
after an edit does).
For a goal not met, one more run under `python -X importtime` splits the time: interpreter start, imports (by
top-level package), and the rest (parse the spec, validate it, talk to the nodes, print).

    .venv/bin/python bench/cli.py [--runs 9] [--flavor valkey] [--instructions]

--instructions adds one run of each under valgrind (callgrind): instructions executed, which a busy machine does
not inflate, beside `python -c pass`'s.
"""

from __future__ import annotations

import argparse
import compileall
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support import PASSWORD, PASSWORD_ENV, make_spec, server_tmpdir, write_spec  # noqa: E402

OPSCTL = [sys.executable, "-m", "opsctl.cli.main"]
GOALS = {"--version": 0.100, "--help": 0.100, "plan": 0.400, "status": 0.400, "plan, spec edited": 0.400}


def env() -> dict[str, str]:
    return {**os.environ, PASSWORD_ENV: PASSWORD, "REDISCLI_AUTH": PASSWORD, "PYTHONPATH": str(ROOT)}


def median_wall(argv: Sequence[str], runs: int, ok: tuple[int, ...] = (0,),
                prepare: Callable[[int], object] = lambda _: None) -> tuple[float, float]:
    """Median wall seconds and median CPU seconds (user + sys) of runs (prepare(i) runs ahead of run i, untimed).
    On a busy machine wall time is mostly waiting for a core; CPU time is what the command itself costs."""
    times, cpu = [], []
    for run in range(runs):
        prepare(run)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run(argv, env=env(), capture_output=True, check=False)
        times.append(time.perf_counter() - started)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if done.returncode not in ok:
            raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode()[-400:]}")
    return statistics.median(times), statistics.median(cpu)


def row(name: str, opsctl: tuple[float, float], peer: tuple[float, float], limit: tuple[float, float]) -> str:
    """One command's line: wall (cpu) of opsctl, its peer and the interpreter's bare start."""
    goal, wall = GOALS[name], opsctl[0]
    return (f"{name:<17} opsctl {wall * 1000:6.0f} ms (cpu {opsctl[1] * 1000:4.0f})  peer {peer[0] * 1000:5.0f} ms "
            f"(cpu {peer[1] * 1000:3.0f})  limit {limit[0] * 1000:4.0f} ms (cpu {limit[1] * 1000:3.0f})  "
            f"opsctl/peer {wall / peer[0]:5.1f}x  opsctl-limit {(wall - limit[0]) * 1000:5.0f} ms  "
            f"goal {goal * 1000:.0f} ms {'met' if wall <= goal else 'NOT met'}")


def import_times(argv: Sequence[str]) -> dict[str, float]:
    """Module -> milliseconds spent in its own import (self time), from one run of argv under -X importtime."""
    done = subprocess.run([sys.executable, "-X", "importtime", *argv[1:]], env=env(), capture_output=True,
                          text=True, check=False)
    times: dict[str, float] = {}
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "imported package" not in line:
            self_us, _, name = (part.strip() for part in line.removeprefix("import time:").split("|"))
            # max: an import in another thread at the same time garbles importtime's nesting (negative self times)
            times[name] = times.get(name, 0.0) + max(0, int(self_us)) / 1000
    return times


def where_time_goes(argv: Sequence[str], wall: float, start: float) -> str:
    """Milliseconds spent importing, by top-level package (opsctl by module), beyond what `python -c pass` imports
    itself, and what the run spends beyond the interpreter's start and those imports. importtime's own
    bookkeeping inflates the import figures a little."""
    interpreter = import_times([sys.executable, "-c", "pass"])
    by_package: dict[str, float] = {}
    for name, ms in import_times(argv).items():
        if name not in interpreter:  # opsctl by package and module, libraries by top-level name
            group = ".".join(name.split(".")[:3]) if name.startswith("opsctl.") else name.split(".")[0]
            by_package[group] = by_package.get(group, 0.0) + ms
    total = sum(by_package.values())
    heaviest = sorted(by_package.items(), key=lambda kv: -kv[1])[:10]
    rest = wall * 1000 - start * 1000 - total
    return (f"    where the time goes: interpreter start {start * 1000:.0f} ms, imports {total:.0f} ms ("
            + ", ".join(f"{name} {ms:.0f}" for name, ms in heaviest)
            + f"), the rest (spec, checks, nodes, output; on a busy machine also the wait for a core) "
            f"~{max(rest, 0):.0f} ms")


def instructions(argv: Sequence[str]) -> int:
    """Instructions argv executes (valgrind's callgrind count, one run): a measure the machine's load leaves alone."""
    done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv], env=env(),
                          capture_output=True, text=True, check=False)
    counted = [line for line in done.stderr.splitlines() if "Collected :" in line]
    return int(counted[-1].rsplit(":", 1)[1]) if counted else 0


def instruction_row(name: str, argv: Sequence[str], limit: int) -> str:
    count = instructions(argv)
    return (f"{name:<10} {count / 1e6:6.0f} M instructions ({count / limit:4.1f}x `python -c pass`)" if count
            else f"{name:<10} (valgrind missing or failed)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--flavor", choices=("valkey", "redis"), default="valkey")
    parser.add_argument("--instructions", action="store_true", help="also count instructions under valgrind")
    args = parser.parse_args()
    # As installed: with bytecode. PYTHONDONTWRITEBYTECODE (set on some machines) would otherwise make every
    # opsctl run compile its modules again (~0.2 s of CPU), which no installed copy does.
    compileall.compile_dir(str(ROOT / "opsctl"), quiet=1)
    limit = median_wall([sys.executable, "-c", "pass"], args.runs)
    peer_start = median_wall(["redis-cli", "--version"], args.runs)
    print(f"load: {os.getloadavg()[0]:.2f} (1 min)  runs: {args.runs}, medians of wall time (and CPU ms)")
    for flag in ("--version", "--help"):
        measured = median_wall([*OPSCTL, flag], args.runs)
        print(row(flag, measured, peer_start, limit))
        if measured[0] > GOALS[flag]:
            print(where_time_goes([*OPSCTL, flag], measured[0], limit[0]))
    with server_tmpdir(prefix="opsctl-bench-cli-") as tmp:
        spec = write_spec(Path(tmp), make_spec("cluster", args.flavor, cluster={"masters": 3,
                                                                                "replicas_per_master": 1}))
        subprocess.run([*OPSCTL, "apply", "-f", str(spec), "--auto-approve"], env=env(), check=True,
                       capture_output=True)
        try:
            status = subprocess.run([*OPSCTL, "status", "-f", str(spec), "--output", "json"], env=env(),
                                    check=True, capture_output=True, text=True).stdout
            endpoint = status.split('"endpoint": "', 1)[1].split('"', 1)[0]
            host, port = endpoint.rsplit(":", 1)
            peer = median_wall(["redis-cli", "--cluster", "check", endpoint], args.runs)
            for command in ("plan", "status"):
                argv = [*OPSCTL, command, "-f", str(spec)]
                measured = median_wall(argv, args.runs)
                print(row(command, measured, peer, limit))
                if measured[0] > GOALS[command]:
                    print(where_time_goes(argv, measured[0], limit[0]))
            text = spec.read_text()
            edited = median_wall([*OPSCTL, "plan", "-f", str(spec)], args.runs,
                                 prepare=lambda run: spec.write_text(f"{text}# edit {run}\n"))
            spec.write_text(text)
            subprocess.run([*OPSCTL, "status", "-f", str(spec)], env=env(), capture_output=True, check=False)  # warm
            print(row("plan, spec edited", edited, peer, limit))
            print(f"  (peer for plan/status: redis-cli --cluster check {host}:{port}, which reads every node)")
            if args.instructions:
                bare = instructions([sys.executable, "-c", "pass"])
                print(f"instructions (one run each; `python -c pass`: {bare / 1e6:.0f} M):")
                for name, argv in (("--version", [*OPSCTL, "--version"]), ("--help", [*OPSCTL, "--help"]),
                                   ("plan", [*OPSCTL, "plan", "-f", str(spec)]),
                                   ("status", [*OPSCTL, "status", "-f", str(spec)])):
                    print(instruction_row(name, argv, bare or 1))
        finally:
            subprocess.run([*OPSCTL, "destroy", "-f", str(spec), "--auto-approve", "--purge"], env=env(),
                           check=False, capture_output=True)


if __name__ == "__main__":
    main()
